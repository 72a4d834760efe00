"""Derived views of (machine, state): what is free, shared and in use. Pure.

``AdmissionView`` is what the providers read during one admission: the
machine, the state, and (for a pod member) the pod whose budget it takes
from; every derived value is computed once, on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Mapping, Sequence, TypeVar

from numa_agent.admission.errors import AllocationError
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import (
    KernelHugepages,
    MemoryUsage,
    kernel_available,
    shortfalls,
    usage_from_booked,
    usage_with_booked,
    usage_without_booked,
)
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState, Booking, FollowsChanges, Holder, Pod, Workload


def shared_pool(machine: Machine, state: AgentState) -> CpuSet:
    """CPUs for everything without exclusive CPUs: usable minus every exclusive
    booking (and minus the reserved CPUs under strict-cpu-reservation)."""
    pool = machine.usable_cpus - state.exclusive_cpus()
    if machine.cpu_options.strict_cpu_reservation:
        pool = pool - machine.reserved_cpus
    return pool


def allocatable_cpus(machine: Machine, state: AgentState) -> CpuSet:
    """CPUs that can still become exclusive: not on a fenced node."""
    free = machine.usable_cpus - machine.reserved_cpus - state.exclusive_cpus()
    fenced = fenced_nodes(machine, state)
    return free - machine.cpus_of_nodes(fenced) if fenced else free


def fenced_nodes(machine: Machine, state: AgentState) -> tuple[int, ...]:
    """NUMA nodes holding more booked memory than they have now (see
    `memory_manager.shortfalls`): no new admission books anything there, as
    a workload placed there would compete for pages the node no longer has."""
    return tuple(sorted({n for n, _, _, _ in shortfalls(machine.memory, memory_usage(state))}))


def pod_shared_cpus(state: AgentState, pod: Pod) -> CpuSet:
    """The part of a pod's CPUs that its non-exclusive members share."""
    bits = 0
    for m in state.members_of(pod.name):
        bits |= m.booking.cpus.bits
    return pod.booking.cpus - CpuSet.from_bits(bits)


def effective_cpus(machine: Machine, state: AgentState, w: Workload) -> CpuSet:
    """The cpuset a workload runs on right now."""
    if not w.shared:
        return w.booking.cpus
    if w.pod is not None:
        pod = state.pod(w.pod)
        return pod_shared_cpus(state, pod) if pod else CpuSet()
    pool = shared_pool(machine, state)
    if w.cpunodebind:
        pool = pool & machine.cpus_of_nodes(w.cpunodebind)
    return pool


def memory_usage(state: AgentState) -> MemoryUsage:
    """The memory manager's usage of every booking in `state` (kept in the
    state's memo: it depends on the state only; the states derived from it
    by a few updates take it on with only the changed bookings folded)."""
    memo = state.memo
    kept = memo.get("memory_usage")
    if kept is None:
        kept = memo["memory_usage"] = _KeptUsage(usage_from_booked(
            _booked(b) for b in state.top_level_bookings() if b.memory))
    return kept.usage


def _booked(b: Booking) -> tuple[Iterable[int], Mapping[int, Mapping[str, int]]]:
    """A booking's memory as usage_from_booked takes it: (group nodes, amounts)."""
    return b.memory_group or b.memory.keys(), b.memory


@dataclass(frozen=True)
class _KeptUsage(FollowsChanges):
    usage: MemoryUsage

    def after(self, removed: Sequence[Holder], added: Sequence[Holder]) -> "_KeptUsage | None":
        usage = self.usage
        try:
            for b in (h.booking for h in removed):
                if b.memory:
                    usage = usage_without_booked(usage, *_booked(b))
            for b in (h.booking for h in added):
                if b.memory:
                    usage = usage_with_booked(usage, *_booked(b))
        except (ValueError, AllocationError):
            return None  # folded afresh when asked, which raises what is wrong
        return _KeptUsage(usage)


