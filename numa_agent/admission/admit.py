"""Admission: request + machine + state -> decision. Pure.

One path for every request: the registered providers (``registry.PROVIDERS``:
CPU, memory, devices) each offer topology hints for their part of the
request; the topology manager merges them under the policy and admits or
refuses; every provider then allocates its part inside the merged NUMA
affinity, and the parts combine into one Booking. The result is a new
AgentState and an explanation that says why, for admissions and refusals
alike.

Pods: the first member carries the pod's budget, which is admitted as one
request (pod scope). Members then take exclusive CPUs from the budget or
share what the exclusive members leave, on the pod's NUMA node(s): the same
providers allocate, from the pod's budget instead of the machine (no merge:
the budget was merged once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from numa_agent.admission.allocation_score import resource_figures, tie_rank
from numa_agent.admission.errors import AllocationError, HugepagesNotFreeError, NodeFencedError
from numa_agent.admission.explanation import Explanation, PodPart, ProviderHints, Topology
from numa_agent.admission.keep import added_nodes, gives_back_only
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import KernelHugepages, hugepages_short
from numa_agent.admission.provider import NOTHING, Allocation, HintProvider
from numa_agent.admission.registry import PROVIDERS
from numa_agent.admission.request import Request, Resources, describe_amounts
from numa_agent.admission.topology_manager import NOT_CHECKED, MergeResult, merge_hints
from numa_agent.admission.view import (
    AdmissionView,
    allocatable_cpus,
    effective_cpus,
    memory_usage,
    pod_shared_cpus,
    shared_pool,
)
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask
from numa_agent.core.policy import POLICY_NAMES, STRATEGY_NAMES, AllocationStrategy, TopologyPolicy
from numa_agent.core.units import format_bytes, page_size_text
from numa_agent.state.model import AgentState, Booking, Pod, Workload, replace

__all__ = [
    "Decision", "InvalidRequest", "PROVIDERS", "Refusal", "Request", "Resources",
    "alignment", "alignment_guaranteed", "allocatable_cpus", "decide", "effective_cpus", "memory_usage",
    "pod_shared_cpus", "release", "shared_pool",
]


class Refusal(Exception):
    """The request cannot be admitted. `code` is a short reason for metrics
    ("topology_affinity_error", "insufficient_cpus", ...), `explanation` the
    full reasoning, whose "admit" (the outcome) is false whatever the
    topology manager's verdict was. `provider` names the provider whose
    allocation failed (None: refused before any allocation), `pinned` the
    providers that had allocated their part before it (the kubelet's managers
    count both as pinning requests)."""

    def __init__(self, code: str, message: str, explanation: Explanation | None = None,
                 provider: str | None = None, pinned: frozenset[str] = frozenset()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.explanation = Explanation(admit=False) if explanation is None else explanation.refused()
        self.provider = provider
        self.pinned = pinned

    def explained(self, explanation: Explanation, message: str | None = None) -> Refusal:
        """The same refusal with `explanation` (and `message`, when given)."""
        return Refusal(self.code, self.message if message is None else message, explanation,
                       provider=self.provider, pinned=self.pinned)


class InvalidRequest(ValueError):
    """The request can never be valid on this machine (unknown node, CPU...)."""


@dataclass(frozen=True)
class Decision:
    state: AgentState
    workload: Workload
    pod_created: Pod | None
    explanation: Explanation
    # The providers whose part of the booking holds something (a pod's budget included).
    pinned: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------
# admission

Providers = Sequence[HintProvider]


def decide(machine: Machine, state: AgentState, req: Request,
           providers: Providers = PROVIDERS, *, explain: bool = False,
           kernel: KernelHugepages | None = None) -> Decision:
    """Admit `req` or raise Refusal / InvalidRequest. Never mutates anything.
    `providers` defaults to the registered ones. A refusal's explanation is whole;
    an admission's adds the free resources and every provider's hints only when
    `explain` (a dry run, `numa-agent explain`): an admission does not pay for them.
    `kernel`: the kernel's hugepage counters read for this request (see
    `_book`); None: the bookings alone say what is free."""
    _check_request(machine, req)
    if state.workload(req.name) is not None:
        raise InvalidRequest(f"a workload named {req.name!r} already exists")
    if req.pod is not None:
        return _decide_pod_member(machine, state, req, req.pod, providers, explain, kernel)
    keeps = None if req.keep is None else req.keep.booking
    booking, explanation, pinned = _book(AdmissionView(machine, state, kernel=kernel, keeps=keeps), req,
                                         _policy(machine, req), providers, explain)
    w = _workload(req, booking)
    return Decision(state=state.with_workload(w), workload=w, pod_created=None,
                    explanation=explanation, pinned=pinned)


def release(state: AgentState, name: str) -> tuple[AgentState, Workload, Pod | None]:
    """Remove a workload; a pod's budget goes with its last member."""
    w = state.workload(name)
    if w is None:
        raise KeyError(name)
    new = state.without_workload(name)
    released_pod = None
    if w.pod is not None:
        pod = new.pod(w.pod)
        if pod is not None:
            members = tuple(m for m in pod.members if m != name)
            if members:
                new = new.with_pod(replace(pod, members=members))
            else:
                new = new.without_pod(pod.name)
                released_pod = pod
    return new, w, released_pod


