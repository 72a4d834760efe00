"""The CPU manager's static policy, pure: options, reserved CPUs, NUMA hints
and exclusive allocation, with the kubelet's semantics.

The caller owns the state (which CPUs are free); every function here takes
the free set as a value and returns a new value.
"""

from __future__ import annotations

from numa_agent.admission.cpu_options import CpuManagerOptions, CpuPolicyConfigError
from numa_agent.admission.cpu_take import take_by_topology, take_by_topology_distributed
from numa_agent.admission.cpu_topology import CpuTopology
from numa_agent.admission.errors import CpuAllocationError, SMTAlignmentError
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask, count_fits

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


def reserved_cpus(topo: CpuTopology, explicit: CpuSet | None, count: int,
                  usable: CpuSet | None = None) -> CpuSet:
    """The CPUs kept for the system: the explicit list when given, otherwise
    `count` CPUs of `usable` (default: every CPU of `topo`) taken whole
    physical cores first, lowest ids first."""
    pool = topo.all_cpus if usable is None else usable & topo.all_cpus
    if count < 0:
        raise CpuPolicyConfigError(f"reserved CPU count must be >= 0, got {count}")
    if explicit is not None:
        unknown = explicit - pool
        if unknown:
            raise CpuPolicyConfigError(f"reserved CPUs {unknown.format()} are not usable CPUs of this machine")
        if count and count != len(explicit):
            raise CpuPolicyConfigError(
                f"reserved CPU list {explicit.format()} holds {len(explicit)} CPUs, "
                f"but {count} are to be reserved"
            )
        return explicit
    if count > len(pool):
        raise CpuPolicyConfigError(
            f"cannot reserve {count} CPUs: the machine has {len(pool)} usable CPUs"
        )
    return take_by_topology(topo, pool, count)


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
    by_node = topo.numa_bits_by_node_bit
    counts = {low: (cpus & pool).bit_count() for low, cpus in by_node}
    # Every reusable CPU must lie inside the mask: its nodes are required.
    fits, fits_alone = count_fits(counts, request, required=_nodes_holding(by_node, reusable.bits))

    nodes = topo.numa_mask
    if not fits(nodes):
        return HintSet.impossible()
    min_size = topo.min_nodes_for(request)
    also_preferred = _socket_aligned(topo, min_size) if options.align_by_socket else None
    # A superset of a mask that holds the request holds it too.
    return HintSet.generated(nodes, fits, min_size, also_preferred, monotone=True, fits_alone=fits_alone)


def _nodes_holding(by_node: tuple[tuple[int, int], ...], cpu_bits: int) -> int:
    """The nodes (bits) with any of `cpu_bits` among their CPUs."""
    out = 0
    if cpu_bits:
        for low, cpus in by_node:
            if cpus & cpu_bits:
                out |= low
    return out


def _socket_aligned(topo: CpuTopology, min_size: int):
    """align-by-socket: a mask is also preferred when it spans exactly as many
    sockets as the narrowest fitting mask needs."""
    nodes_per_socket = topo.num_numa_nodes // topo.num_sockets if topo.num_sockets else 0
    if nodes_per_socket == 0:
        return None
    min_sockets = -(-min_size // nodes_per_socket)
    # Socket ids are small ints too: a socket set is kept as a bitmask.
    # keyed by the node's single-bit mask, as in cpu_hints' fits().
    socket_bits = {1 << node: NumaMask.bits_of(sockets) for node, sockets in topo.sockets_of_numa.items()}
    sockets_of = socket_bits.get

    def aligned(mask: NumaMask) -> bool:
        bits, sockets = mask.bits, 0
        while bits:
            low = bits & -bits
            sockets |= sockets_of(low, 0)
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
        if len(result) == request:
            return result
    rest = _take(topo, allocatable - result, request - len(result), options)
    return result | rest


def _take(topo: CpuTopology, available: CpuSet, count: int, options: CpuManagerOptions) -> CpuSet:
    if options.distribute_cpus_across_numa:
        group = topo.cpus_per_core if options.full_pcpus_only else 1
        return take_by_topology_distributed(topo, available, count, group, options)
    return take_by_topology(topo, available, count, options)
