"""Device manager, static policy: PCI devices grouped into named resources,
NUMA hints for a device request, and exclusive device allocation.

Hints follow the kubelet's device manager:
- a resource none of whose devices has a known NUMA node has no NUMA
  preference;
- otherwise a mask is offered when it holds enough *free* devices with a
  known node inside it (devices whose node is unknown never count towards a
  mask), preferred when it has as few nodes as the narrowest mask that holds
  enough devices counting every device, free or not;
- a request the resource cannot meet at all (unknown resource, more devices
  than exist or than are free) gets ``impossible()``; the reason comes from
  ``device_refusal_reason``.

Allocation takes devices on the merged affinity's nodes first, then by NUMA distance
(``allocate_devices``); among devices NUMA leaves equally good, the devices of one
admission sit as close together in the PCI tree as they can, a NIC behind its GPU's
switch or root (``allocate_request_devices``, ``pci_closeness``).

Everything here is pure and iterates sorted tuples only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from numa_agent.admission.errors import DeviceAllocationError
from numa_agent.core.hints import HintSet, NumaMask, count_fits
from numa_agent.core.names import RESOURCE_RULE, is_pci_address, is_resource_name
from numa_agent.core.topology import UNKNOWN_NODE, PciDevice, Topology

# PCI-to-PCI bridges (0x0604) and host bridges (0x0600) are plumbing, never a workload's device.
_BRIDGE_CLASSES = ("0x0604", "0x0600")

Distances = Callable[[int, int], int] | Mapping[int, Mapping[int, int]]


class DeviceConfigError(ValueError):
    """The device resources configuration is invalid for this machine."""


def _hex(value: str) -> str:
    """Normalise a PCI id or class to lower-case 0x-prefixed form."""
    v = value.strip().lower()
    return v if v.startswith("0x") else "0x" + v


_HEX_DIGITS = re.compile(r"0x[0-9a-f]+")


def _checked_hex(value: str, what: str, digits: int, example: str) -> str:
    """_hex(value), refused unless it is at most `digits` hex digits (a name such as
    "nvidia" would otherwise select nothing, silently)."""
    v = _hex(value)
    if not _HEX_DIGITS.fullmatch(v) or len(v) - 2 > digits:
        raise DeviceConfigError(f"{what} {value!r} is not a hexadecimal PCI {what} of at most "
                                f"{digits} digits, e.g. {example}")
    return v


def _is_bridge(device: PciDevice) -> bool:
    return _hex(device.pci_class).startswith(_BRIDGE_CLASSES)


@dataclass(frozen=True, slots=True)
class DeviceSelector:
    """Which PCI devices form a resource. Every criterion given must match;
    ids and classes compare case-insensitively, with or without "0x"."""

    vendor: str | None = None
    device: str | None = None
    class_prefixes: tuple[str, ...] = ()
    driver: str | None = None
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_prefixes", tuple(
            _checked_hex(c, "class", 6, "0x0302") for c in self.class_prefixes))
        object.__setattr__(self, "addresses", tuple(a.strip().lower() for a in self.addresses))
        for address in self.addresses:
            if not is_pci_address(address):
                raise DeviceConfigError(f"address {address!r} is not a PCI address like 0000:3b:00.0")
        if self.vendor is not None:
            object.__setattr__(self, "vendor", _checked_hex(self.vendor, "vendor", 4, "0x10de"))
        if self.device is not None:
            object.__setattr__(self, "device", _checked_hex(self.device, "device", 4, "0x20b0"))

    def is_empty(self) -> bool:
        return (self.vendor is None and self.device is None and not self.class_prefixes
                and self.driver is None and not self.addresses)

    def matches(self, device: PciDevice) -> bool:
        if _is_bridge(device):
            return False
        if self.vendor is not None and _hex(device.vendor) != self.vendor:
            return False
        if self.device is not None and _hex(device.device) != self.device:
            return False
        if self.class_prefixes and not _hex(device.pci_class).startswith(self.class_prefixes):
            return False
        if self.driver is not None and device.driver != self.driver:
            return False
        if self.addresses and device.address.lower() not in self.addresses:
            return False
        return True


@dataclass(frozen=True, slots=True)
class DeviceResource:
    name: str
    selector: DeviceSelector

    def __post_init__(self) -> None:
        if not is_resource_name(self.name):
            raise DeviceConfigError(f"invalid device resource name {self.name!r}: use {RESOURCE_RULE}")
        if self.selector.is_empty():
            raise DeviceConfigError(
                f"device resource {self.name!r} has an empty selector, which would take every "
                "PCI device; give a vendor, device, class prefix, driver or addresses"
            )


@dataclass(frozen=True, slots=True)
class InventoryDevice:
    address: str
    numa_node: int  # UNKNOWN_NODE when the kernel does not tell
    pci_path: tuple[str, ...] = ()  # PciDevice.pci_path: host bridge, then bridges; () unknown


@dataclass(frozen=True)
class DeviceInventory:
    """resource name -> its devices sorted by address, resources sorted by name."""

    resources: tuple[tuple[str, tuple[InventoryDevice, ...]], ...]
    _index: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        resources = tuple(sorted(
            ((name, tuple(sorted(devs, key=lambda d: d.address))) for name, devs in self.resources),
            key=lambda r: r[0],
        ))
        object.__setattr__(self, "resources", resources)
        object.__setattr__(self, "_index", dict(resources))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.resources)

    def has(self, resource: str) -> bool:
        return resource in self._index

    def devices(self, resource: str) -> tuple[InventoryDevice, ...]:
        """The resource's devices ((), if the resource is unknown)."""
        return self._index.get(resource, ())