def _policy(machine: Machine, req: Request) -> str:
    return req.policy or machine.policy.topology_policy


def _strategy(machine: Machine, req: Request) -> AllocationStrategy:
    if req.numa_allocation_strategy:
        return AllocationStrategy(req.numa_allocation_strategy)
    return machine.tm_options.numa_allocation_strategy


def _tie_break(strategy: AllocationStrategy, tie, asked, machine: Machine, policy_name: str,
               chosen: NumaMask) -> dict[str, Any]:
    """What the numa-allocation-strategy did: the chosen set's score and, when it
    broke a tie, the set the lowest-mask rule would have taken and its score."""
    sign = 1 if strategy is AllocationStrategy.LEAST_ALLOCATED else -1
    out: dict[str, Any] = {"strategy": strategy.value, "nodes": list(chosen.nodes()),
                           "score": sign * tie(chosen.bits)}
    plain = merge_hints([hints for _, hints in asked], machine.node_ids, policy_name,
                         machine.tm_options, machine.distances, closeness=machine.closeness).merged.mask
    if plain is not None and plain != chosen:
        out["instead_of"] = list(plain.nodes())
        out["instead_of_score"] = sign * tie(plain.bits)
    return out


def _check_request(machine: Machine, req: Request) -> None:
    r = req.resources
    if r.cpus < 0 or r.memory_bytes < 0:
        raise InvalidRequest("cpus and memory must not be negative")
    if req.shared and r.cpus:
        raise InvalidRequest("--shared and --cpus exclude each other: shared workloads get no exclusive CPUs")
    if req.shared and req.physcpubind is not None:
        raise InvalidRequest("--shared and --physcpubind exclude each other")
    _check_node_lists(machine, req)
    if req.physcpubind is not None:
        _check_physcpubind(machine, req.physcpubind, r.cpus)
    _check_resource_names(machine, r)
    policy = _policy(machine, req)
    if policy not in POLICY_NAMES:
        raise InvalidRequest(f"unknown topology policy {policy!r}")
    strategy = req.numa_allocation_strategy
    if strategy is not None and strategy not in STRATEGY_NAMES:
        raise InvalidRequest(f"unknown numa-allocation-strategy {strategy!r}; expected one of "
                             f"{', '.join(STRATEGY_NAMES)}")


