"""Memory manager, static policy: NUMA hints and exclusive allocations for
regular memory and hugepages, with the kubelet's rules.

Resources are ``memory`` and one per hugepage size (``hugepages-2048kB``,
``hugepages-1048576kB``), all counted in bytes.

Groups. An allocation is made on a set of NUMA nodes, its *group* (the mask
the topology manager chose). Every node of the group belongs to it while the
allocation lives, even a node that ended up holding none of its bytes: the
kernel may place the workload's pages on any node of its ``cpuset.mems``, so
the group is what is really shared. Hence the kubelet's rule: a node used by
a group is never also used alone or in another group, and vice versa. A
mask is usable only if every used node in it belongs to a group equal to
the mask.

Nodes without memory (CPU-only nodes) are transparent here: they may appear
in a hint mask, so their CPUs can be aligned with memory on a neighbour, but
they never hold memory and never join a group.

Release. ``MemoryUsage`` is a pure fold of the live allocations:
``usage_from(allocations)`` is the source of truth, and ``usage_with`` /
``usage_without`` are its incremental forms (``usage_without(usage_from(A +
[x]), x) == usage_from(A)``), so releasing is removing the allocation.

Everything here is pure and iterates sorted tuples only.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from itertools import accumulate
from operator import add, ge
from types import MappingProxyType
from typing import Iterable, Mapping

from numa_agent.admission.errors import MemoryAllocationError
from numa_agent.core.hints import HintSet, NumaMask
from numa_agent.core.topology import Topology
from numa_agent.core.units import format_bytes

_nodes_of = NumaMask.nodes_of

MEMORY = "memory"
_HUGEPAGES_PREFIX = "hugepages-"
_BINARY = ((1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki"))


class MemoryConfigError(ValueError):
    """The memory configuration (reserved amounts) does not fit the machine."""


def hugepages_resource(size_kb: int) -> str:
    """Resource name of a hugepage size: 2048 -> "hugepages-2048kB"."""
    return f"{_HUGEPAGES_PREFIX}{int(size_kb)}kB"


def hugepage_size_kb(resource: str) -> int | None:
    """The page size in KiB a hugepage resource name gives ("hugepages-2048kB"
    -> 2048); None for any other resource ("memory")."""
    digits = resource.removeprefix(_HUGEPAGES_PREFIX).removesuffix("kB")
    if len(digits) + len(_HUGEPAGES_PREFIX) + 2 != len(resource) or not digits.isdigit():
        return None
    return int(digits)


@functools.lru_cache(maxsize=64)
def kubelet_resource(resource: str) -> str:
    """The kubelet's name of a memory resource: "memory", or a hugepage size
    as a quantity ("hugepages-2048kB" -> "hugepages-2Mi")."""
    size_kb = hugepage_size_kb(resource)
    if size_kb is None:
        return resource
    size = size_kb << 10
    for unit, suffix in _BINARY:
        if size % unit == 0:
            return f"hugepages-{size // unit}{suffix}"
    return f"hugepages-{size}"


def _fmt_mask(bits: int) -> str:
    return "{" + NumaMask.from_bits(bits).format() + "}"


# ---------------------------------------------------------------- capacity


@dataclass(frozen=True, slots=True)
class ResourceCapacity:
    total: int
    reserved: int = 0

    @property
    def allocatable(self) -> int:
        return self.total - self.reserved


_NO_CAPACITY = ResourceCapacity(0, 0)


@dataclass(frozen=True)
class MemoryCapacity:
    """Per NUMA node, per resource: total and reserved bytes.

    ``entries`` is sorted by (node, resource). Only nodes with memory appear.
    """

    entries: tuple[tuple[int, str, ResourceCapacity], ...]
    _index: dict[tuple[int, str], ResourceCapacity] = field(init=False, repr=False, compare=False, hash=False)
    # Derived once: admission reads them on every request.
    _node_ids: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)
    _memory_nodes: NumaMask = field(init=False, repr=False, compare=False, hash=False)
    # Values derived from the capacity alone (see _pool_shape), keyed by value.
    _derived: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_derived", {})
        entries = tuple(sorted(self.entries, key=lambda e: (e[0], e[1])))
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "_index", {(n, r): c for n, r, c in entries})
        node_ids = tuple(sorted({n for n, _, _ in entries}))
        object.__setattr__(self, "_node_ids", node_ids)
        object.__setattr__(self, "_memory_nodes", NumaMask(node_ids))

    @classmethod
    def from_topology(
        cls, topo: Topology, reserved: Mapping[int, Mapping[str, int]] | None = None
    ) -> "MemoryCapacity":
        """Capacity of every node that has memory and that the agent may use.

        Hugepage totals are ``pages * page size``. The kernel counts the
        hugepage pools inside a node's memory total, so ``memory`` is the
        node's memory minus its hugepage pools (as the kubelet computes it).
        ``reserved`` maps node id -> resource name -> bytes kept back for
        the system.
        """
        usable = set(topo.usable_node_ids)
        table: dict[tuple[int, str], int] = {}
        for node in topo.numa_nodes:
            if node.memory_total_bytes <= 0 or node.id not in usable:
                continue
            pools = 0
            for hp in sorted(node.hugepages, key=lambda h: h.size_kb):
                size = hp.total * hp.size_kb * 1024
                table[(node.id, hugepages_resource(hp.size_kb))] = size
                pools += size
            table[(node.id, MEMORY)] = max(0, node.memory_total_bytes - pools)

        reserved = reserved or {}
        kept: dict[tuple[int, str], int] = {}
        for node_id in sorted(reserved):
            per_resource = reserved[node_id]
            for resource in sorted(per_resource):
                amount = per_resource[resource]
                key = (node_id, resource)
                if not any(n == node_id for n, _ in table):
                    raise MemoryConfigError(
                        f"reserved memory names NUMA node {node_id}, which has no usable memory "
                        f"(nodes with memory: {sorted({n for n, _ in table})})"
                    )
                if key not in table:
                    known = sorted(r for n, r in table if n == node_id)
                    raise MemoryConfigError(
                        f"reserved memory names resource {resource!r} on NUMA node {node_id}, "
                        f"which it does not have (it has: {', '.join(known)})"
                    )
                if not isinstance(amount, int) or amount < 0:
                    raise MemoryConfigError(
                        f"reserved {resource} on NUMA node {node_id} must be a byte count >= 0, "
                        f"got {amount!r}"
                    )
                if amount > table[key]:
                    raise MemoryConfigError(
                        f"reserved {resource} on NUMA node {node_id} is {format_bytes(amount)}, "
                        f"more than its total of {format_bytes(table[key])}"
                    )
                kept[key] = amount
        return cls(tuple(
            (n, r, ResourceCapacity(total, kept.get((n, r), 0)))
            for (n, r), total in table.items()
        ))

    @property
    def node_ids(self) -> tuple[int, ...]:
        return self._node_ids

    @property
    def memory_nodes(self) -> NumaMask:
        return self._memory_nodes

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(sorted({r for _, r, _ in self.entries}))

    def get(self, node: int, resource: str) -> ResourceCapacity:
        return self._index.get((node, resource), _NO_CAPACITY)

    def allocatable(self, node: int, resource: str) -> int:
        return self.get(node, resource).allocatable


# ----------------------------------------------------------------- request


@dataclass(frozen=True)
class MemoryRequest:
    """What a workload asks for: regular memory in bytes and hugepages as
    page size (kB) -> page count. ``hugepages`` may be given as a mapping;
    it is kept as sorted (size_kb, count) pairs without zero counts."""

    memory_bytes: int = 0
    hugepages: Mapping[int, int] | tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.memory_bytes, int) or self.memory_bytes < 0:
            raise ValueError(f"memory_bytes must be an integer >= 0, got {self.memory_bytes!r}")
        # (dict first: the ABC check of Mapping is slow, and requests give dicts)
        pairs = self.hugepages.items() if isinstance(self.hugepages, (dict, Mapping)) else self.hugepages
        norm: dict[int, int] = {}
        for size_kb, count in pairs:
            if not isinstance(size_kb, int) or size_kb <= 0:
                raise ValueError(f"hugepage size must be a positive number of kB, got {size_kb!r}")
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"hugepage count for {size_kb}kB must be an integer >= 0, got {count!r}")
            if size_kb in norm:
                raise ValueError(f"hugepage size {size_kb}kB given twice")
            norm[size_kb] = count
        object.__setattr__(self, "hugepages", tuple(sorted((s, c) for s, c in norm.items() if c)))

    def amounts(self) -> tuple[tuple[str, int], ...]:
        """(resource, bytes) for every resource with a non-zero request, by name."""
        pairs = self.hugepages
        assert isinstance(pairs, tuple), "__post_init__ keeps (size_kb, count) pairs"
        out = [(hugepages_resource(s), s * 1024 * c) for s, c in pairs]
        if self.memory_bytes:
            out.append((MEMORY, self.memory_bytes))
        return tuple(sorted(out))

    def __bool__(self) -> bool:
        return bool(self.memory_bytes or self.hugepages)


# -------------------------------------------------------------- allocation


@dataclass(frozen=True)
class MemoryAllocation:
    """One workload's memory: the group (NUMA nodes it may use) and the bytes
    taken per node per resource (sorted (node, resource, bytes), none zero)."""

    group: NumaMask
    amounts: tuple[tuple[int, str, int], ...] = ()

    def __post_init__(self) -> None:
        amounts = tuple(sorted((int(n), str(r), int(b)) for n, r, b in self.amounts if b))
        for n, r, b in amounts:
            if b < 0:
                raise ValueError(f"allocation of {r} on node {n} is negative ({b})")
            if n not in self.group:
                raise ValueError(f"allocation takes {r} from node {n}, outside its group {self.group.format()!r}")
        object.__setattr__(self, "amounts", amounts)

    def bytes_on(self, node: int, resource: str) -> int:
        return sum(b for n, r, b in self.amounts if n == node and r == resource)

    def total(self, resource: str) -> int:
        return sum(b for _, r, b in self.amounts if r == resource)

    def to_json(self) -> dict:
        return {"group": list(self.group.nodes()),
                "amounts": [{"node": n, "resource": r, "bytes": b} for n, r, b in self.amounts]}

    @classmethod
    def from_json(cls, data: Mapping) -> "MemoryAllocation":
        try:
            return cls(NumaMask(data["group"]),
                       tuple((a["node"], a["resource"], a["bytes"]) for a in data["amounts"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a memory allocation: {data!r} ({exc})") from None


EMPTY_ALLOCATION = MemoryAllocation(NumaMask())


# ------------------------------------------------------------------- usage


class MemoryUsage:
    """The fold of live allocations: bytes allocated per (node, resource), and
    the groups in use with how many allocations hold each. Immutable.

    Kept as indexes; `allocated` and `groups` (sorted tuples, what equality
    compares) are made from them when read, so usage_with / usage_without
    cost what the one allocation changes, not what every allocation holds."""

    __slots__ = ("_allocated", "_groups", "_alloc_index", "_group_count", "_group_of", "_used_bits",
                 "_derived")

    _allocated: tuple[tuple[int, str, int], ...] | None
    _groups: tuple[tuple[NumaMask, int], ...] | None
    _alloc_index: dict[tuple[int, str], int]
    _group_count: dict[int, int]  # group bits -> allocations holding it (never 0)
    _group_of: dict[int, int]  # node -> bits of its group
    _used_bits: int
    # Values derived from this usage and a capacity (see _node_vectors), computed once.
    _derived: dict

    def __init__(self, allocated: Iterable[tuple[int, str, int]] = (),
                 groups: Iterable[tuple[NumaMask, int]] = ()) -> None:
        kept_allocated = tuple(sorted(a for a in allocated if a[2]))
        kept_groups = tuple(sorted((g for g in groups if g[1] and g[0]), key=lambda g: g[0].bits))
        group_of: dict[int, int] = {}
        used = 0
        for mask, _ in kept_groups:
            for n in mask.nodes():
                if n in group_of:
                    raise MemoryAllocationError(
                        f"NUMA node {n} is in two memory groups: {_fmt_mask(group_of[n])} "
                        f"and {_fmt_mask(mask.bits)}"
                    )
                group_of[n] = mask.bits
            used |= mask.bits
        self._set(kept_allocated, kept_groups, {(n, r): b for n, r, b in kept_allocated},
                  {m.bits: c for m, c in kept_groups}, group_of, used)

    def _set(self, allocated: tuple[tuple[int, str, int], ...] | None,
             groups: tuple[tuple[NumaMask, int], ...] | None, alloc_index: dict[tuple[int, str], int],
             group_count: dict[int, int], group_of: dict[int, int], used_bits: int) -> None:
        for name, value in (("_allocated", allocated), ("_groups", groups), ("_alloc_index", alloc_index),
                            ("_group_count", group_count), ("_group_of", group_of),
                            ("_used_bits", used_bits), ("_derived", {})):
            object.__setattr__(self, name, value)

    @classmethod
    def _of_indexes(cls, alloc_index: dict[tuple[int, str], int], group_count: dict[int, int],
                    group_of: dict[int, int], used_bits: int) -> "MemoryUsage":
        """A usage from indexes already checked (no zero amounts or counts, one
        group per node); they are the new value's own and must not change."""
        usage = object.__new__(cls)
        usage._set(None, None, alloc_index, group_count, group_of, used_bits)
        return usage

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"MemoryUsage is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"MemoryUsage is immutable: cannot delete {name}")

    @property
    def allocated(self) -> tuple[tuple[int, str, int], ...]:
        if self._allocated is None:
            object.__setattr__(self, "_allocated", tuple(sorted((n, r, b) for (n, r), b in self._alloc_index.items())))
        assert self._allocated is not None
        return self._allocated

    @property
    def groups(self) -> tuple[tuple[NumaMask, int], ...]:
        if self._groups is None:
            object.__setattr__(self, "_groups", tuple((NumaMask.from_bits(m), c)
                                                      for m, c in sorted(self._group_count.items())))
        assert self._groups is not None
        return self._groups

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryUsage):
            return NotImplemented
        return self._alloc_index == other._alloc_index and self._group_count == other._group_count

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._alloc_index.items())), tuple(sorted(self._group_count.items()))))

    def __reduce__(self) -> tuple[type, tuple]:
        return (MemoryUsage, (self.allocated, self.groups))

    def __repr__(self) -> str:
        return f"MemoryUsage(allocated={self.allocated!r}, groups={self.groups!r})"

    def allocated_bytes(self, node: int, resource: str) -> int:
        return self._alloc_index.get((node, resource), 0)

    @property
    def allocated_index(self) -> Mapping[tuple[int, str], int]:
        """(node, resource) -> bytes allocated, read-only."""
        return MappingProxyType(self._alloc_index)

    @property
    def group_bits(self) -> Mapping[int, int]:
        """Node -> bitmask of the group that uses it (used nodes only), read-only."""
        return MappingProxyType(self._group_of)

    def group_of(self, node: int) -> NumaMask | None:
        bits = self._group_of.get(node)
        return None if bits is None else NumaMask.from_bits(bits)

    @property
    def used_nodes(self) -> NumaMask:
        return NumaMask.from_bits(self._used_bits)

    @property
    def multi_node_groups(self) -> tuple[NumaMask, ...]:
        return tuple(m for m, _ in self.groups if m.count() > 1)