T = TypeVar("T")


class _once(Generic[T]):
    """A value computed on first read and kept in the instance (like
    functools.cached_property, without its lock: one view serves one
    admission, in one thread)."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, view: Any, owner: type | None = None) -> T:
        if view is None:
            return self  # type: ignore[return-value]
        value = self.compute(view)
        view.__dict__[self.name] = value  # later reads find it before this descriptor
        return value


@dataclass(frozen=True)
class AdmissionView:
    """The machine and state one admission reads. ``pod`` set: the request is
    a member of that pod and takes its resources from the pod's budget.
    ``kernel``: the kernel's hugepage counters read for this request (None:
    none read, the bookings alone say what is free). ``keeps``: what a resize's
    workload holds (`Request.keep`; the state is without it): its memory counts
    towards the fence, so a node short with it stays fenced for its growth."""

    machine: Machine
    state: AgentState
    pod: Pod | None = None
    kernel: KernelHugepages | None = None
    keeps: Booking | None = None

    def kept(self, key: str, request: object, compute: Callable[[], T]) -> T:
        """A value a provider derives from `request` in ``hints()`` and needs
        again in ``allocate()``: computed once per view and request."""
        slot = self.__dict__.get(key)
        if slot is None or slot[0] is not request:
            slot = self.__dict__[key] = (request, compute())
        return slot[1]

    @_once
    def allocatable_cpus(self) -> CpuSet:
        machine, fenced = self.machine, self.fenced_nodes
        free = machine.usable_cpus - machine.reserved_cpus - self.state.exclusive_cpus()
        return free - machine.cpus_of_nodes(fenced) if fenced else free

    @_once
    def shortfalls(self) -> tuple[tuple[int, str, int, int], ...]:
        usage = self.memory_usage
        if self.keeps is not None and self.keeps.memory:
            usage = usage_with_booked(usage, *_booked(self.keeps))
        return shortfalls(self.machine.memory, usage)

    @_once
    def fenced_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for n, _, _, _ in self.shortfalls}))

    @_once
    def shared_pool(self) -> CpuSet:
        return shared_pool(self.machine, self.state)

    @_once
    def memory_usage(self) -> MemoryUsage:
        return memory_usage(self.state)

    @_once
    def devices_in_use(self) -> dict[str, frozenset[str]]:
        return self.state.devices_in_use()

    @_once
    def pod_members(self) -> tuple[Workload, ...]:
        return () if self.pod is None else tuple(self.state.members_of(self.pod.name))

    @_once
    def pod_shared_cpus(self) -> CpuSet:
        return CpuSet() if self.pod is None else pod_shared_cpus(self.state, self.pod)

    @_once
    def free(self) -> dict[str, dict[str, Any]]:
        """Per node: CPUs that can still become exclusive, free regular memory
        and, where the node has hugepage pools, their free bytes by page size
        in kB (the request's keys; no more than the kernel's counters leave,
        where they were read): the numbers a refusal's text speaks of."""
        usage = self.memory_usage
        free_bits, allocated = self.allocatable_cpus.bits, usage.allocated_bytes
        fenced = self.fenced_nodes  # nothing of theirs is free for a new admission
        kernel = {} if self.kernel is None else kernel_available(self.kernel, usage)
        out: dict[str, dict[str, Any]] = {}
        for n, key, cpu_bits, memory, pools in self.machine.free_layout:
            open_ = n not in fenced
            entry: dict[str, Any] = {"cpus": (free_bits & cpu_bits).bit_count(),
                                     "memory_bytes": max(0, memory - allocated(n, "memory")) if open_ else 0}
            if pools:
                entry["hugepages_bytes"] = {
                    size: min(max(0, allocatable - allocated(n, resource)), kernel.get((n, resource), allocatable))
                    if open_ else 0 for size, resource, allocatable in pools}
            out[key] = entry
        return out