def _check_node_lists(machine: Machine, req: Request) -> None:
    for key, nodes in (("cpunodebind", req.cpunodebind), ("membind", req.membind)):
        if nodes is None:
            continue
        if not nodes:
            raise InvalidRequest(f"{key}: empty node list")
        unknown = sorted(set(nodes) - set(machine.node_ids))
        if unknown:
            raise InvalidRequest(f"{key}: NUMA node(s) {','.join(map(str, unknown))} do not exist "
                                 f"or are not usable (usable: {','.join(map(str, machine.node_ids))})")
    if req.membind is not None:
        # A usable node without memory (its CPUs use another node's) cannot be
        # written into cpuset.mems: the kernel refuses it.
        memory_nodes = machine.memory.memory_nodes
        memoryless = sorted(n for n in req.membind if n not in memory_nodes)
        if memoryless:
            raise InvalidRequest(f"membind: NUMA node(s) {','.join(map(str, memoryless))} have no memory "
                                 f"(nodes with memory: {memory_nodes.format() or 'none'})")


def _check_physcpubind(machine: Machine, physcpubind: CpuSet, cpus: int) -> None:
    if not physcpubind:
        raise InvalidRequest("physcpubind: empty CPU list")
    outside = physcpubind - machine.usable_cpus
    if outside:
        raise InvalidRequest(f"physcpubind: CPUs {outside.format()} are not usable on this machine "
                             f"(usable: {machine.usable_cpus.format()})")
    if cpus and cpus != len(physcpubind):
        raise InvalidRequest(f"--cpus {cpus} disagrees with --physcpubind "
                             f"{physcpubind.format()} ({len(physcpubind)} CPUs)")


def _check_resource_names(machine: Machine, r: Resources) -> None:
    for resource in r.devices:
        if not machine.devices.has(resource):
            known = ", ".join(machine.devices.names) or "none configured"
            raise InvalidRequest(f"unknown device resource {resource!r} (known: {known})")
    sizes = machine.hugepage_sizes_kb
    for size_kb in r.hugepages:
        if size_kb not in sizes:
            known = ", ".join(page_size_text(kb) for kb in sorted(sizes)) or "none"
            raise InvalidRequest(f"hugepages of {page_size_text(size_kb)} do not exist on this machine "
                                 f"(its page sizes: {known})")


def _workload(req: Request, booking: Booking, shared: bool | None = None) -> Workload:
    if shared is None:  # no exclusive CPUs asked for: it runs on the shared pool
        shared = req.shared or (req.resources.cpus == 0 and req.physcpubind is None)
    return Workload(
        name=req.name, owner_uid=req.owner_uid, booking=booking, shared=shared,
        pod=req.pod, pid=req.pid, pid_identity=req.pid_identity, created_unix=req.created_unix,
        command=req.command,
        cpunodebind=tuple(req.cpunodebind or ()), request=req.to_json(), cgroup=req.cgroup)


def _book(view: AdmissionView, req: Request, policy_name: str, providers: Providers,
          explain: bool = False) -> tuple[Booking, Explanation, frozenset[str]]:
    """Book `req.resources` against the machine (a workload outside pods, or
    a pod budget): hints from every provider, the merge, then every
    provider's allocation inside the merged affinity. The free resources and
    the providers' hints join the explanation of a refusal, or when `explain`."""
    explanation = Explanation(admit=True, topology=_topology(policy_name, view.machine.policy.topology_scope),
                              requested=req.resources.to_json())
    merged: list[_Merged] = []  # what _merge asked and decided, for the details
    try:
        booking, pinned, explanation = _book_parts(view, req, policy_name, providers, explanation, merged)
    except Refusal as exc:
        refusal = exc.explained(_details(exc.explanation, view, merged))
        if view.kernel is not None:
            _refuse_if_pages_taken(view, req, policy_name, providers, refusal)
        raise refusal from None
    if explain:
        explanation = _details(explanation, view, merged)
    return booking, explanation.but(alignment=alignment(view.machine, booking)), pinned


# The providers' hints as the merge was given them (name, hints) and its result.
_Merged = tuple[list[tuple[str, Mapping[str, HintSet]]], MergeResult]