def usage_with(usage: MemoryUsage, allocation: MemoryAllocation) -> MemoryUsage:
    """`usage` plus one more allocation. Raises MemoryAllocationError if the
    allocation's group overlaps a different group in use."""
    return _with(usage, allocation.group, allocation.amounts)


def usage_with_booked(usage: MemoryUsage, nodes: Iterable[int], per_node: Mapping[int, Mapping[str, int]]
                      ) -> MemoryUsage:
    """``usage_with`` of an allocation in the form bookings keep it (see
    ``usage_from_booked``), without building and sorting a MemoryAllocation:
    admission folds the new booking into the kept usage on every update."""
    return _with(usage, *_checked(nodes, per_node))


def usage_without_booked(usage: MemoryUsage, nodes: Iterable[int], per_node: Mapping[int, Mapping[str, int]]
                         ) -> MemoryUsage:
    """``usage_without`` of an allocation in the form bookings keep it."""
    return _without(usage, *_checked(nodes, per_node))


def _with(usage: MemoryUsage, group: NumaMask, amounts: Iterable[tuple[int, str, int]]) -> MemoryUsage:
    bits = group.bits
    if not bits:
        return usage
    group_of = usage._group_of
    nodes = group.nodes()
    for n in nodes:
        held = group_of.get(n)
        if held is not None and held != bits:
            raise MemoryAllocationError(
                f"memory group {{{group.format()}}} overlaps group "
                f"{_fmt_mask(held)} in use on NUMA node {n}"
            )
    allocated = dict(usage._alloc_index)
    for n, r, b in amounts:
        if b:
            allocated[(n, r)] = allocated.get((n, r), 0) + b
    counts = dict(usage._group_count)
    held_before = counts.get(bits, 0)
    counts[bits] = held_before + 1
    if not held_before:
        group_of = dict(group_of)
        for n in nodes:
            group_of[n] = bits
    new = MemoryUsage._of_indexes(allocated, counts, group_of, usage._used_bits | bits)
    _carry_node_vectors(usage, new, amounts)
    return new