def resolve_inventory(topo: Topology, resources: Iterable[DeviceResource]) -> DeviceInventory:
    """Match every PCI device against the configured resources. A device that
    two resources both select is a configuration error."""
    resources = tuple(resources)
    seen: set[str] = set()
    for r in sorted(resources, key=lambda r: r.name):
        if r.name in seen:
            raise DeviceConfigError(f"device resource {r.name!r} is configured twice")
        seen.add(r.name)
    owner: dict[str, str] = {}
    members: dict[str, list[InventoryDevice]] = {r.name: [] for r in resources}
    for device in sorted(topo.pci_devices, key=lambda d: d.address):
        for r in sorted(resources, key=lambda r: r.name):
            if not r.selector.matches(device):
                continue
            if device.address in owner:
                raise DeviceConfigError(
                    f"PCI device {device.address} is selected by both {owner[device.address]!r} "
                    f"and {r.name!r}; narrow one of the selectors"
                )
            owner[device.address] = r.name
            node = device.numa_node if device.numa_node >= 0 else UNKNOWN_NODE
            members[r.name].append(InventoryDevice(device.address, node, device.pci_path))
    return DeviceInventory(tuple((name, tuple(devs)) for name, devs in members.items()))


# ------------------------------------------------------------------ hints


def _free(inventory: DeviceInventory, allocated: Mapping[str, frozenset[str]],
          resource: str) -> tuple[InventoryDevice, ...]:
    in_use = allocated.get(resource, frozenset())
    return tuple(d for d in inventory.devices(resource) if d.address not in in_use)


