"""Machine: the topology plus the configured policies, precomputed once.

Everything the admission functions need that depends only on the hardware
and the configuration (not on what is booked) lives here, built by one pure
function so a hotplug event or a restart rebuilds it the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

from numa_agent.admission.cpu_manager import CpuManagerOptions, reserved_cpus
from numa_agent.admission.cpu_topology import CpuTopology
from numa_agent.admission.device_manager import DeviceInventory, DeviceResource, DeviceSelector, resolve_inventory
from numa_agent.admission.memory_manager import MemoryCapacity, hugepages_resource
from numa_agent.admission.topology_manager import Closeness, TopologyManagerOptions, missing_distance
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.core.policy import POLICY_NAMES, SCOPE_NAMES
from numa_agent.core.topology import Topology

TOPOLOGY_POLICIES = POLICY_NAMES
TOPOLOGY_SCOPES = SCOPE_NAMES
DEFAULT_MAX_NUMA_NODES = 64
# [memory_manager] memory_only_nodes: "explicit" keeps memory-only nodes (GPU memory,
# CXL) out of every booking that does not name them; "ordinary" treats them as any
# other node, as the kubelet does.
MEMORY_ONLY_MODES = ("explicit", "ordinary")
# prefer-closest-numa-nodes is on by default (the kubelet's is off) on machines of up to
# this many NUMA nodes, the kubelet's own limit: there it costs nothing, while on larger
# ones sorting every equally wide mask by distance can outgrow the merge's budget.
# docs/architecture.md, "Defaults that differ from the kubelet's".
CLOSEST_BY_DEFAULT_UP_TO = 8


class MachineConfigError(ValueError):
    """The policies cannot work on this machine (too many NUMA nodes, reserved
    CPUs it does not have, a device selector matching nothing...); the message
    names the configuration key."""


@dataclass(frozen=True)
class PolicyConfig:
    topology_policy: str = "best-effort"
    topology_scope: str = "container"
    topology_options: Mapping[str, str] = field(default_factory=dict)
    cpu_policy: str = "static"  # "static" | "none"
    cpu_options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: str | None = None  # explicit list; wins over the count
    reserved_cpu_count: int = 1  # like the kubelet's static policy: keep >= 1 for the system
    memory_policy: str = "static"  # "static" | "none"
    memory_only_nodes: str = "explicit"  # one of MEMORY_ONLY_MODES
    # node id -> resource ("memory", "hugepages-2048kB") -> bytes
    reserved_memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    # resource name -> selector fields (vendor, device, class_prefixes, driver, addresses)
    devices: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """Identifies the policies bookings were made under. Device resources
        and reserved amounts are not part of it: they can change across a
        restart without making existing bookings wrong."""
        doc = {"topology_policy": self.topology_policy, "topology_scope": self.topology_scope,
               "cpu_policy": self.cpu_policy, "memory_policy": self.memory_policy,
               "cpu_options": dict(sorted(self.cpu_options.items()))}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {"topology": self.topology_policy, "scope": self.topology_scope,
                "cpu": self.cpu_policy, "memory": self.memory_policy,
                "memory_only_nodes": self.memory_only_nodes,
                "cpu_options": dict(self.cpu_options),
                "topology_options": dict(self.topology_options)}


@dataclass(frozen=True)
class Machine:
    topology: Topology
    policy: PolicyConfig
    cpu_topology: CpuTopology
    cpu_options: CpuManagerOptions
    tm_options: TopologyManagerOptions
    reserved_cpus: CpuSet
    usable_cpus: CpuSet
    memory: MemoryCapacity
    devices: DeviceInventory
    node_ids: tuple[int, ...]  # usable NUMA nodes
    distances: Mapping[int, Mapping[int, int]]
    # Memory-only nodes (Topology.memory_only_node_ids with usable memory) that only a
    # request naming them may use: none under memory_only_nodes = "ordinary".
    explicit_nodes: tuple[int, ...] = ()

    @cached_property
    def ordinary_node_ids(self) -> tuple[int, ...]:
        """The usable nodes a request may use without naming them."""
        held = set(self.explicit_nodes)
        return tuple(n for n in self.node_ids if n not in held)

    def node_of_cpu(self, cpu: int) -> int:
        return self.topology.cpu(cpu).numa_node

    def nodes_of(self, cpus: CpuSet) -> tuple[int, ...]:
        """The NUMA nodes of these CPUs, ascending (UNKNOWN_NODE first, for a
        CPU in no node). Raises KeyError for a CPU the topology does not have."""
        bits = cpus.bits
        known, by_node = self._cpus_by_node
        if bits & ~known:  # not the machine's: let the lookup name it
            return tuple(sorted({self.node_of_cpu(c) for c in cpus}))
        return tuple(n for n, node_bits in by_node if bits & node_bits)

    @cached_property
    def _cpus_by_node(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(bits of every CPU of the topology, (node, bits of its CPUs) by node id)."""
        out: dict[int, int] = {}
        for cpu in self.topology.cpus:
            out[cpu.numa_node] = out.get(cpu.numa_node, 0) | 1 << cpu.id
        known = 0
        for node_bits in out.values():
            known |= node_bits
        return known, tuple(sorted(out.items()))

    @cached_property
    def usable_cpu_bits_by_node(self) -> Mapping[int, int]:
        """NUMA node -> bitmask of its usable CPUs (nodes with none are absent)."""
        out: dict[int, int] = {}
        for cpu in self.usable_cpus:
            node = self.topology.cpu(cpu).numa_node
            out[node] = out.get(node, 0) | 1 << cpu
        return out

    @cached_property
    def node_mask(self) -> NumaMask:
        """node_ids as a mask, made once (per-request code passes it on)."""
        return NumaMask(self.node_ids)

    @cached_property
    def ordinary_node_mask(self) -> NumaMask:
        """ordinary_node_ids as a mask, made once."""
        return NumaMask(self.ordinary_node_ids)

    @cached_property
    def closeness(self) -> Closeness | None:
        """The distance order every merge on this machine uses under
        prefer-closest-numa-nodes (None without it, or without distances
        between every usable node): built once, its answers kept."""
        if not self.tm_options.prefer_closest_numa_nodes or missing_distance(self.distances, self.node_ids):
            return None
        return Closeness(self.distances, self.node_mask.bits)

    @cached_property
    def siblings_and_l3(self) -> dict[int, tuple[int, int | None]]:
        """CPU id -> (bits of its core's CPUs, its L3 id): what an alignment
        report reads per booked CPU, made once."""
        return {c.id: (c.siblings.bits, c.l3) for c in self.topology.cpus}

    @cached_property
    def hugepage_sizes_kb(self) -> frozenset[int]:
        """The page sizes (kB) of the usable nodes' hugepage pools: what a
        request's hugepages are checked against, made once."""
        return frozenset(hp.size_kb for n in self.node_ids for hp in self.topology.node(n).hugepages)

    def hugepage_pools(self, sizes_kb: Iterable[int]) -> tuple[tuple[int, int], ...]:
        """(node, page size kB) of each usable node with memory that has a pool
        of one of `sizes_kb`: the kernel counters an admission asking for those
        sizes reads (none for a request without hugepages)."""
        wanted = set(sizes_kb)
        if not wanted:
            return ()
        memory = self.memory
        return tuple((n, size) for size in sorted(wanted) for n in memory.node_ids
                     if memory.get(n, hugepages_resource(size)).total)

    @cached_property
    def free_layout(self) -> tuple[tuple[int, str, int, int, tuple[tuple[str, str, int], ...]], ...]:
        """What a report of the free resources reads of the machine, per usable
        node: (node, its key, its usable CPUs' bits, its allocatable regular
        memory, (page size key in kB, resource, allocatable) per hugepage pool
        that has pages). Made once; only the usage changes between reports."""
        out = []
        by_node, memory = self.usable_cpu_bits_by_node, self.memory
        for n in self.node_ids:
            pools = tuple((str(hp.size_kb), resource, memory.allocatable(n, resource))
                          for hp in self.topology.node(n).hugepages if hp.total
                          for resource in (hugepages_resource(hp.size_kb),))
            out.append((n, str(n), by_node.get(n, 0), memory.allocatable(n, "memory"), pools))
        return tuple(out)

    def cpus_of_nodes(self, nodes) -> CpuSet:
        """Usable CPUs of these NUMA nodes."""
        bits = 0
        by_node = self.usable_cpu_bits_by_node
        for n in nodes:
            bits |= by_node.get(n, 0)
        return CpuSet.from_bits(bits)