def usage_without(usage: MemoryUsage, allocation: MemoryAllocation) -> MemoryUsage:
    """`usage` with one allocation released. Raises MemoryAllocationError if
    the allocation is not part of it."""
    return _without(usage, allocation.group, allocation.amounts)


def _without(usage: MemoryUsage, group: NumaMask, amounts: Iterable[tuple[int, str, int]]) -> MemoryUsage:
    bits = group.bits
    if not bits:
        return usage
    counts = dict(usage._group_count)
    if bits not in counts:
        raise MemoryAllocationError(
            f"cannot release memory on group {{{group.format()}}}: no allocation uses it"
        )
    allocated = dict(usage._alloc_index)
    for n, r, b in amounts:
        have = allocated.get((n, r), 0)
        if have < b:
            raise MemoryAllocationError(
                f"cannot release {format_bytes(b)} of {r} on NUMA node {n}: only "
                f"{format_bytes(have)} are allocated"
            )
        if have == b:
            allocated.pop((n, r), None)
        else:
            allocated[(n, r)] = have - b
    group_of, used = usage._group_of, usage._used_bits
    if counts[bits] == 1:
        del counts[bits]
        group_of = {n: g for n, g in group_of.items() if g != bits}
        used &= ~bits
    else:
        counts[bits] -= 1
    new = MemoryUsage._of_indexes(allocated, counts, group_of, used)
    _carry_node_vectors(usage, new, amounts)
    return new


def _carry_node_vectors(usage: MemoryUsage, new: MemoryUsage, amounts: Iterable[tuple[int, str, int]]) -> None:
    """Hand the node vectors kept on `usage` on to `new`, which differs from
    it only in `amounts`: the nodes they name are marked stale, to be made
    again from `new` (or a usage derived from it) only if its vectors for
    those resources are read (see _node_vectors). An update costs no
    vector for the resources it is never asked about."""
    kept = usage._derived
    if not kept:
        return
    changed = 0
    for n, _, _ in amounts:
        changed |= 1 << n
    carried = new._derived
    for key, entry in kept.items():
        if not isinstance(key, tuple):
            continue  # not node vectors (shortfalls): computed afresh when asked
        capacity, vectors, stale = entry
        carried[key] = (capacity, vectors, stale | changed)


