"""What a resize keeps, as each provider honours it. Pure.

A resize decides the workload's own request at its new size against the state
without the workload, with what it holds passed as `Request.keep`, so every rule
an admission checks (nodes named, CPUs granted, the CPU manager's options, the
policy, the merge) holds for the result. As the kubelet's in-place resize keeps
a container's CPUs under the static CPU manager:

- growth keeps every CPU it holds and adds aligned ones: the hints offer only
  node masks containing the nodes of what it keeps, and the take starts from
  the kept CPUs' free siblings, then the static policy's best fit inside the
  merged affinity;
- a shrink gives back and never moves: the result is a subset of what it
  holds (the CPUs resizes added last first, whole cores first, and first of
  all those outside the merged affinity);
- memory grows on the nodes it is booked on, within their free memory, and
  shrinks from the last of them; hugepages and devices are kept as they are.
"""

from __future__ import annotations

from typing import Callable, Iterable

from numa_agent.admission.cpu_manager import allocate_cpus
from numa_agent.admission.cpu_options import CpuManagerOptions
from numa_agent.admission.cpu_topology import CpuTopology
from numa_agent.admission.errors import MemoryAllocationError, SMTAlignmentError
from numa_agent.admission.memory_manager import MemoryCapacity, MemoryUsage, free_bytes
from numa_agent.admission.provider import Allocation
from numa_agent.admission.request import Keep, Resources
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask
from numa_agent.core.units import format_bytes
from numa_agent.state.model import Booking


def require_nodes(hints: HintSet, nodes: Iterable[int]) -> HintSet:
    """`hints` less every mask that does not contain all of `nodes`: what a
    provider offers when the workload keeps something on those nodes."""
    required = NumaMask.bits_of(nodes)
    if not required or hints.kind in ("none", "impossible"):
        return hints
    if hints.kind == "explicit":
        return HintSet.explicit([h for h in hints.explicit_hints
                                 if h.mask is not None and h.mask.bits & required == required])
    assert hints.nodes is not None and hints.fits is not None
    if hints.nodes.bits & required != required or (hints.monotone and not hints.fits(hints.nodes)):
        return HintSet.impossible()
    fits, contains, alone = hints.fits, hints.contains_fit, hints.fits_alone

    def fits_kept(mask: NumaMask) -> bool:
        return mask.bits & required == required and fits(mask)

    def contains_kept(mask: NumaMask) -> bool:
        assert contains is not None
        return contains(NumaMask.from_bits(mask.bits | required))

    def alone_kept() -> int:
        assert alone is not None
        return alone() & required if required.bit_count() == 1 else 0

    return HintSet.generated(hints.nodes, fits_kept, hints.min_size, hints.also_preferred, hints.monotone,
                             contains_kept if contains is not None else None,
                             alone_kept if alone is not None else None)


def grow_cpus(topo: CpuTopology, available: CpuSet, kept: CpuSet, count: int, affinity: NumaMask | None,
              options: CpuManagerOptions) -> CpuSet:
    """`kept` and `count - len(kept)` more from `available`: the free siblings of
    its cores first (not under full-pcpus-only, which takes whole cores only),
    then the static policy's allocation inside `affinity`."""
    needed = count - len(kept)
    free = available - kept
    taken = CpuSet()
    if not options.full_pcpus_only:
        siblings = CpuSet.union_of(core for core in topo.core_cpus.values() if core & kept) & free
        taken = CpuSet(siblings.ids()[:needed])
    rest = needed - len(taken)
    if rest:
        taken = taken | allocate_cpus(topo, free - taken, rest, affinity, options)
    return kept | taken


