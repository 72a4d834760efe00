"""The memory manager as a provider: regular memory and hugepages (static
policy), membind, and a pod member's memory limit inside its pod's budget.

Memory-only nodes (`Machine.explicit_nodes`: GPU memory, CXL) are left out of
the hints and the allocation of every request that does not name them in its
membind; a request that would fit only with them is refused, saying how to
name them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from numa_agent.admission.errors import MemoryAllocationError, MemoryOnlyNodesError
from numa_agent.admission.keep import keep_memory, require_nodes
from numa_agent.admission.memory_manager import (
    MemoryRequest,
    allocate_memory,
    memory_hints,
    narrowest_fit,
    nodes_have,
)
from numa_agent.admission.provider import NOTHING, Allocation
from numa_agent.admission.request import Request
from numa_agent.admission.view import AdmissionView
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint
from numa_agent.core.units import format_bytes

TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"


def _memory_request(request: Request, view: AdmissionView) -> MemoryRequest:
    """The request's memory part, checked; built once for hints() and allocate()."""
    res = request.resources
    return view.kept("memory.request", request,
                     lambda: MemoryRequest(memory_bytes=res.memory_bytes, hugepages=dict(res.hugepages)))


def _wants_memory(request: Request, view: AdmissionView) -> bool:
    res = request.resources
    return view.machine.policy.memory_policy == "static" and (res.memory_bytes > 0 or any(res.hugepages.values()))


@dataclass(frozen=True)
class MemoryProvider:
    name: str = "memory"

    def hints(self, request: Request, view: AdmissionView) -> Mapping[str, HintSet] | None:
        if view.pod is not None:
            return None
        mem_request = _memory_request(request, view)  # checks the amounts, asked for or not
        if request.membind is not None:
            return _membind_hints(request, view, mem_request, request.membind)
        if not _wants_memory(request, view):
            return None
        machine, fenced = view.machine, view.fenced_nodes
        nodes: NumaMask | tuple[int, ...] = machine.ordinary_node_mask
        if fenced:
            nodes = tuple(n for n in machine.ordinary_node_ids if n not in fenced)
        if request.within_mems is not None:
            nodes = tuple(n for n in nodes if n in request.within_mems)
        kept = request.keep.booking if request.keep is not None else None
        held = () if kept is None else kept.memory_group or tuple(kept.memory)
        if held and set(held) & set(fenced):
            # On a fenced node the free bytes are short of what is booked: what it keeps
            # stays where it is (decide refuses it more there), its one mask, preferred
            # as the memory manager's hint on it would be, and always on one node (the
            # narrowest any mask is, when the node shrank below what it keeps).
            hints = memory_hints(machine.memory, view.memory_usage, mem_request, (*nodes, *held), view.kernel)
            mask = NumaMask(held)
            return {resource: HintSet.explicit([TopologyHint(
                mask, mask.count() == 1 or (h.kind == "generated" and h.is_preferred(mask)))])
                for resource, h in hints.items()}
        hints = memory_hints(machine.memory, view.memory_usage, mem_request, nodes, view.kernel)
        if held:  # a resize: masks holding the nodes its memory is on
            return {resource: require_nodes(h, held) for resource, h in hints.items()}
        return hints

    def allocate(self, request: Request, view: AdmissionView, affinity: NumaMask | None) -> Allocation:
        if view.pod is not None:
            _check_pod_limit(request, view)
            return NOTHING
        membind = None if request.membind is None else tuple(request.membind)
        if not _wants_memory(request, view):
            return NOTHING if membind is None else Allocation(mems=membind)
        machine = view.machine
        if request.keep is not None and request.keep.booking.memory:
            return keep_memory(machine.memory, view.memory_usage, request.keep.booking,
                               request.resources.memory_bytes, membind)
        if membind is not None:  # cpuset.mems: the memory goes nowhere else
            where: NumaMask | None = NumaMask(membind)
            bounds = where
        else:
            where = _without_explicit(affinity, machine.explicit_nodes)
            bounds = machine.ordinary_node_mask
        try:
            alloc = allocate_memory(machine.memory, view.memory_usage, _memory_request(request, view), where,
                                    nodes=bounds, kernel=view.kernel)
        except MemoryAllocationError as exc:
            hint = None if membind is not None else memory_only_hint(request, view)
            if hint is None:
                raise
            raise MemoryOnlyNodesError(f"{TOPOLOGY_AFFINITY_ERROR}: {exc}; {hint}") from None
        mems = membind if membind is not None else tuple(sorted({n for n, _, _ in alloc.amounts}))
        return Allocation(memory=alloc.amounts, memory_group=alloc.group.nodes(), mems=mems)

    def refusal_reason(self, request: Request, view: AdmissionView) -> str | None:
        wanted = request.resources.memory_bytes
        hint = memory_only_hint(request, view) if request.membind is None else None
        if not wanted:
            return hint
        machine = view.machine
        ordinary = set(machine.ordinary_node_ids)
        memory_nodes = machine.memory.memory_nodes
        free = [(int(n), v["memory_bytes"]) for n, v in view.free.items()
                if int(n) in memory_nodes and int(n) in ordinary]
        why = f"memory: requested {format_bytes(wanted)}, {nodes_have(free)}"
        return why if hint is None else f"{why}; {hint}"