def _details(explanation: Explanation, view: AdmissionView, merged: Sequence[_Merged]) -> Explanation:
    """`explanation` with its costly part: what was free before, every provider's hints."""
    return explanation.but(free=view.free,
                   providers=_provider_summaries(*merged[0]) if merged else explanation.providers)


def _book_parts(view: AdmissionView, req: Request, policy_name: str, providers: Providers,
                explanation: Explanation, merged: list[_Merged]) -> tuple[Booking, frozenset[str], Explanation]:
    machine = view.machine
    fenced = view.fenced_nodes
    keep = req.keep
    if keep is not None and gives_back_only(keep, req.resources, machine.policy.memory_policy == "static"):
        # Giving back is always allowed: the fence holds off only what is added, and a
        # placement the policy would no longer merge (its nodes shrank, the policy
        # changed, -m apart from its CPUs) still gives back from what it holds.
        try:
            affinity, explanation = _merge(view, req, policy_name, providers, explanation, merged)
        except Refusal as exc:
            if exc.code != "topology_affinity_error":
                raise
            affinity = None  # the shrink is taken from what it holds, wherever that is
        booking, pinned = _allocate(view, req, affinity, providers, explanation)
        return booking, pinned, explanation
    if not fenced:
        affinity, explanation = _merge(view, req, policy_name, providers, explanation, merged)
        booking, pinned = _allocate(view, req, affinity, providers, explanation)
    else:
        explanation = explanation.but(fenced_nodes=tuple(fenced))
        asked = set(req.cpunodebind or ()) | set(req.membind or ())
        if req.physcpubind is not None:
            asked.update(machine.nodes_of(req.physcpubind))
        if keep is not None and req.resources.memory_bytes > keep.booking.memory_total("memory"):
            asked.update(keep.booking.memory_group or keep.booking.memory)  # memory grows where it is
        _refuse_fenced(view, asked, explanation)
        try:
            affinity, explanation = _merge(view, req, policy_name, providers, explanation, merged)
            booking, pinned = _allocate(view, req, affinity, providers, explanation)
        except Refusal as exc:  # the fence may be why: say so
            raise exc.explained(exc.explanation, f"{exc.message}; {fenced_text(view)}") from None
        # The providers steer clear of fenced nodes; this holds whatever they chose. A
        # resize answers for what it adds: what it keeps there is its own already.
        lands = added_nodes(keep, booking, machine.nodes_of) if keep is not None else \
            {*machine.nodes_of(booking.cpus), *booking.memory, *booking.memory_group}
        _refuse_fenced(view, lands, explanation, pinned)
    return booking, pinned, explanation


def _refuse_if_pages_taken(view: AdmissionView, req: Request, policy_name: str, providers: Providers,
                           refusal: Refusal) -> None:
    """A request refused while the kernel's hugepage counters cut what was free:
    when the bookings alone would have admitted it, the pages taken outside the
    agent are why, and the refusal says where and how many (the kubelet's
    memory manager refuses so when the OS reports too few free hugepages).
    Decided again only on a refusal: an admission costs one decision."""
    kernel = view.kernel
    assert kernel is not None
    if not any(req.resources.hugepages.values()):
        return
    plain = AdmissionView(view.machine, view.state, pod=view.pod, keeps=view.keeps)
    try:
        booking, _, _ = _book_parts(plain, req, policy_name, providers, Explanation(admit=True), [])
    except Refusal:
        return  # refused whatever the kernel says: the first reason stands
    short = hugepages_short(kernel, view.memory_usage,
                            ((n, r, b) for n, per in booking.memory.items() for r, b in per.items()))
    if not short:
        return
    message = (f"{'; '.join(s.text() for s in short)} (the kernel's free pages less reserved ones and "
               f"those booked workloads have not yet used: the rest were taken outside the agent)")
    explanation = refusal.explanation.but(reason=message,
                          hugepages_short=tuple({"node": s.node, "page_size_bytes": s.size_kb << 10,
                                                 "free_pages": s.free_pages, "requested_pages": s.requested_pages,
                                                 "missing_pages": s.missing_pages} for s in short))
    raise Refusal(HugepagesNotFreeError.reason, message, explanation, provider="memory",
                  pinned=refusal.pinned) from None