def _refreshed(usage: MemoryUsage, resources: tuple[str, ...],
               vectors: tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]], stale: int
               ) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """`vectors` with the free vector of every `stale` node (bits) made
    again from `usage`; the other nodes' are shared."""
    free, allocatable = vectors
    free = dict(free)
    allocated = usage._alloc_index.get
    while stale:
        low = stale & -stale
        stale ^= low
        n = low.bit_length() - 1
        alloc = allocatable.get(n)
        if alloc is not None:
            free[n] = tuple([max(0, a - allocated((n, r), 0)) for a, r in zip(alloc, resources, strict=True)])
    return free, allocatable


def usage_from(allocations: Iterable[MemoryAllocation]) -> MemoryUsage:
    """The usage of a set of live allocations (order does not matter): the
    same as folding usage_with over them, in one pass."""
    return _fold((a.group, a.amounts) for a in allocations)


def usage_from_booked(booked: Iterable[tuple[Iterable[int], Mapping[int, Mapping[str, int]]]]) -> MemoryUsage:
    """``usage_from`` over allocations in the form bookings keep them:
    (group nodes, node -> resource -> bytes), without building a
    MemoryAllocation for each (admission folds every booking of a state).
    Invalid amounts raise as ``MemoryAllocation`` does."""
    return _fold(_checked(nodes, per_node) for nodes, per_node in booked)


def _checked(nodes: Iterable[int], per_node: Mapping[int, Mapping[str, int]]
             ) -> tuple[NumaMask, list[tuple[int, str, int]]]:
    """One booked allocation as (group, non-zero amounts); invalid amounts
    raise as ``MemoryAllocation`` does."""
    group = NumaMask(nodes)
    bits = group.bits
    amounts = [(n, r, b) for n, per in per_node.items() for r, b in per.items() if b]
    for n, _, b in amounts:
        if b < 0 or n < 0 or not bits >> n & 1:
            MemoryAllocation(group, tuple(amounts))  # raises, naming the amount
    return group, amounts


def _fold(allocations: Iterable[tuple[NumaMask, Iterable[tuple[int, str, int]]]]) -> MemoryUsage:
    allocated: dict[tuple[int, str], int] = {}
    groups: dict[int, int] = {}
    group_of: dict[int, int] = {}
    for group, amounts in allocations:
        bits = group.bits
        if not bits:
            continue
        for n in group.nodes():
            held = group_of.setdefault(n, bits)
            if held != bits:
                raise MemoryAllocationError(
                    f"memory group {{{group.format()}}} overlaps group "
                    f"{_fmt_mask(held)} in use on NUMA node {n}"
                )
        for n, r, b in amounts:
            allocated[(n, r)] = allocated.get((n, r), 0) + b
        groups[bits] = groups.get(bits, 0) + 1
    return MemoryUsage(
        tuple((n, r, b) for (n, r), b in allocated.items()),
        tuple((NumaMask.from_bits(m), c) for m, c in groups.items()),
    )


def free_bytes(capacity: MemoryCapacity, usage: MemoryUsage, node: int, resource: str) -> int:
    """Allocatable minus allocated, never below 0 (capacity may shrink under
    live allocations, e.g. after a hugepage pool is resized)."""
    return max(0, capacity.allocatable(node, resource) - usage.allocated_bytes(node, resource))


def shortfalls(capacity: MemoryCapacity, usage: MemoryUsage) -> tuple[tuple[int, str, int, int], ...]:
    """(node, resource, booked, allocatable) wherever more is booked than the
    node can hold now: its memory shrank under live bookings (memory offlined
    or unplugged, a balloon, a hugepage pool resized). Bookings are never cut
    to fit (the kernel does not take pages back from a running workload), so
    such a node is reported and takes no new admission until it fits again.
    Computed once per usage value and capacity (every admission asks), kept
    on the usage."""
    kept = usage._derived.get(_SHORTFALLS)
    if kept is not None and kept[0] is capacity:
        return kept[1]
    cap_of = capacity._index.get
    over = [(n, r, b, cap.allocatable) for (n, r), b in usage._alloc_index.items()
            if b > (cap := cap_of((n, r), _NO_CAPACITY)).total - cap.reserved]
    found = tuple(sorted(over))
    usage._derived[_SHORTFALLS] = (capacity, found)
    return found


_SHORTFALLS = "shortfalls"  # its key in MemoryUsage._derived (node vectors use tuples)


# ------------------------------------------------------- kernel's counters


@dataclass(frozen=True)
class KernelHugepages:
    """What the kernel's hugepage counters said when one request was about to
    be decided, read at the edge for the nodes and page sizes it asks for.

    ``free``: (node, page size kB, pages) from the node's ``free_hugepages``.
    ``reserved``: (page size kB, pages) from ``resv_hugepages``: pages a
    mapping has reserved but not yet faulted in. The kernel keeps them for
    the whole machine only, so they are counted against every node.
    ``in_use``: (node, page size kB, bytes) of the agent's own bookings known
    to be faulted in (their hugetlb cgroup's counts); None when nothing is
    known (the affinity fallback). A booked page it does not name counts as
    not yet used (see ``kernel_available``). A (node, size) that ``free`` does not name is not
    limited: its figure was not read."""

    free: tuple[tuple[int, int, int], ...] = ()
    reserved: tuple[tuple[int, int], ...] = ()
    in_use: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "free", tuple(sorted(self.free)))
        object.__setattr__(self, "reserved", tuple(sorted(self.reserved)))
        if self.in_use is not None:
            object.__setattr__(self, "in_use", tuple(sorted(self.in_use)))


def kernel_available(figures: KernelHugepages, usage: MemoryUsage) -> dict[tuple[int, str], int]:
    """(node, hugepage resource) -> bytes a new booking can count on by the
    kernel's counters: free pages less reserved ones, less the pages live
    bookings hold there and have not yet used (the kernel still counts them
    free). A booked page ``in_use`` does not name counts as unused: never
    more than is really there is offered, at the price of counting such a
    page twice once it is faulted in (gone from free, and held back). The
    admission offers the smaller of this and its own free bytes."""
    reserved = dict(figures.reserved)
    in_use = {(n, s): b for n, s, b in figures.in_use or ()}
    allocated = usage._alloc_index.get
    out: dict[tuple[int, str], int] = {}
    for node, size_kb, pages in figures.free:
        resource = hugepages_resource(size_kb)
        booked = allocated((node, resource), 0)
        unused = max(0, booked - in_use.get((node, size_kb), 0))
        out[(node, resource)] = max(0, (pages - reserved.get(size_kb, 0)) * size_kb * 1024 - unused)
    return out