def build_machine(topology: Topology, policy: PolicyConfig) -> Machine:
    """Validate the policy against the machine and precompute. Raises MachineConfigError."""
    _check_policy_names(policy)
    usable = topology.usable_cpus
    if not usable:
        raise MachineConfigError("no usable CPU: every online CPU is outside the agent's cpuset, in no NUMA node "
                                 "or on a node whose memory the cpuset does not allow")
    cpu_topology = CpuTopology.from_topology(topology)
    try:
        cpu_options = CpuManagerOptions.from_mapping(policy.cpu_options)
        cpu_options.validate(cpu_topology, policy.topology_policy)
    except ValueError as exc:
        raise MachineConfigError(f"cpu_manager.options: {exc}") from None
    node_ids = tuple(n for n in topology.usable_node_ids)
    distances = {n.id: dict(n.distances) for n in topology.numa_nodes}
    try:
        tm_options = TopologyManagerOptions.from_mapping(
            {**_topology_defaults(node_ids, distances), **policy.topology_options})
    except ValueError as exc:
        raise MachineConfigError(f"topology_manager.options: {exc}") from None
    if tm_options.prefer_closest_numa_nodes and (missing := missing_distance(distances, node_ids)):
        raise MachineConfigError(f"topology_manager.options: {missing}")
    max_nodes = tm_options.max_allowable_numa_nodes
    if policy.topology_policy != "none" and len(node_ids) > max_nodes:
        raise MachineConfigError(
            f"topology_manager.options.max-allowable-numa-nodes: this machine has {len(node_ids)} "
            f"NUMA nodes, more than the allowed {max_nodes}; raise the option")

    reserved = _reserved_cpus(cpu_topology, policy, usable)
    try:
        memory = MemoryCapacity.from_topology(topology, policy.reserved_memory)
    except ValueError as exc:
        raise MachineConfigError(f"memory_manager.reserved_memory: {exc}") from None
    devices = _device_inventory(topology, policy)
    explicit = () if policy.memory_only_nodes == "ordinary" else tuple(
        n for n in topology.memory_only_node_ids if n in memory.memory_nodes)
    return Machine(topology=topology, policy=policy, cpu_topology=cpu_topology,
                   cpu_options=cpu_options, tm_options=tm_options, reserved_cpus=reserved,
                   usable_cpus=usable, memory=memory, devices=devices, node_ids=node_ids,
                   distances=distances, explicit_nodes=explicit)