def fenced_text(view: AdmissionView) -> str:
    """Why the fenced nodes take no new admission, with the figures."""
    nodes = ",".join(map(str, view.fenced_nodes))
    short = ", ".join(f"node {n} {r}: {format_bytes(booked)} booked, {format_bytes(allocatable)} allocatable"
                      for n, r, booked, allocatable in view.shortfalls)
    return (f"NUMA node(s) {nodes} take no new admission: more memory is booked there than they "
            f"have now ({short}); they do again once their memory comes back or workloads there leave")


def _refuse_fenced(view: AdmissionView, nodes: set[int], explanation: Explanation,
                   pinned: frozenset[str] = frozenset()) -> None:
    """The memory manager's refusal, as the kubelet's managers count it: the node's memory is why."""
    if nodes & set(view.fenced_nodes):
        raise Refusal(NodeFencedError.reason, fenced_text(view), explanation, provider="memory", pinned=pinned)


def _merge(view: AdmissionView, req: Request, policy_name: str, providers: Providers,
           explanation: Explanation, merged_out: list[_Merged]) -> tuple[NumaMask | None, Explanation]:
    """The merged NUMA affinity (None: no restriction) and `explanation` with the
    merge, or a topology refusal; the merge's result is appended to `merged_out`
    for the explanation's details."""
    machine = view.machine
    asked: list[tuple[str, Mapping[str, HintSet]]] = []
    for provider in providers:
        hints = provider.hints(req, view)
        if hints is not None:
            asked.append((provider.name, hints))
    strategy = _strategy(machine, req)
    # The figures are read only under a strategy: `none`, the default, costs nothing.
    tie = None if strategy is AllocationStrategy.NONE else tie_rank(
        strategy, [[resource_figures(view, name, r) for r in hints] for name, hints in asked])
    result = merge_hints([hints for _, hints in asked], machine.node_mask, policy_name,
                          machine.tm_options, machine.distances, tie=tie, closeness=machine.closeness)
    merged_out.append((asked, result))
    merged = result.merged
    explanation = explanation.but(merged=merged,
                          topology=_topology(policy_name, machine.policy.topology_scope, result.verdict),
                          tie_break=_tie_break(strategy, tie, asked, machine, policy_name, merged.mask)
                          if tie is not None and merged.mask is not None else explanation.tie_break)
    if not result.admit:
        reason = _topology_reason(view, req, providers, policy_name, result)
        raise Refusal("topology_affinity_error", reason, explanation.but(reason=reason))
    if policy_name == "none" or merged.mask is None or merged.mask.count() >= len(machine.node_ids):
        return None, explanation
    return merged.mask, explanation


def _allocate(view: AdmissionView, req: Request, affinity: NumaMask | None, providers: Providers,
              explanation: Explanation,
              pinned: frozenset[str] = frozenset()) -> tuple[Booking, frozenset[str]]:
    """Every provider's part, in registration order, combined into one Booking; and
    `pinned` with the providers whose part holds something."""
    parts: list[Allocation] = []
    for provider in providers:
        try:
            part = provider.allocate(req, view, affinity)
        except AllocationError as exc:
            raise Refusal(exc.reason, str(exc), explanation, provider=provider.name, pinned=pinned) from None
        parts.append(part)
        if part != NOTHING:
            pinned = pinned | {provider.name}
    return _combine(view, req, affinity, parts), pinned