def _per_node(devices: Iterable[InventoryDevice], universe: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for d in devices:
        if d.numa_node >= 0 and universe >> d.numa_node & 1:
            counts[d.numa_node] = counts.get(d.numa_node, 0) + 1
    return counts


def _narrowest_size(counts: Mapping[int, int], count: int) -> int | None:
    """Fewest nodes whose devices add up to `count`: the fullest nodes first."""
    total = 0
    for k, c in enumerate(sorted(counts.values(), reverse=True), start=1):
        total += c
        if total >= count:
            return k
    return None


def device_refusal_reason(
    inventory: DeviceInventory,
    allocated: Mapping[str, frozenset[str]],
    resource: str,
    count: int,
    nodes: NumaMask | Iterable[int] | None = None,
) -> str | None:
    """Why `device_hints` answers ``impossible()`` for this request, or None
    when it does not. `nodes` as for device_hints (None: every node)."""
    return _examined(inventory, allocated, resource, count, None if nodes is None else NumaMask.bits_of(nodes))[0]


def _examined(inventory: DeviceInventory, allocated: Mapping[str, frozenset[str]], resource: str, count: int,
              universe: int | None) -> tuple[str | None, dict[int, int] | None]:
    """(device_refusal_reason, the free devices per node of `universe`): the
    count is what device_hints builds its fits() from, so the free devices are
    looked up once. The count is None when the reason is given or the
    devices have no NUMA node (no preference)."""
    if count <= 0:
        return None, None
    if not inventory.has(resource):
        known = ", ".join(inventory.names) or "none configured"
        return f"unknown device resource {resource!r} (known: {known})", None
    devices = inventory.devices(resource)
    if count > len(devices):
        return f"{resource}: requested {count} devices, the machine has {len(devices)}", None
    free = _free(inventory, allocated, resource)
    if count > len(free):
        return f"{resource}: requested {count} devices, {len(free)} of {len(devices)} are free", None
    if all(d.numa_node < 0 for d in devices):
        return None, None  # no NUMA preference
    if universe is None:
        universe = _all_nodes(devices)
    free_per_node = _per_node(free, universe)
    free_known = sum(free_per_node.values())
    if count > free_known:
        unknown = sum(1 for d in free if d.numa_node < 0)
        return (f"{resource}: requested {count} devices, only {free_known} free devices have a "
                f"NUMA node among {{{NumaMask.from_bits(universe).format()}}} "
                f"({unknown} free devices have no known NUMA node)"), None
    return None, free_per_node


def _all_nodes(devices: Iterable[InventoryDevice]) -> int:
    return NumaMask.bits_of(d.numa_node for d in devices if d.numa_node >= 0)


def device_hints(
    inventory: DeviceInventory,
    allocated: Mapping[str, frozenset[str]],
    resource: str,
    count: int,
    nodes: NumaMask | Iterable[int],
) -> HintSet:
    """The kubelet's device hints for `count` devices of `resource` over the
    NUMA nodes `nodes`. `allocated` maps resource -> addresses in use."""
    if count < 0:
        raise ValueError(f"device count for {resource!r} must be >= 0, got {count}")
    if count == 0:
        return HintSet.no_preference()
    universe = NumaMask.bits_of(nodes)
    reason, free_per_node = _examined(inventory, allocated, resource, count, universe)
    if reason:
        return HintSet.impossible()
    if free_per_node is None:  # no device of the resource has a NUMA node
        return HintSet.no_preference()
    min_size = _narrowest_size(_per_node(inventory.devices(resource), universe), count)
    if min_size is None:
        return HintSet.impossible()
    free_counts = {1 << n: c for n, c in free_per_node.items()}
    fits, fits_alone = count_fits(free_counts, count)

    # More nodes never hold fewer devices: the merge may prune on that.
    return HintSet.generated(NumaMask.from_bits(universe), fits, min_size, monotone=True, fits_alone=fits_alone)


# ------------------------------------------------------------- allocation


def _distance_fn(distances: Distances) -> Callable[[int, int], int]:
    if callable(distances):
        return distances

    def lookup(a: int, b: int) -> int:
        # Missing entries read like Topology.distance: local 10, remote 20.
        return distances.get(a, {}).get(b, 10 if a == b else 20)

    return lookup


def pci_closeness(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How close two devices sit in the PCI tree: the depth of their deepest common
    ancestor, the length of their pci_paths' common prefix. 0: different host bridges,
    or either place unknown; 1: the same host bridge; 2: the same root port; more: the
    same switch (or a bridge below it)."""
    depth = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        depth += 1
    return depth


def _closeness_to(path: tuple[str, ...], anchors: Iterable[tuple[str, ...]]) -> int:
    return max((pci_closeness(path, a) for a in anchors), default=0)


def _free_or_refused(inventory: DeviceInventory, allocated: Mapping[str, frozenset[str]],
                     resource: str, count: int) -> tuple[InventoryDevice, ...]:
    """The resource's free devices; DeviceAllocationError when it is unknown or fewer
    than `count` are free."""
    if not inventory.has(resource):
        known = ", ".join(inventory.names) or "none configured"
        raise DeviceAllocationError(f"unknown device resource {resource!r} (known: {known})")
    free = _free(inventory, allocated, resource)
    if count > len(free):
        listing = ", ".join(
            f"{d.address} on node {d.numa_node if d.numa_node >= 0 else 'unknown'}" for d in free
        ) or "none"
        raise DeviceAllocationError(
            f"{resource}: requested {count} devices, {len(free)} of "
            f"{len(inventory.devices(resource))} are free ({listing})"
        )
    return free


def _numa_rank(affinity: NumaMask | None, distances: Distances) -> Callable[[InventoryDevice], tuple]:
    """The NUMA rule's order of preference as a key (equal keys: equally good by NUMA)."""
    distance = _distance_fn(distances)
    near = affinity.nodes() if affinity else ()

    def rank(d: InventoryDevice) -> tuple:
        if d.numa_node < 0:
            return (2, 0, 0)
        if d.numa_node in near:
            return (0, 0, 0)
        if not near:
            return (1, 0, 0)
        gaps = [distance(d.numa_node, n) for n in near]
        return (1, min(gaps), sum(gaps))

    return rank


def allocate_devices(
    inventory: DeviceInventory,
    allocated: Mapping[str, frozenset[str]],
    resource: str,
    count: int,
    affinity: NumaMask | None,
    distances: Distances,
) -> tuple[str, ...]:
    """Pick `count` free devices of `resource`; returns their addresses, sorted.

    Order of preference: devices on a node of `affinity`; then devices with a known
    node by their NUMA distance to the closest node of `affinity` (then the sum of
    distances to all of it); then devices whose node is unknown. Without affinity,
    known-node devices, then unknown ones. `distances` is a function (a, b) ->
    distance such as ``Topology.distance``, or a mapping node -> node -> distance.
    Among devices the NUMA rule ranks equal, one at a time: the closest in the PCI
    tree to those picked before it (``pci_closeness``), then the lowest address.
    """
    if count < 0:
        raise ValueError(f"device count for {resource!r} must be >= 0, got {count}")
    if count == 0:
        return ()
    free = _free_or_refused(inventory, allocated, resource, count)
    return _pick(free, count, _numa_rank(affinity, distances), (), ())


def _pick(free: tuple[InventoryDevice, ...], count: int, rank: Callable[[InventoryDevice], tuple],
          near: Iterable[tuple[str, ...]], ahead: tuple[tuple[tuple[str, ...], ...], ...]) -> tuple[str, ...]:
    """`count` of `free` (enough of them), one at a time, each the least by: the NUMA
    rank; the closeness in the PCI tree to the devices picked before it (`near`, then
    this pick's own earlier devices); the closeness summed over `ahead`, for each
    resource still to be picked the pci_paths of the devices it will choose among;
    the address. PCI closeness only orders devices of equal NUMA rank: how many come
    from each rank is the NUMA rule's, and a farther device is given when the close
    ones are taken."""
    anchors = [p for p in near if p]
    if not anchors and not any(d.pci_path for d in free):  # nothing to be close to
        chosen = sorted(free, key=lambda d: (rank(d), d.address))[:count]
        return tuple(sorted(d.address for d in chosen))
    left = list(free)
    picked: list[str] = []
    for _ in range(count):
        best = min(left, key=lambda d: (rank(d), -_closeness_to(d.pci_path, anchors),
                                        -sum(_closeness_to(d.pci_path, group) for group in ahead),
                                        d.address))
        left.remove(best)
        picked.append(best.address)
        if best.pci_path:
            anchors.append(best.pci_path)
    return tuple(sorted(picked))


def allocate_request_devices(
    inventory: DeviceInventory,
    allocated: Mapping[str, frozenset[str]],
    counts: Mapping[str, int],
    affinity: NumaMask | None,
    distances: Distances,
) -> tuple[tuple[str, str], ...]:
    """Every device one admission asks for: (resource, address) pairs, sorted.

    The NUMA rule of ``allocate_devices`` decides first, for each resource alone.
    Among devices it ranks equal, the devices of one admission sit as close together
    in the PCI tree as they can (a GPU and the NIC behind the same switch, else the
    same root port, else the same host bridge). The resources are picked in this
    order: the one the NUMA rule leaves the fewest equally good free devices to
    choose from first (one NIC free under one root and GPUs under two: the NIC, and
    a GPU follows it), ties by name. Each device picked prefers the devices closest
    to those picked before it, then those closest to the devices the resources still
    to come will choose among (so a GPU picked first goes where a NIC is free), then
    the lowest address. Never a refusal for PCI distance: a request the free devices
    meet by the NUMA rule is met. A resource that is unknown or has too few free
    devices is refused as ``allocate_devices`` refuses it, checked in name order.
    """
    wanted = sorted((r, c) for r, c in counts.items() if c != 0)
    for resource, count in wanted:
        if count < 0:
            raise ValueError(f"device count for {resource!r} must be >= 0, got {count}")
    rank = _numa_rank(affinity, distances)
    frees = {r: _free_or_refused(inventory, allocated, r, c) for r, c in wanted}
    tops: dict[str, tuple[tuple[str, ...], ...]] = {}
    for resource, free in frees.items():
        best = min(rank(d) for d in free)
        tops[resource] = tuple(d.pci_path for d in free if rank(d) == best)
    order = sorted(wanted, key=lambda rc: (len(tops[rc[0]]), rc[0]))
    paths = {d.address: d.pci_path for free in frees.values() for d in free}
    near: list[tuple[str, ...]] = []
    out: list[tuple[str, str]] = []
    for k, (resource, count) in enumerate(order):
        ahead = tuple(tops[r] for r, _ in order[k + 1:])
        addresses = _pick(frees[resource], count, rank, near, ahead)
        near.extend(paths[a] for a in addresses)
        out.extend((resource, a) for a in addresses)
    return tuple(sorted(out))
