"""Why a provider cannot allocate: one exception class per refusal, each
naming its reason code (the short code refusals and metrics carry) as the
class attribute ``reason``. Pure: no imports beyond the standard library."""

from __future__ import annotations


class AllocationError(Exception):
    """A request the machine (or a pod budget) cannot satisfy."""

    reason: str = "allocation_error"


class CpuAllocationError(AllocationError):
    """The request cannot be met from the CPUs offered."""

    reason = "insufficient_cpus"


class SMTAlignmentError(CpuAllocationError):
    """full-pcpus-only: the request cannot be served with whole physical cores."""

    reason = "smt_alignment_error"

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


class CpusBusyError(AllocationError):
    """Pinned CPUs (physcpubind) that are reserved or exclusively allocated."""

    reason = "cpus_busy"


class SharedPoolEmptyError(AllocationError):
    """Exclusive CPUs that would leave the shared pool without a CPU."""

    reason = "shared_pool_empty"


class PodSharedPartEmptyError(AllocationError):
    """A pod member that would leave the pod's sharing members no CPU."""

    reason = "pod_shared_part_empty"


class MemoryAllocationError(AllocationError):
    """A memory request cannot be satisfied, or allocations are inconsistent."""

    reason = "insufficient_memory"


class MemoryOnlyNodesError(MemoryAllocationError):
    """A memory request that fits only with memory-only NUMA nodes (GPU memory,
    CXL) it does not name: a topology affinity error, as its reason says how to
    name them."""

    reason = "topology_affinity_error"


class HugepagesNotFreeError(MemoryAllocationError):
    """Hugepages the bookings leave free but the kernel does not: taken outside
    the agent (by processes it never admitted), so a workload placed on them
    would fail when it faults them in."""

    reason = "hugepages_not_free"


class DeviceAllocationError(AllocationError):
    """A device request cannot be satisfied."""

    reason = "insufficient_devices"


class NodeFencedError(AllocationError):
    """A request that would book on a NUMA node holding more booked memory
    than it has now (its memory shrank under live bookings)."""

    reason = "numa_node_memory_short"