def _combine(view: AdmissionView, req: Request, affinity: NumaMask | None,
             parts: Sequence[Allocation]) -> Booking:
    cpu_bits = 0
    devices: list[tuple[str, str]] = []
    extra_nodes: set[int] = set()
    group: set[int] = set()
    memory: dict[int, dict[str, int]] = {}
    mems: tuple[int, ...] | None = None
    for part in parts:
        cpu_bits |= part.cpus.bits
        devices.extend(part.devices)
        extra_nodes.update(part.numa_nodes)
        group.update(part.memory_group)
        for n, r, v in part.memory:
            per_node = memory.setdefault(n, {})
            per_node[r] = per_node.get(r, 0) + v
        if mems is None:
            mems = part.mems
    cpus = CpuSet.from_bits(cpu_bits)
    if view.pod is not None:  # a pod member lives on its pod's nodes
        pod_booking = view.pod.booking
        return Booking(cpus=cpus, numa_nodes=pod_booking.numa_nodes, mems=pod_booking.mems,
                       devices=tuple(sorted(devices)))
    machine = view.machine
    if mems is None:
        mems = _memory_nodes_near(machine, _mems_source(machine, req, cpus, affinity))
    numa_nodes = tuple(sorted(set(machine.nodes_of(cpus)) | set(mems) | extra_nodes))
    return Booking(cpus=cpus, numa_nodes=numa_nodes, mems=mems, memory=memory,
                   memory_group=tuple(sorted(group)), devices=tuple(sorted(devices)))


def _mems_source(machine: Machine, req: Request, cpus: CpuSet, affinity: NumaMask | None) -> Sequence[int]:
    """The nodes whose memory a booking uses when no provider decided its mems."""
    if cpus:
        return machine.nodes_of(cpus)
    if req.cpunodebind is not None:
        return tuple(req.cpunodebind)
    if affinity is not None:
        return affinity.nodes()
    return machine.ordinary_node_ids


def _memory_nodes_near(machine: Machine, nodes) -> tuple[int, ...]:
    """Nodes with memory among `nodes`, memory-only nodes left out (no provider
    named them); a CPU-only view (a node with no memory) falls back to the
    closest nodes that have memory."""
    memory_nodes = machine.memory.memory_nodes
    held = machine.explicit_nodes
    with_mem = tuple(n for n in nodes if n in memory_nodes and n not in held)
    if with_mem:
        return tuple(sorted(with_mem))
    candidates = [n for n in machine.ordinary_node_ids if n in memory_nodes]
    if not candidates:
        return tuple(sorted(nodes))
    best = min(candidates, key=lambda n: (min(machine.distances.get(a, {}).get(n, 255) for a in nodes), n))
    return (best,)


def alignment_guaranteed(explanation: Mapping[str, Any]) -> bool:
    """The kubelet's IsAlignmentGuaranteed: the request was merged (not a later pod member,
    which takes its pod's budget) under single-numa-node, which admits only on one node."""
    if isinstance(explanation, Explanation):
        return explanation.topology is not None and explanation.topology.policy == "single-numa-node"
    return (explanation.get("topology") or {}).get("policy") == "single-numa-node"


def alignment(machine: Machine, b: Booking) -> dict[str, bool]:
    """Whether a booking sits on one NUMA node, on whole physical cores, in one L3."""
    if not b.cpus:
        return {"numa_node": len(b.numa_nodes) <= 1, "physical_core": False, "l3": False}
    of_cpu = machine.siblings_and_l3
    siblings = 0
    l3s = set()
    for c in b.cpus:
        cpu_siblings, l3 = of_cpu[c]
        siblings |= cpu_siblings
        l3s.add(l3)
    whole_cores = siblings & machine.usable_cpus.bits == b.cpus.bits
    return {"numa_node": len(b.numa_nodes) == 1, "physical_core": whole_cores,
            "l3": len(l3s) == 1 and None not in l3s}


# ---------------------------------------------------------------------------
# pods


