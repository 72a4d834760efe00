"""Resizing a running workload in place: its exclusive CPUs and its memory. Pure.

`resize(machine, state, name, cpus=N, memory_bytes=M, kernel=None)` returns a
`Decision` whose state holds the workload with its new booking (made by
`with_workload`, so the cost follows the change), or raises `Refusal` and changes
nothing.

A resize is decided as an admission is: the workload's own request as recorded
(`Workload.request`: its nodes, named or granted CPUs, policy and strategy), at
the new size, goes through `decide` (the providers, the topology manager, the
policy, scope and CPU manager options in force) against the state without the
workload, with what it holds passed as `Request.keep`: growth keeps every CPU
and adds aligned ones, a shrink gives back and never moves (`admission/keep.py`).
A pod member grows inside its pod's budget. The booking's `numa_nodes` are those
of what it holds after the change. A refusal speaks in the resize's terms
("cannot grow web from 6 to 20 CPUs: 14 more needed, 9 free") with what is free
per node beside what the workload holds.
"""

from __future__ import annotations

from typing import Any

from numa_agent.admission.admit import Decision, InvalidRequest, Refusal, decide, fenced_text
from numa_agent.admission.explanation import Explanation, ResizePart
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import KernelHugepages, free_bytes
from numa_agent.admission.request import Keep, Request, Resources
from numa_agent.admission.view import AdmissionView
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.units import format_bytes
from numa_agent.state.model import AgentState, Workload, replace

# Policies that admit only an aligned (preferred) placement: a growth stays on the aligned nodes.
_ALIGNED_ONLY = ("restricted", "single-numa-node")


def resize(machine: Machine, state: AgentState, name: str, cpus: int | None = None,
           memory_bytes: int | None = None, kernel: KernelHugepages | None = None) -> Decision:
    w = state.workload(name)
    if w is None:
        raise Refusal("not_found", f"no workload named {name!r}")
    _check_resizable(w, cpus, memory_bytes)
    have = len(w.booking.cpus)
    target_cpus = have if cpus is None else cpus
    target_memory = _recorded_memory(w) if memory_bytes is None else memory_bytes
    request = _request(w, target_cpus, target_memory)
    without = _without(state, w)
    before = _figures(w)
    try:
        try:
            # The hugepages it keeps are its own already: the kernel's counters, which
            # show them taken, would refuse them to it. A resize does not change them.
            pages = kernel if not any(request.resources.hugepages.values()) else None
            decision = decide(machine, without, request, kernel=pages)
        except InvalidRequest as exc:
            raise Refusal("bad_request", str(exc)) from None
        except Refusal as refusal:
            raise _in_resize_terms(machine, state, w, target_cpus, target_memory, refusal) from None
    except Refusal as refusal:
        # What a person needs to act on it, in their terms: what was asked against what it
        # holds (the renderers say "from 6 to 20 CPUs, 14 more needed") and what is free where.
        # The decision's own details (hints, merge) are of the state without the workload:
        # they are kept under "decided", out of what the renderers print.
        asked = {key: value for key, value in (("cpus", cpus), ("memory_bytes", memory_bytes)) if value is not None}
        decided = refusal.explanation.but(free=None, resize=None)
        raise refusal.explained(Explanation(admit=False, resize=ResizePart(before, {}, asked),
                                            free=AdmissionView(machine, state).free, decided=decided)) from None
    booking = decision.workload.booking
    kept = booking.cpus & w.booking.cpus
    added = (*(c for c in w.cpus_added if c in kept), *(booking.cpus - w.booking.cpus).ids())
    recorded = dict(w.request)
    if cpus is not None:
        recorded["cpus"] = cpus
    if memory_bytes is not None:
        recorded["memory_bytes"] = memory_bytes
    resized = replace(w, booking=booking, cpus_added=tuple(added), request=recorded)
    explanation = decision.explanation.but(admit=True, resize=ResizePart(before, _figures(resized)))
    new_state = state.with_workload(resized)
    return Decision(new_state, resized, None, explanation,
                    pinned=frozenset(p for p, held in (("cpu", booking.cpus), ("memory", booking.memory)) if held))


def _recorded_memory(w: Workload) -> int:
    """The regular memory a workload asked for (its booking's when it books memory)."""
    return w.booking.memory_total("memory") or int(w.request.get("memory_bytes", 0) or 0)