def shrink_cpus(topo: CpuTopology, kept: CpuSet, added: tuple[int, ...], count: int, affinity: NumaMask | None,
                options: CpuManagerOptions) -> CpuSet:
    """`count` of `kept`: gives back first what lies outside `affinity`, then what
    resizes added (last first), then the highest; whole cores (the part of each
    it holds) before single threads. Under full-pcpus-only only whole cores."""
    per_core = topo.cpus_per_core
    if options.full_pcpus_only and count % per_core:
        raise SMTAlignmentError(count, per_core)
    inside = kept if affinity is None else kept & topo.cpus_of_numas(affinity.nodes())
    recent = [c for c in added if c in kept]
    later = set(recent)
    by_age = [*reversed(recent), *sorted((c for c in kept.ids() if c not in later), reverse=True)]
    order = [c for c in by_age if c not in inside] + [c for c in by_age if c in inside]
    core_of = {c: core for core in topo.core_cpus.values() for c in core.ids() if c in kept}
    to_give, given = len(kept) - count, CpuSet()
    for cpu in order:  # whole cores (the part of each this workload holds) first
        part = core_of.get(cpu, CpuSet([cpu])) & kept - given
        if part and len(part) <= to_give - len(given):
            given = given | part
    for cpu in order:  # then single threads, in the same order
        if len(given) == to_give:
            break
        given = given | CpuSet([cpu])
    return kept - given


def keep_memory(capacity: MemoryCapacity, usage: MemoryUsage, kept: Booking, target: int,
                membind: tuple[int, ...] | None) -> Allocation:
    """The kept booking's memory with its regular memory at `target` bytes: grown
    on its group's nodes in order within their free memory (`usage` is the state's
    without it), shrunk from the last of them; a node left with nothing drops out
    of its mems. Hugepages are kept as they are."""
    nodes = kept.memory_group or tuple(sorted(kept.memory))
    amounts = {n: dict(per) for n, per in kept.memory.items()}
    current = kept.memory_total("memory")
    if target > current:
        rest = target - current
        room = {n: max(0, free_bytes(capacity, usage, n, "memory") - amounts.get(n, {}).get("memory", 0))
                for n in nodes}
        for n in nodes:
            step = min(rest, room[n])
            if step > 0:
                amounts.setdefault(n, {})["memory"] = amounts.get(n, {}).get("memory", 0) + step
                rest -= step
        if rest:
            raise MemoryAllocationError(f"memory: {format_bytes(target - current)} more needed, "
                                        f"{format_bytes(sum(room.values()))} free on its node(s) "
                                        f"{','.join(map(str, nodes))}")
    else:
        rest = current - target
        for n in reversed(nodes):  # the last node of its group gives back first
            have = amounts.get(n, {}).get("memory", 0)
            step = min(rest, have)
            if step:
                amounts[n]["memory"] = have - step
                rest -= step
    triples = tuple((n, r, v) for n, per in sorted(amounts.items()) for r, v in sorted(per.items()) if v)
    mems = membind if membind is not None else tuple(sorted({n for n, _, _ in triples})) or kept.mems
    return Allocation(memory=triples, memory_group=kept.memory_group, mems=mems)


def gives_back_only(keep: Keep, resources: Resources, memory_managed: bool) -> bool:
    """Whether a resize only gives back (or keeps): no more CPUs than it holds and,
    where the memory manager books memory, no more regular memory. Giving back is
    always allowed, a fenced node's included: the fence holds off what is added."""
    held = keep.booking
    if resources.cpus > len(held.cpus):
        return False
    return not (memory_managed and resources.memory_bytes > held.memory_total("memory"))


def added_nodes(keep: Keep, booking: Booking, nodes_of_cpus: Callable[[CpuSet], Iterable[int]]) -> set[int]:
    """The nodes a resize's booking adds on: those of its new CPUs and, when its
    regular memory grew, every node of its memory group (the kernel may place the
    added pages on any of them)."""
    new = booking.cpus - keep.booking.cpus
    nodes = set(nodes_of_cpus(new)) if new else set()
    if booking.memory_total("memory") > keep.booking.memory_total("memory"):
        nodes.update(booking.memory_group or booking.memory)
    return nodes