def _decide_pod_member(machine: Machine, state: AgentState, req: Request, pod_name: str,
                       providers: Providers, explain: bool = False,
                       kernel: KernelHugepages | None = None) -> Decision:
    pod = state.pod(pod_name)
    pod_created = None
    pinned: frozenset[str] = frozenset()
    if pod is None:
        if req.pod_budget is None or req.pod_budget.is_empty():
            raise InvalidRequest(f"pod {req.pod!r} does not exist; its first member must give the pod "
                                 f"budget (--pod-cpus, --pod-memory, --pod-hugepages, --pod-device)")
        budget_req = replace(req, resources=req.pod_budget, cpunodebind=None, physcpubind=None)
        booking, explanation, pinned = _book(AdmissionView(machine, state, kernel=kernel), budget_req,
                                             _policy(machine, req), providers, explain)
        pod = Pod(name=pod_name, owner_uid=req.owner_uid, booking=booking, members=(),
                  created_unix=req.created_unix, request=req.pod_budget.to_json())
        pod_created = pod
        state = state.with_pod(pod)
    else:
        if req.pod_budget is not None and req.pod_budget.to_json() != dict(pod.request):
            raise InvalidRequest(f"pod {pod.name!r} already exists with a budget of "
                                 f"{describe_amounts(pod.request)}, not {describe_amounts(req.pod_budget.to_json())}: "
                                 f"a later member cannot change it (leave out the --pod-* options)")
        if req.owner_uid != pod.owner_uid and req.owner_uid != 0:
            raise Refusal("forbidden", f"pod {pod.name!r} belongs to uid {pod.owner_uid}")
        # Not merged again: a member takes from the budget its pod was aligned for.
        explanation = Explanation(admit=True, topology=_topology("pod-budget", "pod"), providers=())
    if req.physcpubind is not None or req.cpunodebind is not None or req.membind is not None:
        raise InvalidRequest("pod members take their CPUs and memory from the pod budget; "
                             "-C/-N/-m cannot be combined with --pod")

    view = AdmissionView(machine, state, pod=pod)
    explanation = explanation.but(requested=req.resources.to_json(),
                          pod=PodPart(pod.name, dict(pod.request), pod.booking.cpus.format(),
                                      view.pod_shared_cpus.format()))
    booking, pinned = _allocate(view, req, None, providers, explanation, pinned)
    w = _workload(req, booking, shared=req.resources.cpus == 0)
    new_state = state.with_workload(w).with_pod(replace(pod, members=tuple(sorted((*pod.members, w.name)))))
    explanation = explanation.but(alignment=alignment(machine, pod.booking))
    return Decision(state=new_state, workload=w, pod_created=pod_created, explanation=explanation,
                    pinned=pinned)


# ---------------------------------------------------------------------------
# explanations


def _topology(policy: str, scope: str, verdict: str = NOT_CHECKED) -> Topology:
    return Topology(policy, scope, verdict)


def _provider_summaries(asked: Sequence[tuple[str, Any]], result: MergeResult) -> tuple[ProviderHints, ...]:
    names = [name for name, _ in asked]
    return tuple(ProviderHints(names[summary.provider], summary) for summary in result.provider_summaries)


def _topology_reason(view: AdmissionView, req: Request, providers: Providers, policy_name: str,
                     result: MergeResult) -> str:
    parts = [why for provider in providers if (why := provider.refusal_reason(req, view))]
    what = "; ".join(parts) or "the providers' hints do not agree on a NUMA node set"
    rule = TopologyPolicy(policy_name).rule
    merged = result.merged
    if merged.mask is None:
        # The kubelet's "any" hint: no NUMA node set satisfies every provider.
        merged_text = "merged hint: any, not preferred (no NUMA node set satisfies every provider)"
    else:
        merged_text = f"merged hint {{{merged.mask.format()}}} {'preferred' if merged.preferred else 'not preferred'}"
    return f"TopologyAffinityError: {what}; {merged_text}; {rule}".rstrip("; ")
