"""Resizing a running workload in place: its exclusive CPUs and its memory. Pure.

`resize(machine, state, name, cpus=N, memory_bytes=M)` returns a `Decision` whose
state holds the workload with its new booking (made by `with_workload`, so the
cost follows the change), or raises `Refusal` and changes nothing.

- Growing keeps every CPU the workload has and adds CPUs aligned with them: the
  free siblings of its cores first, then whole cores of its own NUMA nodes (the
  static policy's packed best fit, `cpu_take`), and only under best-effort or none
  from other nodes; restricted and single-numa-node refuse a growth their
  aligned nodes cannot hold, as they would refuse the admission.
- Shrinking gives back the CPUs resizes added, last added first (`cpus_added`),
  then the highest of the first booking; whole cores first, so a kept CPU keeps
  its sibling wherever the count allows.
- Memory grows or shrinks on the nodes the workload's memory is booked on (its
  group), within their free memory; `memory.max` follows the request's amount.
"""

from __future__ import annotations

from typing import Any

from numa_agent.admission.admit import Decision, Refusal
from numa_agent.admission.cpu_take import take_by_topology
from numa_agent.admission.errors import AllocationError
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import free_bytes
from numa_agent.admission.view import AdmissionView, pod_shared_cpus
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.units import format_bytes
from numa_agent.state.model import AgentState, Booking, Workload, replace

# Policies that admit only an aligned (preferred) placement: a growth stays on the aligned nodes.
_ALIGNED_ONLY = ("restricted", "single-numa-node")


def resize(machine: Machine, state: AgentState, name: str, cpus: int | None = None,
           memory_bytes: int | None = None) -> Decision:
    w = state.workload(name)
    if w is None:
        raise Refusal("not_found", f"no workload named {name!r}")
    _check_resizable(w, cpus, memory_bytes)
    view = AdmissionView(machine, state)  # what is free beside what the workload holds
    booking, added = w.booking, w.cpus_added
    explanation: dict[str, Any] = {"admit": True, "resize": {"from": _figures(w), "to": {}}}
    try:
        if cpus is not None and cpus != len(booking.cpus):
            booking, added = (_grow(view, w, cpus, explanation) if cpus > len(booking.cpus)
                              else _shrink(machine, w, cpus))
        request = dict(w.request)
        if cpus is not None:
            request["cpus"] = cpus
        if memory_bytes is not None and w.pod is not None:
            _check_pod_memory(state, w, memory_bytes, explanation)  # a member's memory is a limit in the budget
            request["memory_bytes"] = memory_bytes
        elif memory_bytes is not None and memory_bytes != booking.memory_total("memory"):
            booking = _memory(view, w, booking, memory_bytes, explanation)
            request["memory_bytes"] = memory_bytes
    except Refusal as refusal:
        # What a person needs to act on it, in their terms: what was asked against what it
        # holds (the renderers say "from 6 to 20 CPUs, 14 more needed") and what is free where.
        asked = {key: value for key, value in (("cpus", cpus), ("memory_bytes", memory_bytes)) if value is not None}
        refusal.explanation["resize"] = {**refusal.explanation.get("resize", {}), "asked": asked}
        refusal.explanation.setdefault("free", view.free)
        raise
    numa_nodes = tuple(sorted(set(booking.numa_nodes) | set(machine.nodes_of(booking.cpus))))
    booking = replace(booking, numa_nodes=numa_nodes)
    resized = replace(w, booking=booking, cpus_added=added, request=request)
    explanation["resize"]["to"] = _figures(resized)
    return Decision(state.with_workload(resized), resized, None, explanation,
                    pinned=frozenset(p for p, held in (("cpu", booking.cpus), ("memory", booking.memory)) if held))


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
    if w.request.get("physcpubind") is not None and cpus is not None:
        raise Refusal("not_resizable", f"{w.name} named its CPUs (-C): resize it by starting it again")


def _figures(w: Workload) -> dict[str, Any]:
    return {"cpus": w.booking.cpus.format(), "memory_bytes": w.booking.memory_total("memory")}


def _grow(view: AdmissionView, w: Workload, count: int, explanation: dict[str, Any]) -> tuple[Booking, tuple[int, ...]]:
    if w.pod is not None:
        return _grow_in_pod(view, w, count, explanation)
    machine, have = view.machine, w.booking.cpus
    free = view.allocatable_cpus
    needed = count - len(have)
    topo = machine.cpu_topology
    siblings = CpuSet.union_of(core for core in topo.core_cpus.values() if core & have) & free
    taken = CpuSet()
    if siblings:
        taken = CpuSet(siblings.ids()[:needed])
    nodes = w.booking.numa_nodes or machine.nodes_of(have)
    own = free & machine.cpus_of_nodes(nodes)
    rest = needed - len(taken)
    try:
        if rest:
            from_own = min(rest, len(own - taken))
            taken = taken | take_by_topology(topo, own - taken, from_own, machine.cpu_options)
            rest = needed - len(taken)
        if rest:
            policy = w.request.get("policy") or machine.policy.topology_policy
            if policy in _ALIGNED_ONLY:
                raise Refusal("topology_affinity_error",
                              f"TopologyAffinityError: cannot grow {w.name} from {len(have)} to {count} CPUs "
                              f"within NUMA node(s) {','.join(map(str, nodes))} (policy {policy}): {needed} more "
                              f"needed, {len(own)} free there", explanation)
            taken = taken | take_by_topology(topo, free - taken, rest, machine.cpu_options)
    except AllocationError as exc:
        short = len(free) < needed  # else the rule of the CPU options refused: say which
        raise Refusal(exc.reason, f"cannot grow {w.name} from {len(have)} to {count} CPUs: {needed} more needed, "
                                  f"{len(free)} free" + ("" if short else f" ({exc})"), explanation) from None
    if not (view.shared_pool - taken):
        raise Refusal("shared_pool_empty", f"growing {w.name} from {len(have)} to {count} CPUs (by {taken.format()}) "
                                           "would leave the shared pool empty", explanation)
    return replace(w.booking, cpus=have | taken), (*w.cpus_added, *taken.ids())