def _membind_hints(request: Request, view: AdmissionView, mem_request: MemoryRequest,
                   membind: tuple[int, ...]) -> Mapping[str, HintSet] | None:
    """-m names where the memory goes (its nodes are booked as one group, `mems` is
    them): the one mask of those nodes, so the CPUs are placed beside it. Preferred
    as the memory manager's hint on that mask would be (as narrow as the fewest of
    those nodes that could hold the request; one node when nothing is booked). A
    request the named nodes cannot hold gets no say here: allocate() says why."""
    mask = NumaMask(membind)
    if not _wants_memory(request, view):
        return {"memory": HintSet.explicit([TopologyHint(mask, mask.count() == 1)])}
    hints = memory_hints(view.machine.memory, view.memory_usage, mem_request, membind, view.kernel)
    out: dict[str, HintSet] = {}
    for resource, h in hints.items():
        if h.kind != "generated" or h.fits is None or not h.fits(mask):
            return None
        out[resource] = HintSet.explicit([TopologyHint(mask, h.is_preferred(mask))])
    return out or None


def _without_explicit(affinity: NumaMask | None, explicit: tuple[int, ...]) -> NumaMask | None:
    """The merged affinity less the memory-only nodes a request did not name."""
    if affinity is None or not explicit:
        return affinity
    kept = affinity.bits & ~NumaMask.bits_of(explicit)
    return NumaMask.from_bits(kept) if kept else None


def memory_only_hint(request: Request, view: AdmissionView) -> str | None:
    """When the request's memory fits only with memory-only nodes: which ones
    would hold it and the -m that names them (with an ordinary node, so the
    program's pages fill ordinary memory first); else None."""
    machine = view.machine
    if not machine.explicit_nodes or not _wants_memory(request, view):
        return None
    mem_request = _memory_request(request, view)
    usage = view.memory_usage
    if narrowest_fit(machine.memory, usage, mem_request, machine.ordinary_node_ids) is not None:
        return None
    fit = narrowest_fit(machine.memory, usage, mem_request, machine.node_ids)
    if fit is None:
        return None
    held = set(machine.explicit_nodes)
    memory_only = [n for n in fit.nodes() if n in held]
    named = set(fit.nodes())
    if not named - held:
        first = memory_only[0]
        candidates = [n for n in machine.ordinary_node_ids if n in machine.memory.memory_nodes]
        if candidates:
            named.add(min(candidates, key=lambda n: (machine.distances.get(first, {}).get(n, 255), n)))
    listed = NumaMask(memory_only).format()
    head = f"it fits only with memory-only node(s) {listed}, which a booking uses only when it names them"
    if request.pod is not None:
        return (f"{head}, and a pod's budget cannot name nodes (memory_manager.memory_only_nodes = "
                f"\"ordinary\" lets every booking use them)")
    return f"{head}: add -m {NumaMask(named).format()} to use memory-only node(s) {listed} (membind in the API)"


def _check_pod_limit(request: Request, view: AdmissionView) -> None:
    """Memory of members is a limit inside the pod's budget, not a new booking."""
    pod = view.pod
    assert pod is not None
    wanted = request.resources.memory_bytes
    budget = pod.booking.memory_total("memory")
    if wanted and budget:
        used = sum(int(m.request.get("memory_bytes", 0)) for m in view.pod_members)
        if used + wanted > budget:
            raise MemoryAllocationError(
                f"pod {pod.name!r}: its members would use {format_bytes(used + wanted)} of memory, "
                f"more than the pod's budget of {format_bytes(budget)}")