def _topology_defaults(node_ids: tuple[int, ...], distances: Mapping[int, Mapping[int, int]]) -> dict[str, Any]:
    """This product's topology manager options where the configuration is silent."""
    # The kubelet stops at 8 nodes because its merge is exponential; ours is not, so
    # the default allows the largest machines we know of.
    defaults: dict[str, Any] = {"max-allowable-numa-nodes": DEFAULT_MAX_NUMA_NODES}
    if len(node_ids) <= CLOSEST_BY_DEFAULT_UP_TO and missing_distance(distances, node_ids) is None:
        defaults["prefer-closest-numa-nodes"] = True
    return defaults


def _check_policy_names(policy: PolicyConfig) -> None:
    if policy.topology_policy not in TOPOLOGY_POLICIES:
        raise MachineConfigError(f"topology_manager.policy: {policy.topology_policy!r} is not one of "
                          f"{', '.join(TOPOLOGY_POLICIES)}")
    if policy.topology_scope not in TOPOLOGY_SCOPES:
        raise MachineConfigError(f"topology_manager.scope: {policy.topology_scope!r} is not one of "
                          f"{', '.join(TOPOLOGY_SCOPES)}")
    if policy.cpu_policy not in ("static", "none"):
        raise MachineConfigError(f"cpu_manager.policy: {policy.cpu_policy!r} is not 'static' or 'none'")
    if policy.memory_policy not in ("static", "none"):
        raise MachineConfigError(f"memory_manager.policy: {policy.memory_policy!r} is not 'static' or 'none'")
    if policy.memory_only_nodes not in MEMORY_ONLY_MODES:
        raise MachineConfigError(f"memory_manager.memory_only_nodes: {policy.memory_only_nodes!r} is not one of "
                                 f"{', '.join(MEMORY_ONLY_MODES)}")


def _reserved_cpus(cpu_topology: CpuTopology, policy: PolicyConfig, usable: CpuSet) -> CpuSet:
    explicit = None
    if policy.reserved_cpus:
        try:
            explicit = CpuSet.parse(policy.reserved_cpus)
        except ValueError as exc:
            raise MachineConfigError(f"cpu_manager.reserved_cpus: {exc}") from None
        outside = explicit - usable
        if outside:
            raise MachineConfigError(f"cpu_manager.reserved_cpus: CPUs {outside.format()} are not usable "
                              f"on this machine (usable: {usable.format()})")
    if policy.reserved_cpu_count < 0 or policy.reserved_cpu_count > len(usable):
        raise MachineConfigError(f"cpu_manager.reserved_cpu_count: {policy.reserved_cpu_count} is not "
                          f"between 0 and {len(usable)} usable CPUs")
    try:
        return reserved_cpus(cpu_topology, explicit, policy.reserved_cpu_count, usable)
    except ValueError as exc:
        raise MachineConfigError(f"cpu_manager.reserved_cpus: {exc}") from None


def _device_inventory(topology: Topology, policy: PolicyConfig) -> DeviceInventory:
    resources = []
    for name, sel in sorted(policy.devices.items()):
        try:
            resources.append(DeviceResource(name, device_selector(sel)))
        except (ValueError, TypeError) as exc:
            raise MachineConfigError(f"devices.{name}: {exc}") from None
    try:
        return resolve_inventory(topology, resources)
    except ValueError as exc:
        raise MachineConfigError(f"devices: {exc}") from None


_SELECTOR_KEYS = ("vendor", "device", "class_prefixes", "driver", "addresses")


def device_selector(fields: Mapping[str, Any]) -> DeviceSelector:
    """A [devices.<resource>] table as a selector; ValueError naming what is wrong."""
    unknown = sorted(set(fields) - set(_SELECTOR_KEYS))
    if unknown:
        raise ValueError(f"unknown selector key(s) {', '.join(unknown)} (known: {', '.join(_SELECTOR_KEYS)})")
    kwargs: dict[str, Any] = {}
    for key in ("vendor", "device", "driver"):
        if key in fields:
            if not isinstance(fields[key], str):
                raise ValueError(f"{key} must be a string")
            kwargs[key] = fields[key]
    for key in ("class_prefixes", "addresses"):
        if key in fields:
            value = fields[key]
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{key} must be a list of strings")
            kwargs[key] = tuple(value)
    return DeviceSelector(**kwargs)