@dataclass(frozen=True)
class HugepagesShort:
    """A node whose free hugepages of one size fall short of what a booking
    would take there: the kubelet-style figures a refusal states."""

    node: int
    size_kb: int
    free_pages: int
    requested_pages: int

    @property
    def missing_pages(self) -> int:
        return self.requested_pages - self.free_pages

    def text(self) -> str:
        """"node 1: 2 free 2 MiB hugepages, 4 requested; 2 more needed"."""
        return (f"node {self.node}: {self.free_pages} free {format_bytes(self.size_kb << 10)} hugepages, "
                f"{self.requested_pages} requested; {self.missing_pages} more needed")


def hugepages_short(figures: KernelHugepages, usage: MemoryUsage,
                    amounts: Iterable[tuple[int, str, int]]) -> tuple[HugepagesShort, ...]:
    """Where `amounts` ((node, resource, bytes), a booking's memory) takes more
    hugepages than the kernel's counters leave (see ``kernel_available``)."""
    available = kernel_available(figures, usage)
    out = []
    for node, resource, wanted in sorted(amounts):
        size_kb = hugepage_size_kb(resource)
        have = available.get((node, resource))
        if size_kb is None or have is None or wanted <= have:
            continue
        page = size_kb * 1024
        out.append(HugepagesShort(node, size_kb, have // page, -(-wanted // page)))
    return tuple(out)


# ------------------------------------------------------------ mask search


class _SearchBudgetExceeded(Exception):
    pass


def _descending(value: int) -> int:
    return -value


class _PoolShape:
    """What a _Pool's search reads that depends on its nodes' vectors alone,
    not on the need: built once per set of vectors (see _pool_shape)."""

    __slots__ = ("nodes", "width", "best", "same_below", "uniform")

    def __init__(self, nodes: tuple[tuple[int, tuple[int, ...]], ...], width: int) -> None:
        self.nodes = tuple(sorted(nodes))  # ascending node id
        self.width = width
        # best[j][c]: prefix sums of component c's values among nodes[:j], largest first;
        # bounds how much r nodes taken from nodes[:j] can contribute.
        # Built prefix by prefix: each component's values kept sorted, largest
        # first, as nodes join, so no prefix is sorted from scratch.
        self.best = [[[0] for _ in range(width)]]
        ordered: list[list[int]] = [[] for _ in range(width)]
        for _, vec in self.nodes:
            for c in range(width):
                bisect.insort(ordered[c], vec[c], key=_descending)
            self.best.append([[0, *accumulate(ordered[c])] for c in range(width)])
        # same_below[i]: indices below i whose vector equals node i's.
        self.same_below: list[int] = []
        below: dict[tuple[int, ...], int] = {}
        for i, (_, vec) in enumerate(self.nodes):
            bits = below.get(vec, 0)
            self.same_below.append(bits)
            below[vec] = bits | 1 << i
        self.uniform = len(below) <= 1  # every node alike


# Pool shapes kept per capacity: one per node set and resources asked together.
_SHAPES_KEPT = 64


def _pool_shape(capacity: MemoryCapacity, mem_bits: int, resources: tuple[str, ...]) -> _PoolShape:
    """The pool of allocatable vectors of the memory nodes `mem_bits` for
    `resources`: it depends on the capacity alone, so it is kept on it."""
    kept = capacity._derived
    key = ("pool", mem_bits, resources)
    shape = kept.get(key)
    if shape is None:
        if len(kept) >= _SHAPES_KEPT:
            kept.clear()
        cap_of = capacity._index.get
        vectors = tuple((n, tuple([cap_of((n, r), _NO_CAPACITY).allocatable for r in resources]))
                        for n in _nodes_of(mem_bits))
        shape = kept[key] = _PoolShape(vectors, len(resources))
    return shape


class _Pool:
    """Nodes with one vector of amounts each (one amount per requested
    resource), and a search for the numerically lowest k-node subset whose
    summed vectors reach a need. Used both for "could ever hold" (allocatable
    vectors) and for "can hold now" (free vectors).

    With one resource the per-component bound is exact and the search never
    backtracks. With several it is a covering problem; nodes with identical
    vectors are interchangeable (the lowest ids of a class always win), which
    keeps regular machines fast, and a step budget bounds pathological
    cases: past it callers fall back to a greedy cover, so they may settle
    for a wider mask (and a wider preferred size), never for one that does
    not fit.
    """

    STEP_BUDGET = 20_000  # shared by every search on one pool

    def __init__(self, shape: _PoolShape) -> None:
        self.nodes = shape.nodes
        self.width = shape.width
        self._best = shape.best
        self._same_below = shape.same_below
        self._uniform = shape.uniform
        self.budget_exceeded = False
        self._steps_left = self.STEP_BUDGET

    def _may_reach(self, j: int, r: int, need: tuple[int, ...]) -> bool:
        if r > j:
            return False
        best = self._best[j]
        return all(n <= 0 or best[c][r] >= n for c, n in enumerate(need))

    def lowest(self, need: tuple[int, ...], k: int) -> int | None:
        """Bits of the numerically lowest set of exactly k pool nodes whose
        sums reach `need` in every component, or None. Once the pool's step
        budget has run out (`budget_exceeded`), only k == all nodes is
        answered; smaller sizes read as not found."""
        if not self._may_reach(len(self.nodes), k, need):
            return None
        if k == len(self.nodes):
            # Every node, no search: the fallback that always completes.
            totals = [sum(v[c] for _, v in self.nodes) for c in range(self.width)]
            if all(t >= n for t, n in zip(totals, need, strict=True)):
                return NumaMask(n for n, _ in self.nodes).bits
            return None
        if self.budget_exceeded:
            return None

        def taken_bits(taken: int) -> int:
            # `taken` holds indices into self.nodes, not node ids.
            return NumaMask.bits_of(self.nodes[i][0] for i in NumaMask.nodes_of(taken))

        # Decide nodes from the highest id down, leaving each out whenever the
        # rest can still succeed: that yields the numerically lowest mask.
        # `taken` holds indices below j already included (class members forced
        # in with a higher twin); `r` counts the nodes still to choose.
        def search(j: int, r: int, need: tuple[int, ...], taken: int) -> int | None:
            self._steps_left -= 1
            if self._steps_left < 0:
                raise _SearchBudgetExceeded
            if r == 0:
                return taken_bits(taken) if all(n <= 0 for n in need) else None
            if r > j - taken.bit_count() or not self._may_reach(j, r, need):
                return None
            idx = j - 1
            node, vec = self.nodes[idx]
            if taken >> idx & 1:
                found = search(idx, r, need, taken & ~(1 << idx))
                return None if found is None else found | (1 << node)
            found = search(idx, r, need, taken)
            if found is not None:
                return found
            # Including this node includes its lower twins too: swapping a twin
            # for a lower one would give a lower mask.
            twins = self._same_below[idx] & ~taken
            size = twins.bit_count() + 1
            if size > r:
                return None
            found = search(idx, r - size, tuple(n - size * v for n, v in zip(need, vec, strict=True)), taken | twins)
            return None if found is None else found | (1 << node)

        try:
            return search(len(self.nodes), k, need, 0)
        except _SearchBudgetExceeded:
            self.budget_exceeded = True
            return None

    def greedy(self, need: tuple[int, ...]) -> int | None:
        """A covering set built greedily (the node covering the largest share
        of what is still needed, lowest id on ties): the fallback once the
        exact search is out of budget. None if even every node falls short
        (it stops only when no node left adds to what is still needed)."""
        remaining = list(need)
        left = list(self.nodes)
        bits = 0
        def share(vec: tuple[int, ...], remaining: list[int]) -> float:
            return sum(min(v, r) / n for v, r, n in zip(vec, remaining, need, strict=True) if r > 0)

        while any(n > 0 for n in remaining):
            if not left:
                return None
            shares = {node: share(vec, remaining) for node, vec in left}
            best = max(left, key=lambda item: (shares[item[0]], -item[0]))
            if shares[best[0]] == 0:
                return None
            left.remove(best)
            bits |= 1 << best[0]
            remaining = [r - v for r, v in zip(remaining, best[1], strict=True)]
        return bits

    def _at_least(self, need: tuple[int, ...]) -> int | None:
        """The fewest nodes whose largest values could reach `need` in every
        component taken apart (None: not even all of them): no fewer can."""
        best = self._best[len(self.nodes)]
        k = 0
        for c, n in enumerate(need):
            if n <= 0:
                continue
            sums = best[c]  # ascending: values are never negative
            i = bisect.bisect_left(sums, n)
            if i == len(sums):
                return None
            k = max(k, i)
        return k

    def fewest(self, need: tuple[int, ...]) -> int | None:
        """Smallest k for which some k nodes reach `need` (0 if need is met by
        nothing); past the step budget, the greedy cover's size."""
        if all(n <= 0 for n in need):
            return 0
        start = self._at_least(need)
        if start is None:
            return None
        if self.width == 1 or self._uniform:
            # Exact bound: one resource, or nodes that are all alike.
            return start
        for k in range(start, len(self.nodes) + 1):
            if self.lowest(need, k) is not None:
                return k
            if self.budget_exceeded:
                cover = self.greedy(need)
                return None if cover is None else cover.bit_count()
        return None


# Node vectors kept per usage: one entry per set of resources asked together.
_VECTORS_KEPT = 16


def _node_vectors(capacity: MemoryCapacity, usage: MemoryUsage, resources: tuple[str, ...]
                  ) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """(free, allocatable): per memory node of `capacity`, its free and
    allocatable bytes of each of `resources`. Computed once per usage value
    and capacity (the hints and the allocation of one admission read the
    same), and kept on the usage, which is immutable."""
    kept = usage._derived
    entry = kept.get(resources)
    if entry is not None and entry[0] is capacity:
        if not entry[2]:
            return entry[1]
        # Handed on by updates (_carry_node_vectors): the nodes they changed, made again.
        vectors = _refreshed(usage, resources, entry[1], entry[2])
    else:
        vectors = _build_node_vectors(capacity, usage, resources)
        if len(kept) >= _VECTORS_KEPT:
            kept.clear()
    kept[resources] = (capacity, vectors, 0)
    return vectors


def _build_node_vectors(capacity: MemoryCapacity, usage: MemoryUsage, resources: tuple[str, ...]
                        ) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    # free_bytes() and ResourceCapacity.allocatable, read straight from the indexes.
    cap_of, allocated = capacity._index.get, usage._alloc_index.get
    free: dict[int, tuple[int, ...]] = {}
    allocatable: dict[int, tuple[int, ...]] = {}
    if len(resources) == 1:
        (r,) = resources
        for n in capacity.node_ids:
            a = cap_of((n, r), _NO_CAPACITY).allocatable
            allocatable[n] = (a,)
            free[n] = (max(0, a - allocated((n, r), 0)),)
        return free, allocatable
    for n in capacity.node_ids:
        alloc = tuple([cap_of((n, r), _NO_CAPACITY).allocatable for r in resources])
        allocatable[n] = alloc
        free[n] = tuple([max(0, a - allocated((n, r), 0)) for a, r in zip(alloc, resources, strict=True)])
    return free, allocatable


class _State:
    """Per-node vectors for one request, restricted to a node universe. The
    vectors cover every memory node (see _node_vectors); only those of the
    universe (`mem_bits`) are read."""

    def __init__(self, capacity: MemoryCapacity, usage: MemoryUsage, request: MemoryRequest,
                 universe_bits: int, kernel: KernelHugepages | None = None) -> None:
        self.capacity = capacity
        self.amounts = request.amounts()
        self.resources = resources = tuple(r for r, _ in self.amounts)
        self.need = tuple(b for _, b in self.amounts)
        self.universe = universe_bits
        self.mem_bits = mem_bits = capacity.memory_nodes.bits & universe_bits
        # Every memory node in reach: a refusal may then speak of the whole machine.
        self.whole = mem_bits == capacity.memory_nodes.bits
        self.free, self.allocatable = _node_vectors(capacity, usage, resources)
        if kernel is not None:
            self.free = _within_kernel(self.free, resources, kernel_available(kernel, usage))
        self.used_bits = usage._used_bits & mem_bits
        group_of = usage._group_of
        # Every used node in reach (the usual universe: every memory node):
        # the usage's own index (read only here) serves, filtered by nothing.
        if usage._used_bits & ~mem_bits:
            group_of = {n: g for n, g in group_of.items() if mem_bits >> n & 1}
        self.group_of = group_of
        self.width = len(resources)

    def group_ok(self, bits: int) -> bool:
        """Every used memory node in the mask belongs to a group equal to the
        mask's memory nodes."""
        eff = bits & self.mem_bits
        used = eff & self.used_bits
        if not used:
            return True
        return self.group_of[(used & -used).bit_length() - 1] == eff

    def free_covers(self, bits: int) -> bool:
        free = self.free
        if self.width == 1:  # the common case, without the vector arithmetic
            need, total = self.need[0], 0
            for n in _nodes_of(bits & self.mem_bits):
                total += free[n][0]
            return total >= need
        totals = [0] * self.width
        for n in _nodes_of(bits & self.mem_bits):
            totals = list(map(add, totals, free[n]))  # summed in C, as fits_alone compares
        return all(map(ge, totals, self.need))

    def fits(self, mask: NumaMask) -> bool:
        bits = mask.bits
        return bits & ~self.universe == 0 and self.group_ok(bits) and self.free_covers(bits)

    def fits_alone(self) -> int:
        """The universe's nodes whose one-node mask fits (see fits()), as bits."""
        out, need, free, bits = 0, self.need, self.free, self.mem_bits
        for n, group in self.group_of.items():
            if group != 1 << n:
                bits &= ~(1 << n)  # in a wider group: never used alone
        if self.width == 1:  # the common case, without the vector comparison
            need_one = need[0]
            for n in _nodes_of(bits):
                if free[n][0] >= need_one:
                    out |= 1 << n
            return out
        for n in _nodes_of(bits):
            if all(map(ge, free[n], need)):  # compared in C: every vector has the request's width
                out |= 1 << n
        return out

    def contains_fit(self, mask: NumaMask) -> bool:
        """Whether some fitting mask over the universe contains `mask`.

        A fitting mask that holds a used memory node has exactly that node's
        group as its memory nodes; one without used memory nodes can take
        every unused memory node, and more free memory never hurts. So two
        candidates decide it, without enumerating supersets."""
        bits = mask.bits
        if bits & ~self.universe:
            return False
        memoryless = self.universe & ~self.mem_bits
        used = bits & self.used_bits
        if used:
            group = self.group_of[(used & -used).bit_length() - 1]
            return bits & self.mem_bits & ~group == 0 and self.free_covers(group)
        if self.fits(NumaMask.from_bits(bits | memoryless | (self.mem_bits & ~self.used_bits))):
            return True
        # Only memoryless nodes asked for: an existing group may take them along.
        return bits & self.mem_bits == 0 and any(self.free_covers(g) for g in set(self.group_of.values()))

    def min_size(self) -> int | None:
        """Fewest nodes whose allocatable could ever hold the request (groups and
        current usage ignored), as the kubelet computes its preferred size."""
        return _Pool(_pool_shape(self.capacity, self.mem_bits, self.resources)).fewest(self.need)

    def narrowest_fit(self, required_bits: int = 0) -> int | None:
        """The narrowest mask (fewest nodes, then lowest bits) over the universe
        that contains `required_bits` and fits now, or None."""
        candidates: list[int] = []
        extra = required_bits & ~self.mem_bits  # memoryless nodes asked for: carried along
        req_mem = required_bits & self.mem_bits
        # Masks that reuse a group already in use.
        for group in sorted(set(self.group_of.values())):
            if req_mem & ~group == 0 and self.free_covers(group):
                candidates.append(group | extra)
        # Masks made only of unused memory nodes.
        if req_mem & self.used_bits == 0:
            base = list(self.need)
            for n in NumaMask.nodes_of(req_mem):
                base = [b - v for b, v in zip(base, self.free[n], strict=True)]
            unused = self.mem_bits & ~self.used_bits & ~req_mem
            pool = _Pool(_PoolShape(tuple((n, self.free[n]) for n in NumaMask.nodes_of(unused)), self.width))
            limit = min((c.bit_count() for c in candidates), default=None)
            for k in range(0, len(pool.nodes) + 1):
                if limit is not None and k + required_bits.bit_count() > limit:
                    break
                found = pool.lowest(tuple(base), k)
                if found is None and pool.budget_exceeded:
                    # Out of search budget: take the greedy cover (None: nothing covers).
                    found = pool.greedy(tuple(base))
                    if found is None:
                        break
                if found is not None:
                    if found | required_bits:
                        candidates.append(found | required_bits)
                    break
        if not candidates:
            return None
        return min(candidates, key=lambda b: (b.bit_count(), b))


def _within_kernel(free: dict[int, tuple[int, ...]], resources: tuple[str, ...],
                   available: Mapping[tuple[int, str], int]) -> dict[int, tuple[int, ...]]:
    """`free` with each (node, resource) the kernel's counters name cut to what
    they leave (a copy: the vectors kept on the usage are shared)."""
    limited = dict(free)
    for n, vector in free.items():
        cut = tuple([min(v, available.get((n, r), v)) for v, r in zip(vector, resources, strict=True)])
        if cut != vector:
            limited[n] = cut
    return limited


_STATE = "state"  # its key in MemoryUsage._derived: the last _State built on that usage


def _state_of(capacity: MemoryCapacity, usage: MemoryUsage, request: MemoryRequest,
              universe_bits: int, kernel: KernelHugepages | None = None) -> "_State":
    """The _State of these inputs, kept on the usage as its node vectors are: an
    admission's hints and its allocation read the same usage and request over
    the same universe (the common case), so the allocation takes the state the
    hints built. Matched by identity: the inputs are immutable and held here."""
    kept = usage._derived.get(_STATE)
    if (kept is not None and kept[0] is capacity and kept[1] is request and kept[2] == universe_bits
            and kept[3] is kernel):
        return kept[4]
    state = _State(capacity, usage, request, universe_bits, kernel)
    usage._derived[_STATE] = (capacity, request, universe_bits, kernel, state)
    return state


def _universe(nodes: NumaMask | Iterable[int] | None, capacity: MemoryCapacity) -> int:
    return capacity.memory_nodes.bits if nodes is None else NumaMask.bits_of(nodes)


# ------------------------------------------------------------------ hints


def memory_hints(
    capacity: MemoryCapacity,
    usage: MemoryUsage,
    request: MemoryRequest,
    nodes: NumaMask | Iterable[int],
    kernel: KernelHugepages | None = None,
) -> dict[str, HintSet]:
    """The kubelet's memory hints: resource -> HintSet for every requested
    resource (resources requested at 0 are absent).

    A mask over `nodes` fits when its group rule holds and its free bytes
    cover every requested resource; a hint is preferred when the mask has as
    few nodes as the fewest nodes whose allocatable could ever hold the whole
    request. The same masks are offered for every resource, as the kubelet
    does. When no mask could ever hold the request every resource gets
    ``impossible()`` (see ``memory_refusal_reason``). ``kernel`` (the
    kernel's hugepage counters) cuts the free bytes of the hugepages it names
    (see ``kernel_available``), so masks on nodes whose pages were taken
    outside the agent do not fit and the hints steer to nodes that have
    them; the preferred size still follows the allocatable, as the kubelet's."""
    state = _state_of(capacity, usage, request, NumaMask.bits_of(nodes), kernel)
    if not state.resources:
        return {}
    min_size = state.min_size()
    if min_size is None:
        return {r: HintSet.impossible() for r in state.resources}
    nodes_mask = NumaMask.from_bits(state.universe)
    fits = state.fits
    contains_fit, fits_alone = state.contains_fit, state.fits_alone
    return {r: HintSet.generated(nodes_mask, fits, min_size, contains_fit=contains_fit, fits_alone=fits_alone)
            for r in state.resources}


def nodes_have(amounts: Mapping[int, int] | Iterable[tuple[int, int]], what: str = "free") -> str:
    """"node 0 has 6.5 GiB free, node 1 has 2 GiB free": bytes per node, for people."""
    pairs = amounts.items() if isinstance(amounts, Mapping) else amounts
    return ", ".join(f"node {n} has {format_bytes(b)} {what}" for n, b in sorted(pairs)) or "no memory nodes"


def _column(table: Mapping[int, tuple[int, ...]], state: _State, resource: str) -> list[tuple[int, int]]:
    c = state.resources.index(resource)
    return [(n, table[n][c]) for n in _nodes_of(state.mem_bits)]


def _refusal(state: _State, required_bits: int = 0) -> str:
    for resource, need in zip(state.resources, state.need, strict=True):
        allocatable = _column(state.allocatable, state, resource)
        if sum(v for _, v in allocatable) < need:
            held_by = "the machine" if state.whole else "the nodes it may use"
            return (f"{resource}: requested {format_bytes(need)}, more than {held_by} can ever hold "
                    f"({nodes_have(allocatable, 'allocatable')}); "
                    f"{nodes_have(_column(state.free, state, resource))}")
    for resource, need in zip(state.resources, state.need, strict=True):
        free = _column(state.free, state, resource)
        if sum(v for _, v in free) < need:
            return f"{resource}: requested {format_bytes(need)}, {nodes_have(free)}"
    detail = "; ".join(f"{r}: requested {format_bytes(b)}, {nodes_have(_column(state.free, state, r))}"
                       for r, b in zip(state.resources, state.need, strict=True))
    groups = sorted(set(state.group_of.values()))
    where = f" containing {_fmt_mask(required_bits)}" if required_bits else ""
    return (f"no NUMA node set{where} can hold the request under the group rule "
            f"(groups in use: {', '.join(_fmt_mask(g) for g in groups) or 'none'}); {detail}")


def memory_refusal_reason(
    capacity: MemoryCapacity,
    usage: MemoryUsage,
    request: MemoryRequest,
    nodes: NumaMask | Iterable[int] | None = None,
) -> str | None:
    """Why no NUMA mask over `nodes` (default: every memory node) can hold the
    request now, or None when one can."""
    state = _State(capacity, usage, request, _universe(nodes, capacity))
    if not state.resources or state.narrowest_fit() is not None:
        return None
    return _refusal(state)


def narrowest_fit(
    capacity: MemoryCapacity,
    usage: MemoryUsage,
    request: MemoryRequest,
    nodes: NumaMask | Iterable[int],
) -> NumaMask | None:
    """The narrowest mask over `nodes` that can hold the request now (fewest
    nodes, then lowest ids), or None."""
    bits = _State(capacity, usage, request, NumaMask.bits_of(nodes)).narrowest_fit()
    return None if bits is None else NumaMask.from_bits(bits)


# ------------------------------------------------------------- allocation


def allocate_memory(
    capacity: MemoryCapacity,
    usage: MemoryUsage,
    request: MemoryRequest,
    affinity: NumaMask | None,
    *,
    nodes: NumaMask | Iterable[int] | None = None,
    require_preferred: bool = False,
    kernel: KernelHugepages | None = None,
) -> MemoryAllocation:
    """Take the request's bytes, filling the group's nodes lowest id first.

    - affinity given and it fits (group rule and free bytes): the group is
      the affinity's memory nodes.
    - affinity given but it cannot hold the request (best-effort admitted a
      non-preferred hint, or the merge narrowed a multi-node hint): extend it
      like the kubelet, to the narrowest fitting mask that contains it (a
      node in a group extends to that group).
    - no affinity (policy none, or no preference): the narrowest fitting mask.

    With ``require_preferred`` (the topology manager's hint was preferred)
    an extension to a non-preferred size is refused, as the kubelet does.
    ``nodes`` (default: every memory node) bounds where the request may go
    beyond the affinity's own nodes: the nodes it may use without naming them.
    ``kernel``: the kernel's hugepage counters, as ``memory_hints`` reads them.
    Raises MemoryAllocationError naming the resource, requested bytes and
    free bytes per node.
    """
    state = _state_of(capacity, usage, request, _universe(nodes, capacity) | (affinity.bits if affinity else 0),
                      kernel)
    if not state.resources:
        return EMPTY_ALLOCATION
    aff_bits = affinity.bits if affinity is not None else 0
    chosen: int | None
    if aff_bits and state.group_ok(aff_bits) and state.free_covers(aff_bits):
        chosen = aff_bits
    else:
        chosen = state.narrowest_fit(aff_bits)
        if chosen is None:
            head = (f"cannot extend NUMA affinity {_fmt_mask(aff_bits)} to hold the memory request"
                    if aff_bits else "no NUMA node set can hold the memory request")
            raise MemoryAllocationError(f"{head}: {_refusal(state, aff_bits)}")
        if aff_bits and require_preferred:
            preferred_size = state.min_size()
            if chosen.bit_count() != preferred_size:
                raise MemoryAllocationError(
                    f"NUMA affinity {_fmt_mask(aff_bits)} cannot hold the memory request and the "
                    f"narrowest mask containing it, {_fmt_mask(chosen)}, has {chosen.bit_count()} "
                    f"nodes where a preferred one has {preferred_size}"
                )
    group = chosen & state.mem_bits
    amounts = []
    for c, (resource, need) in enumerate(zip(state.resources, state.need, strict=True)):
        remaining = need
        for n in NumaMask.nodes_of(group):
            if not remaining:
                break
            take = min(remaining, state.free[n][c])
            if take:
                amounts.append((n, resource, take))
                remaining -= take
        assert remaining == 0, "the chosen mask was checked to cover the request"
    return MemoryAllocation(NumaMask.from_bits(group), tuple(amounts))
