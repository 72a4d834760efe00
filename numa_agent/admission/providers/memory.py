"""The memory manager as a provider: regular memory and hugepages (static
policy), membind, and a pod member's memory limit inside its pod's budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from numa_agent.admission.errors import MemoryAllocationError
from numa_agent.admission.memory_manager import MemoryRequest, allocate_memory, memory_hints, nodes_have
from numa_agent.admission.provider import NOTHING, Allocation
from numa_agent.admission.request import Request
from numa_agent.admission.view import AdmissionView
from numa_agent.core.hints import HintSet, NumaMask
from numa_agent.core.units import format_bytes


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
        if request.membind is not None or not _wants_memory(request, view):
            return None
        machine, fenced = view.machine, view.fenced_nodes
        nodes = [n for n in machine.node_ids if n not in fenced] if fenced else machine.node_ids
        if request.within_mems is not None:
            nodes = [n for n in nodes if n in request.within_mems]
        return memory_hints(machine.memory, view.memory_usage, mem_request, nodes)

    def allocate(self, request: Request, view: AdmissionView, affinity: NumaMask | None) -> Allocation:
        if view.pod is not None:
            _check_pod_limit(request, view)
            return NOTHING
        membind = None if request.membind is None else tuple(request.membind)
        if not _wants_memory(request, view):
            return NOTHING if membind is None else Allocation(mems=membind)
        where = NumaMask(membind) if membind is not None else affinity
        alloc = allocate_memory(view.machine.memory, view.memory_usage, _memory_request(request, view), where)
        mems = membind if membind is not None else tuple(sorted({n for n, _, _ in alloc.amounts}))
        return Allocation(memory=alloc.amounts, memory_group=alloc.group.nodes(), mems=mems)

    def refusal_reason(self, request: Request, view: AdmissionView) -> str | None:
        wanted = request.resources.memory_bytes
        if not wanted:
            return None
        memory_nodes = view.machine.memory.memory_nodes
        free = [(int(n), v["memory_bytes"]) for n, v in view.free.items() if int(n) in memory_nodes]
        return f"memory: requested {format_bytes(wanted)}, {nodes_have(free)}"


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