def _request(w: Workload, cpus: int, memory_bytes: int) -> Request:
    """The workload's admission request as recorded, at the new size, keeping what it holds."""
    r = w.request
    physcpubind = r.get("physcpubind")
    resources = Resources(
        cpus=0 if physcpubind is not None else cpus, memory_bytes=memory_bytes,
        hugepages={int(k): int(v) for k, v in (r.get("hugepages") or {}).items()},
        devices={str(k): int(v) for k, v in (r.get("devices") or {}).items()})
    within_cpus, within_mems = r.get("within_cpus"), r.get("within_mems")
    return Request(
        name=w.name, owner_uid=w.owner_uid, resources=resources, shared=bool(r.get("shared", w.shared)),
        policy=r.get("policy") or None, numa_allocation_strategy=r.get("numa_allocation_strategy") or None,
        physcpubind=None if physcpubind is None else CpuSet.parse(physcpubind),
        cpunodebind=_nodes(r.get("cpunodebind")), membind=_nodes(r.get("membind")), pod=w.pod,
        cgroup=w.cgroup, within_cpus=None if within_cpus is None else CpuSet.parse(within_cpus),
        within_mems=_nodes(within_mems), keep=Keep(w.booking, w.cpus_added))


def _nodes(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(n) for n in value)


def _without(state: AgentState, w: Workload) -> AgentState:
    """The state the resize is decided against: without the workload (a pod
    member also out of its pod's members, the pod kept)."""
    without = state.without_workload(w.name)
    pod = state.pod(w.pod) if w.pod is not None else None
    if pod is not None:
        without = without.with_pod(replace(pod, members=tuple(m for m in pod.members if m != w.name)))
    return without


def _in_resize_terms(machine: Machine, state: AgentState, w: Workload, cpus: int, memory: int,
                     refusal: Refusal) -> Refusal:
    """The refusal of the resized request, said as a resize: from how many to how
    many, how many more are needed and how many are free (beside what it holds)."""
    have = len(w.booking.cpus)
    code, explanation = refusal.code, refusal.explanation

    def said(message: str) -> Refusal:
        return Refusal(code, message, explanation, provider=refusal.provider, pinned=refusal.pinned)

    view = AdmissionView(machine, state)
    if cpus > have and refusal.provider in ("cpu", None) and code != "numa_node_memory_short":
        free, needed = view.allocatable_cpus, cpus - have
        policy = w.request.get("policy") or machine.policy.topology_policy
        head = f"cannot grow {w.name} from {have} to {cpus} CPUs"
        if w.pod is not None:  # the pod's figures are in the provider's words
            return said(f"{head} inside pod {w.pod!r}: {refusal.message}")
        if code == "topology_affinity_error" and policy in _ALIGNED_ONLY:
            nodes = w.booking.numa_nodes or machine.nodes_of(w.booking.cpus)
            there = free & machine.cpus_of_nodes(nodes)
            fence = f"; {fenced_text(view)}" if set(nodes) & set(view.fenced_nodes) else ""
            return said(f"TopologyAffinityError: {head} within NUMA node(s) {','.join(map(str, nodes))} "
                        f"(policy {policy}): {needed} more needed, {len(there)} free there{fence}")
        if code == "shared_pool_empty":
            return said(f"growing {w.name} from {have} to {cpus} CPUs would leave the shared pool empty")
        short = code == "insufficient_cpus" and len(free) < needed
        return said(f"{head}: {needed} more needed, {len(free)} free" + ("" if short else f" ({refusal.message})"))
    current = _recorded_memory(w)
    if memory > current and code == "insufficient_memory" and w.booking.memory and w.pod is None:
        nodes = w.booking.memory_group or tuple(sorted(w.booking.memory))
        free_there = sum(free_bytes(machine.memory, view.memory_usage, n, "memory") for n in nodes)
        return said(f"cannot grow {w.name}'s memory from {format_bytes(current)} to {format_bytes(memory)}: "
                    f"{format_bytes(memory - current)} more needed, {format_bytes(free_there)} free on its "
                    f"node(s) {','.join(map(str, nodes))}")
    return refusal


def _check_resizable(w: Workload, cpus: int | None, memory_bytes: int | None) -> None:
    if cpus is None and memory_bytes is None:
        raise Refusal("bad_request", "a resize names --cpus, --memory or both")
    if cpus is not None and cpus < 1:
        raise Refusal("bad_request", f"cannot resize {w.name} to {cpus} CPUs: an exclusive workload keeps at least "
                                     "one (release it to give back all)")
    if memory_bytes is not None and memory_bytes < 1:
        raise Refusal("bad_request", "--memory must be at least one byte")
    if cpus is not None and (w.shared or not w.booking.cpus):
        raise Refusal("not_resizable", f"{w.name} runs on the shared pool: only exclusive CPUs are resized; "
                                       "start it with --cpus N to have them")
    if w.request.get("physcpubind") is not None and cpus is not None and cpus != len(w.booking.cpus):
        raise Refusal("not_resizable", f"{w.name} named its CPUs (-C): resize it by starting it again")
    if memory_bytes is not None and w.pod is None and not w.booking.memory:
        # Booking memory now would choose its nodes afresh and move its mems: a resize never moves.
        raise Refusal("not_resizable", f"{w.name} has no memory booking to resize: start it with --memory SIZE")


def _figures(w: Workload) -> dict[str, Any]:
    return {"cpus": w.booking.cpus.format(), "memory_bytes": w.booking.memory_total("memory")}
