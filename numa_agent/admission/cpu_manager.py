"""The CPU manager's static policy, pure: options, reserved CPUs, NUMA hints
and exclusive allocation, with the kubelet's semantics.

The caller owns the state (which CPUs are free); every function here takes
the free set as a value and returns a new value.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from numa_agent.admission.cpu_take import (
    CpuAllocationError,
    take_by_topology,
    take_by_topology_distributed,
)
from numa_agent.admission.cpu_topology import CpuTopology
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask

__all__ = [
    "CpuAllocationError",
    "CpuManagerOptions",
    "CpuPolicyConfigError",
    "SMTAlignmentError",
    "allocate_cpus",
    "cpu_hints",
    "reserved_cpus",
]

EMPTY = CpuSet()


class CpuPolicyConfigError(ValueError):
    """CPU manager options that are unknown, malformed or incompatible."""


class SMTAlignmentError(CpuAllocationError):
    """full-pcpus-only: the request cannot be served with whole physical cores."""

    def __init__(self, requested: int, cpus_per_core: int, available_physical: int | None = None) -> None:
        self.requested = requested
        self.cpus_per_core = cpus_per_core
        self.available_physical = available_physical
        if available_physical is None:
            text = (f"SMTAlignmentError: requested {requested} cpus is not a multiple of "
                    f"cpus per core = {cpus_per_core}")
        else:
            text = (f"SMTAlignmentError: not enough free physical cpus: available physical "
                    f"cpus = {available_physical}, requested cpus = {requested}, "
                    f"cpus per core = {cpus_per_core}")
        super().__init__(text)


# option name -> field name
_OPTION_FIELDS = {
    "full-pcpus-only": "full_pcpus_only",
    "distribute-cpus-across-numa": "distribute_cpus_across_numa",
    "align-by-socket": "align_by_socket",
    "distribute-cpus-across-cores": "distribute_cpus_across_cores",
    "strict-cpu-reservation": "strict_cpu_reservation",
    "prefer-align-cpus-by-uncorecache": "prefer_align_cpus_by_uncorecache",
}
_FIELD_OPTIONS = {v: k for k, v in _OPTION_FIELDS.items()}

# Pairs the kubelet refuses to combine, in the order it checks them.
_INCOMPATIBLE = (
    ("full_pcpus_only", "distribute_cpus_across_cores"),
    ("distribute_cpus_across_numa", "distribute_cpus_across_cores"),
    ("prefer_align_cpus_by_uncorecache", "distribute_cpus_across_cores"),
    ("prefer_align_cpus_by_uncorecache", "distribute_cpus_across_numa"),
)

# Go's strconv.ParseBool spellings, which is what the kubelet accepts.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise CpuPolicyConfigError(f"bad value for CPU manager option {name!r}: {value!r} (want true or false)")


@dataclass(frozen=True, slots=True)
class CpuManagerOptions:
    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    prefer_align_cpus_by_uncorecache: bool = False

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, object] | None) -> "CpuManagerOptions":
        """From the kubelet's option names ({"full-pcpus-only": "true", ...});
        unknown names, non-boolean values and incompatible pairs are refused."""
        values: dict[str, bool] = {}
        for name in sorted(mapping or {}):
            field = _OPTION_FIELDS.get(name)
            if field is None:
                known = ", ".join(sorted(_OPTION_FIELDS))
                raise CpuPolicyConfigError(f"unknown CPU manager option {name!r} (known: {known})")
            values[field] = _parse_bool(name, mapping[name])
        options = cls(**values)
        options.check_combinations()
        return options

    def to_mapping(self) -> dict[str, str]:
        return {_FIELD_OPTIONS[f.name]: "true" for f in fields(self) if getattr(self, f.name)}

    def check_combinations(self) -> None:
        for a, b in _INCOMPATIBLE:
            if getattr(self, a) and getattr(self, b):
                raise CpuPolicyConfigError(
                    f"CPU manager options {_FIELD_OPTIONS[a]} and {_FIELD_OPTIONS[b]} "
                    "cannot be used at the same time"
                )

    def validate(self, topo: CpuTopology, topology_policy: str | None = None) -> None:
        """Refuse combinations the kubelet refuses, on this machine and under
        this topology manager policy (when given)."""
        self.check_combinations()
        if self.align_by_socket:
            if topology_policy == "single-numa-node":
                raise CpuPolicyConfigError(
                    "CPU manager option align-by-socket cannot be used with the topology "
                    "manager policy single-numa-node"
                )
            if topo.num_sockets > topo.num_numa_nodes:
                raise CpuPolicyConfigError(
                    "CPU manager option align-by-socket needs sockets at least as large as NUMA "
                    f"nodes; this machine has {topo.num_sockets} sockets and "
                    f"{topo.num_numa_nodes} NUMA nodes"
                )


def reserved_cpus(topo: CpuTopology, explicit: CpuSet | None, count: int) -> CpuSet:
    """The CPUs kept for the system: the explicit list when given, otherwise
    `count` CPUs taken whole physical cores first, lowest ids first."""
    if count < 0:
        raise CpuPolicyConfigError(f"reserved CPU count must be >= 0, got {count}")
    if explicit is not None:
        unknown = explicit - topo.all_cpus
        if unknown:
            raise CpuPolicyConfigError(f"reserved CPUs {unknown.format()} are not usable CPUs of this machine")
        if count and count != len(explicit):
            raise CpuPolicyConfigError(
                f"reserved CPU list {explicit.format()} holds {len(explicit)} CPUs, "
                f"but {count} are to be reserved"
            )
        return explicit
    if count > len(topo.all_cpus):
        raise CpuPolicyConfigError(
            f"cannot reserve {count} CPUs: the machine has {len(topo.all_cpus)} usable CPUs"
        )
    return take_by_topology(topo, topo.all_cpus, count)


def cpu_hints(
    topo: CpuTopology,
    available: CpuSet,
    request: int,
    options: CpuManagerOptions | None = None,
    reusable: CpuSet = EMPTY,
    already_allocated: CpuSet | None = None,
) -> HintSet:
    """The NUMA masks on which `request` exclusive CPUs fit.

    A mask fits when its nodes hold at least `request` CPUs of
    available+reusable and every reusable CPU (handed back by an init
    container) lies inside it. Preferred masks are the narrowest that could
    ever hold the request (counting every CPU of the nodes, free or not); with
    align-by-socket, masks spanning the fewest sockets needed are preferred too.
    A workload that already holds CPUs gets its hints regenerated from them,
    or none at all if it holds a different number.
    """
    options = options or CpuManagerOptions()
    if request <= 0:
        return HintSet.no_preference()
    if already_allocated is not None:
        if len(already_allocated) != request:
            return HintSet.impossible()
        available, reusable = already_allocated, EMPTY

    pool = (available | reusable).bits
    # Per-node counts keyed by the node's single-bit mask: fits() walks only
    # the set bits of the mask it is asked about.
    counts: dict[int, int] = {}
    reusable_nodes = 0
    for node, cpus in topo.numa_cpus.items():
        counts[1 << node] = (cpus.bits & pool).bit_count()
        if cpus.bits & reusable.bits:
            reusable_nodes |= 1 << node

    def fits(mask: NumaMask) -> bool:
        bits = mask.bits
        if reusable_nodes & ~bits:
            return False
        total = 0
        while bits:
            low = bits & -bits
            total += counts.get(low, 0)
            if total >= request:
                return True
            bits ^= low
        return False

    nodes = topo.numa_mask
    if not fits(nodes):
        return HintSet.impossible()
    min_size = topo.min_nodes_for(request)
    also_preferred = _socket_aligned(topo, min_size) if options.align_by_socket else None
    # A superset of a mask that holds the request holds it too.
    return HintSet.generated(nodes, fits, min_size, also_preferred, monotone=True)


def _socket_aligned(topo: CpuTopology, min_size: int):
    """align-by-socket: a mask is also preferred when it spans exactly as many
    sockets as the narrowest fitting mask needs."""
    nodes_per_socket = topo.num_numa_nodes // topo.num_sockets if topo.num_sockets else 0
    if nodes_per_socket == 0:
        return None
    min_sockets = -(-min_size // nodes_per_socket)
    socket_bits: dict[int, int] = {}
    for node, sockets in topo.sockets_of_numa.items():
        bits = 0
        for s in sockets:
            bits |= 1 << s
        socket_bits[1 << node] = bits

    def aligned(mask: NumaMask) -> bool:
        bits, sockets = mask.bits, 0
        while bits:
            low = bits & -bits
            sockets |= socket_bits.get(low, 0)
            bits ^= low
        return sockets.bit_count() == min_sockets

    return aligned


def allocate_cpus(
    topo: CpuTopology,
    available: CpuSet,
    request: int,
    affinity: NumaMask | None,
    options: CpuManagerOptions | None = None,
) -> CpuSet:
    """The static policy's exclusive allocation: as much of the request as
    the affinity's NUMA nodes (their sockets, with align-by-socket) hold, the
    rest from anywhere, each part chosen by the packed or NUMA-distributed
    best fit."""
    options = options or CpuManagerOptions()
    if request < 0:
        raise CpuAllocationError(f"cannot allocate a negative number of cpus: requested={request}")
    allocatable = available & topo.all_cpus
    if options.full_pcpus_only:
        per_core = topo.cpus_per_core
        if request % per_core:
            raise SMTAlignmentError(request, per_core)
        # Only wholly free cores: a lone sibling would break the guarantee.
        allocatable = topo.whole_core_cpus(allocatable)
        if request > len(allocatable):
            raise SMTAlignmentError(request, per_core, len(allocatable))
    if request > len(allocatable):
        raise CpuAllocationError(
            f"not enough cpus available to satisfy request: requested={request}, "
            f"available={len(allocatable)}"
        )

    result = EMPTY
    if affinity is not None:
        if options.align_by_socket:
            aligned = allocatable & topo.cpus_of_sockets(topo.sockets_of_numas(affinity.nodes()))
        else:
            aligned = allocatable & topo.cpus_of_numas(affinity.nodes())
        result = _take(topo, aligned, min(request, len(aligned)), options)
    rest = _take(topo, allocatable - result, request - len(result), options)
    return result | rest


def _take(topo: CpuTopology, available: CpuSet, count: int, options: CpuManagerOptions) -> CpuSet:
    if options.distribute_cpus_across_numa:
        group = topo.cpus_per_core if options.full_pcpus_only else 1
        return take_by_topology_distributed(topo, available, count, group, options)
    return take_by_topology(topo, available, count, options)