def _grow_in_pod(view: AdmissionView, w: Workload, count: int,
                 explanation: dict[str, Any]) -> tuple[Booking, tuple[int, ...]]:
    """A pod member grows inside its pod's budget: from the pod's CPUs no member
    holds, its cores' siblings first, leaving sharing members a CPU."""
    state, machine, have = view.state, view.machine, w.booking.cpus
    pod = state.pod(w.pod) if w.pod is not None else None
    if pod is None:
        raise Refusal("not_resizable", f"{w.name}'s pod {w.pod} is not known")
    free = pod_shared_cpus(state, pod)
    needed = count - len(have)
    if needed > len(free):
        raise Refusal("insufficient_cpus", f"pod {pod.name!r}: cannot grow {w.name} from {len(have)} to {count} CPUs: "
                                           f"{needed} more needed, {len(free)} of the pod's {len(pod.booking.cpus)} "
                                           "not taken by members", explanation)
    siblings = CpuSet.union_of(core for core in machine.cpu_topology.core_cpus.values() if core & have) & free
    taken = CpuSet(siblings.ids()[:needed])
    if needed > len(taken):
        taken = taken | take_by_topology(machine.cpu_topology, free - taken, needed - len(taken), machine.cpu_options)
    sharing = [m.name for m in state.members_of(pod.name) if m.shared]
    if sharing and not (free - taken):
        raise Refusal("pod_shared_part_empty", f"pod {pod.name!r}: growing {w.name} to {count} CPUs would leave "
                                               f"nothing for the members that share ({', '.join(sharing)})", explanation)
    return replace(w.booking, cpus=have | taken), (*w.cpus_added, *taken.ids())


def _check_pod_memory(state: AgentState, w: Workload, target: int, explanation: dict[str, Any]) -> None:
    pod = state.pod(w.pod) if w.pod is not None else None
    budget = pod.booking.memory_total("memory") if pod is not None else 0
    if not budget:
        return
    others = sum(int(m.request.get("memory_bytes", 0)) for m in state.members_of(w.pod or "") if m.name != w.name)
    if others + target > budget:
        raise Refusal("insufficient_memory", f"pod {w.pod!r}: its members would use {format_bytes(others + target)} "
                                             f"of memory, more than the pod's budget of {format_bytes(budget)}",
                      explanation)


def _shrink(machine: Machine, w: Workload, count: int) -> tuple[Booking, tuple[int, ...]]:
    have = w.booking.cpus
    added = [c for c in w.cpus_added if c in have]
    order = [*reversed(added), *sorted((c for c in have.ids() if c not in set(added)), reverse=True)]
    core_of = {c: core for core in machine.cpu_topology.core_cpus.values() for c in core.ids() if c in have}
    to_give, given = len(have) - count, CpuSet()
    for cpu in order:  # whole cores (the part of each this workload holds) first
        part = core_of.get(cpu, CpuSet([cpu])) & have - given
        if part and len(part) <= to_give - len(given):
            given = given | part
    for cpu in order:  # then single threads, last added first
        if len(given) == to_give:
            break
        given = given | CpuSet([cpu])
    kept = have - given
    return replace(w.booking, cpus=kept), tuple(c for c in w.cpus_added if c in kept)


def _memory(view: AdmissionView, w: Workload, booking: Booking, target: int,
            explanation: dict[str, Any]) -> Booking:
    machine = view.machine
    nodes = booking.memory_group or tuple(sorted(booking.memory))
    if not nodes:
        raise Refusal("not_resizable", f"{w.name} has no memory booking to resize: start it with --memory SIZE")
    amounts = {n: dict(per) for n, per in booking.memory.items()}
    current = booking.memory_total("memory")
    if target > current:
        rest = target - current
        usage = view.memory_usage
        for n in nodes:
            room = free_bytes(machine.memory, usage, n, "memory")
            step = min(rest, room)
            if step > 0:
                amounts.setdefault(n, {})["memory"] = amounts.get(n, {}).get("memory", 0) + step
                rest -= step
        if rest:
            free = sum(free_bytes(machine.memory, usage, n, "memory") for n in nodes)
            raise Refusal("insufficient_memory",
                          f"cannot grow {w.name}'s memory from {format_bytes(current)} to {format_bytes(target)}: "
                          f"{format_bytes(target - current)} more needed, {format_bytes(free)} free on its "
                          f"node(s) {','.join(map(str, nodes))}", explanation)
    else:
        rest = current - target
        for n in reversed(nodes):  # the last node of its group gives back first
            have = amounts.get(n, {}).get("memory", 0)
            step = min(rest, have)
            if step:
                amounts[n]["memory"] = have - step
                rest -= step
    cleaned = {n: {r: v for r, v in per.items() if v} for n, per in amounts.items()}
    return replace(booking, memory={n: per for n, per in cleaned.items() if per})
