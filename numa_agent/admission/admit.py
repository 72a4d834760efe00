"""Admission: request + machine + state -> decision. Pure.

The CPU, memory and device managers each offer topology hints for their part
of the request; the topology manager merges them under the policy and
admits or refuses; the managers then allocate inside the merged NUMA
affinity. The result is a new AgentState and an explanation that says why,
for admissions and refusals alike.

Pods: the first member carries the pod's budget, which is admitted as one
request (pod scope). Members then take exclusive CPUs from the budget or
share what the exclusive members leave, on the pod's NUMA node(s).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from numa_agent.admission.cpu_manager import CpuAllocationError, allocate_cpus, cpu_hints
from numa_agent.admission.device_manager import (
    DeviceAllocationError,
    allocate_devices,
    device_hints,
    device_refusal_reason,
)
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import (
    MemoryAllocation,
    MemoryAllocationError,
    MemoryRequest,
    allocate_memory,
    free_bytes,
    memory_hints,
    usage_from,
)
from numa_agent.admission.topology_manager import decide as merge_decide
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.core.policy import POLICY_NAMES, TopologyPolicy
from numa_agent.state.model import AgentState, Booking, Pod, Workload


class Refusal(Exception):
    """The request cannot be admitted. `code` is a short reason for metrics
    ("topology_affinity_error", "insufficient_cpus", ...), `explanation` the
    full reasoning."""

    def __init__(self, code: str, message: str, explanation: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.explanation = dict(explanation or {})


class InvalidRequest(ValueError):
    """The request can never be valid on this machine (unknown node, CPU...)."""


@dataclass(frozen=True)
class Resources:
    """What one request asks for."""

    cpus: int = 0
    memory_bytes: int = 0
    hugepages: Mapping[int, int] = field(default_factory=dict)  # size kB -> count
    devices: Mapping[str, int] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.cpus or self.memory_bytes or any(self.hugepages.values())
                    or any(self.devices.values()))

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory_bytes": self.memory_bytes,
                "hugepages": {str(k): v for k, v in sorted(self.hugepages.items())},
                "devices": dict(sorted(self.devices.items()))}


@dataclass(frozen=True)
class Request:
    name: str
    owner_uid: int
    resources: Resources = Resources()
    shared: bool = False
    pid: int | None = None
    policy: str | None = None  # overrides the configured topology policy
    physcpubind: CpuSet | None = None
    cpunodebind: tuple[int, ...] | None = None
    membind: tuple[int, ...] | None = None
    pod: str | None = None
    pod_budget: Resources | None = None
    command: tuple[str, ...] = ()
    created_unix: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.resources.to_json(), "shared": self.shared}
        if self.policy:
            out["policy"] = self.policy
        if self.physcpubind is not None:
            out["physcpubind"] = self.physcpubind.format()
        if self.cpunodebind is not None:
            out["cpunodebind"] = list(self.cpunodebind)
        if self.membind is not None:
            out["membind"] = list(self.membind)
        if self.pod_budget is not None:
            out["pod_budget"] = self.pod_budget.to_json()
        return out


@dataclass(frozen=True)
class Decision:
    state: AgentState
    workload: Workload
    pod_created: Pod | None
    explanation: Mapping[str, Any]


# ---------------------------------------------------------------------------
# derived views of (machine, state)


def shared_pool(machine: Machine, state: AgentState) -> CpuSet:
    """CPUs for everything without exclusive CPUs: usable minus every exclusive
    booking (and minus the reserved CPUs under strict-cpu-reservation)."""
    pool = machine.usable_cpus - state.exclusive_cpus()
    if machine.cpu_options.strict_cpu_reservation:
        pool = pool - machine.reserved_cpus
    return pool


def allocatable_cpus(machine: Machine, state: AgentState) -> CpuSet:
    """CPUs that can still become exclusive."""
    return machine.usable_cpus - machine.reserved_cpus - state.exclusive_cpus()


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


def memory_usage(state: AgentState):
    memo = state.memo
    if "memory_usage" not in memo:
        memo["memory_usage"] = usage_from(_as_memory_allocation(b)
                                          for b in state.top_level_bookings() if b.memory)
    return memo["memory_usage"]


def _as_memory_allocation(b: Booking) -> MemoryAllocation:
    return MemoryAllocation(NumaMask(b.memory_group or b.memory.keys()),
                            tuple((n, r, v) for n, per in b.memory.items() for r, v in per.items()))


def _memory_by_node(alloc: MemoryAllocation) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for n, r, v in alloc.amounts:
        out.setdefault(n, {})[r] = v
    return out


# ---------------------------------------------------------------------------
# admission


def decide(machine: Machine, state: AgentState, req: Request) -> Decision:
    """Admit `req` or raise Refusal / InvalidRequest. Never mutates anything."""
    _check_request(machine, req)
    if state.workload(req.name) is not None:
        raise InvalidRequest(f"a workload named {req.name!r} already exists")
    if req.pod is not None:
        return _decide_pod_member(machine, state, req)
    booking, explanation = _book(machine, state, req.resources, req, policy_name=_policy(machine, req))
    w = _workload(req, booking)
    return Decision(state=state.with_workload(w), workload=w, pod_created=None,
                    explanation=explanation)


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


def _check_request(machine: Machine, req: Request) -> None:
    r = req.resources
    if r.cpus < 0 or r.memory_bytes < 0:
        raise InvalidRequest("cpus and memory must not be negative")
    if req.shared and r.cpus:
        raise InvalidRequest("--shared and --cpus exclude each other: shared workloads get no exclusive CPUs")
    if req.shared and req.physcpubind is not None:
        raise InvalidRequest("--shared and --physcpubind exclude each other")
    for key, nodes in (("cpunodebind", req.cpunodebind), ("membind", req.membind)):
        if nodes is not None:
            if not nodes:
                raise InvalidRequest(f"{key}: empty node list")
            unknown = sorted(set(nodes) - set(machine.node_ids))
            if unknown:
                raise InvalidRequest(f"{key}: NUMA node(s) {','.join(map(str, unknown))} do not exist "
                                     f"or are not usable (usable: {','.join(map(str, machine.node_ids))})")
    if req.physcpubind is not None:
        if not req.physcpubind:
            raise InvalidRequest("physcpubind: empty CPU list")
        outside = req.physcpubind - machine.usable_cpus
        if outside:
            raise InvalidRequest(f"physcpubind: CPUs {outside.format()} are not usable on this machine "
                                 f"(usable: {machine.usable_cpus.format()})")
        if r.cpus and r.cpus != len(req.physcpubind):
            raise InvalidRequest(f"--cpus {r.cpus} disagrees with --physcpubind "
                                 f"{req.physcpubind.format()} ({len(req.physcpubind)} CPUs)")
    for resource in r.devices:
        if not machine.devices.has(resource):
            known = ", ".join(machine.devices.names) or "none configured"
            raise InvalidRequest(f"unknown device resource {resource!r} (known: {known})")
    for size_kb in r.hugepages:
        if not any(machine.topology.node(n).hugepage(size_kb) for n in machine.node_ids):
            raise InvalidRequest(f"hugepages of {size_kb}kB do not exist on this machine")
    policy = _policy(machine, req)
    if policy not in POLICY_NAMES:
        raise InvalidRequest(f"unknown topology policy {policy!r}")


def _workload(req: Request, booking: Booking, shared: bool | None = None) -> Workload:
    if shared is None:  # no exclusive CPUs asked for: it runs on the shared pool
        shared = req.shared or (req.resources.cpus == 0 and req.physcpubind is None)
    return Workload(
        name=req.name, owner_uid=req.owner_uid, booking=booking, shared=shared,
        pod=req.pod, pid=req.pid, created_unix=req.created_unix, command=req.command,
        cpunodebind=tuple(req.cpunodebind or ()), request=req.to_json())


def _book(machine: Machine, state: AgentState, res: Resources, req: Request,
          policy_name: str) -> tuple[Booking, dict[str, Any]]:
    """Book `res` against the machine (a workload outside pods, or a pod budget)."""
    available = allocatable_cpus(machine, state)
    if req.cpunodebind is not None:
        available = available & machine.cpus_of_nodes(req.cpunodebind)
    free_view = _free_view(machine, state)
    explanation: dict[str, Any] = {"policy": policy_name, "scope": machine.policy.topology_scope,
                                   "providers": [], "merged": None, "admit": True,
                                   "free": free_view}

    mem_request = MemoryRequest(memory_bytes=res.memory_bytes, hugepages=dict(res.hugepages))
    usage = memory_usage(state)
    in_use = state.devices_in_use()
    static_memory = machine.policy.memory_policy == "static"

    # --- hints from every provider that has a say --------------------------
    providers: list[tuple[str, Mapping[str, Any]]] = []
    cpu_pinned = req.physcpubind is not None or req.cpunodebind is not None
    want_exclusive = res.cpus > 0 and machine.policy.cpu_policy == "static"
    if want_exclusive and not cpu_pinned:
        providers.append(("cpu", {"cpu": cpu_hints(machine.cpu_topology, available, res.cpus,
                                                   machine.cpu_options)}))
    wants_memory = static_memory and (res.memory_bytes > 0 or any(res.hugepages.values()))
    if wants_memory and req.membind is None:
        providers.append(("memory", memory_hints(machine.memory, usage, mem_request, machine.node_ids)))
    device_sets = {}
    for resource, count in sorted(res.devices.items()):
        if count > 0:
            device_sets[resource] = device_hints(machine.devices, in_use, resource, count, machine.node_ids)
    if device_sets:
        providers.append(("devices", device_sets))

    result = merge_decide([p for _, p in providers], machine.node_ids, policy_name,
                          machine.tm_options, machine.distances)
    explanation["providers"] = _provider_summaries(providers, result)
    merged = result.merged
    explanation["merged"] = merged.to_json()
    explanation["admit"] = result.admit
    if not result.admit:
        reason = _topology_reason(machine, state, res, policy_name, merged, free_view)
        explanation["reason"] = reason
        raise Refusal("topology_affinity_error", reason, explanation)
    affinity = merged.mask if merged.mask is not None and merged.mask.count() < len(machine.node_ids) else None
    if policy_name == "none":
        affinity = None

    # --- allocation inside the merged affinity -----------------------------
    cpus = CpuSet()
    if req.physcpubind is not None:
        busy = req.physcpubind - available
        if busy:
            raise Refusal("cpus_busy",
                          f"physcpubind: CPUs {busy.format()} are reserved or exclusively allocated; "
                          f"free for exclusive use: {available.format() or 'none'}", explanation)
        cpus = req.physcpubind
    elif want_exclusive:
        if res.cpus > len(available):
            raise Refusal("insufficient_cpus",
                          f"not enough CPUs: requested {res.cpus}, {len(available)} free for exclusive use"
                          f"{_per_node_cpu_text(machine, available)}", explanation)
        try:
            cpus = allocate_cpus(machine.cpu_topology, available, res.cpus,
                                 NumaMask(req.cpunodebind) if req.cpunodebind else affinity,
                                 machine.cpu_options)
        except CpuAllocationError as exc:
            raise Refusal(exc.reason, str(exc), explanation) from None
    if cpus and not (shared_pool(machine, state) - cpus):
        raise Refusal("shared_pool_empty",
                      f"giving CPUs {cpus.format()} away would leave the shared pool empty; "
                      f"reserve at least one CPU (cpu_manager.reserved_cpu_count)", explanation)

    memory_alloc = None
    if wants_memory:
        mem_affinity = NumaMask(req.membind) if req.membind is not None else affinity
        try:
            memory_alloc = allocate_memory(machine.memory, usage, mem_request, mem_affinity)
        except MemoryAllocationError as exc:
            raise Refusal(exc.reason, str(exc), explanation) from None

    devices: list[tuple[str, str]] = []
    for resource, count in sorted(res.devices.items()):
        if count <= 0:
            continue
        try:
            addrs = allocate_devices(machine.devices, in_use, resource, count, affinity, machine.distances)
        except DeviceAllocationError as exc:
            raise Refusal(exc.reason, str(exc), explanation) from None
        devices.extend((resource, a) for a in addrs)

    if memory_alloc is not None:
        mem_nodes = tuple(sorted({n for n, _, _ in memory_alloc.amounts}))
        mems = tuple(req.membind) if req.membind is not None else mem_nodes
    elif req.membind is not None:
        mems = tuple(req.membind)
    elif cpus:
        mems = _memory_nodes_near(machine, machine.nodes_of(cpus))
    elif req.cpunodebind is not None:
        mems = _memory_nodes_near(machine, tuple(req.cpunodebind))
    elif affinity is not None:
        mems = _memory_nodes_near(machine, affinity.nodes())
    else:
        mems = _memory_nodes_near(machine, machine.node_ids)

    numa_nodes = tuple(sorted(set(machine.nodes_of(cpus)) | set(mems)
                              | {machine.topology.device(a).numa_node for _, a in devices} - {-1}))
    booking = Booking(
        cpus=cpus, numa_nodes=numa_nodes, mems=mems,
        memory={} if memory_alloc is None else _memory_by_node(memory_alloc),
        memory_group=() if memory_alloc is None else memory_alloc.group.nodes(),
        devices=tuple(sorted(devices)))
    explanation["alignment"] = alignment(machine, booking)
    return booking, explanation


def _memory_nodes_near(machine: Machine, nodes) -> tuple[int, ...]:
    """Nodes with memory among `nodes`; a CPU-only view (a node with no memory)
    falls back to the closest nodes that have memory."""
    memory_nodes = machine.memory.memory_nodes
    with_mem = tuple(n for n in nodes if n in memory_nodes)
    if with_mem:
        return tuple(sorted(with_mem))
    candidates = [n for n in machine.node_ids if n in memory_nodes]
    if not candidates:
        return tuple(sorted(nodes))
    best = min(candidates, key=lambda n: (min(machine.distances.get(a, {}).get(n, 255) for a in nodes), n))
    return (best,)


def alignment(machine: Machine, b: Booking) -> dict[str, bool]:
    """Whether a booking sits on one NUMA node, on whole physical cores, in one L3."""
    if not b.cpus:
        return {"numa_node": len(b.numa_nodes) <= 1, "physical_core": False, "l3": False}
    topo = machine.topology
    siblings = 0
    l3s = set()
    for c in b.cpus:
        cpu = topo.cpu(c)
        siblings |= cpu.siblings.bits
        l3s.add(cpu.l3)
    whole_cores = siblings & machine.usable_cpus.bits == b.cpus.bits
    return {"numa_node": len(b.numa_nodes) == 1, "physical_core": whole_cores,
            "l3": len(l3s) == 1 and None not in l3s}


# ---------------------------------------------------------------------------
# pods


def _decide_pod_member(machine: Machine, state: AgentState, req: Request) -> Decision:
    pod = state.pod(req.pod)
    pod_created = None
    explanation: dict[str, Any] = {}
    if pod is None:
        if req.pod_budget is None or req.pod_budget.is_empty():
            raise InvalidRequest(f"pod {req.pod!r} does not exist; its first member must give the pod "
                                 f"budget (--pod-cpus, --pod-memory, --pod-hugepages, --pod-device)")
        budget_req = replace(req, cpunodebind=None, physcpubind=None)
        booking, explanation = _book(machine, state, req.pod_budget, budget_req,
                                     policy_name=_policy(machine, req))
        pod = Pod(name=req.pod, owner_uid=req.owner_uid, booking=booking, members=(),
                  created_unix=req.created_unix, request=req.pod_budget.to_json())
        pod_created = pod
        state = state.with_pod(pod)
    else:
        if req.pod_budget is not None and req.pod_budget.to_json() != dict(pod.request):
            raise InvalidRequest(f"pod {pod.name!r} already exists with budget {dict(pod.request)}; "
                                 f"a later member cannot change it (leave out the --pod-* options)")
        if req.owner_uid != pod.owner_uid and req.owner_uid != 0:
            raise Refusal("forbidden", f"pod {pod.name!r} belongs to uid {pod.owner_uid}")
        explanation = {"policy": "pod-budget", "scope": "pod", "providers": [], "merged": None,
                       "admit": True}
    if req.physcpubind is not None or req.cpunodebind is not None or req.membind is not None:
        raise InvalidRequest("pod members take their CPUs and memory from the pod budget; "
                             "-C/-N/-m cannot be combined with --pod")

    res = req.resources
    members = state.members_of(pod.name)
    shared_part = pod_shared_cpus(state, pod)
    has_shared_members = any(m.shared for m in members)
    explanation = {**explanation, "pod": pod.name, "pod_cpus": pod.booking.cpus.format(),
                   "pod_shared_cpus_before": shared_part.format()}

    cpus = CpuSet()
    if res.cpus > 0:
        if res.cpus > len(shared_part):
            raise Refusal("insufficient_cpus",
                          f"pod {pod.name!r}: requested {res.cpus} exclusive CPUs, only {len(shared_part)} "
                          f"of the pod's {len(pod.booking.cpus)} are not taken by other members", explanation)
        if has_shared_members and res.cpus == len(shared_part):
            raise Refusal("pod_shared_part_empty",
                          f"pod {pod.name!r}: {res.cpus} exclusive CPUs would leave nothing for the members "
                          f"that share the rest ({', '.join(m.name for m in members if m.shared)})",
                          explanation)
        try:
            cpus = allocate_cpus(machine.cpu_topology, shared_part, res.cpus, None, machine.cpu_options)
        except CpuAllocationError as exc:
            raise Refusal("insufficient_cpus", f"pod {pod.name!r}: {exc}", explanation) from None
    elif not shared_part:
        raise Refusal("pod_shared_part_empty",
                      f"pod {pod.name!r}: its exclusive members hold all {len(pod.booking.cpus)} CPUs; "
                      f"nothing is left for a member that shares", explanation)

    # Memory of members is a limit inside the pod's budget, not a new booking.
    budget_memory = pod.booking.memory_total("memory")
    if res.memory_bytes and budget_memory:
        used = sum(int(m.request.get("memory_bytes", 0)) for m in members)
        if used + res.memory_bytes > budget_memory:
            raise Refusal("insufficient_memory",
                          f"pod {pod.name!r}: members would use {used + res.memory_bytes} bytes of memory, "
                          f"more than the pod budget of {budget_memory}", explanation)

    devices: list[tuple[str, str]] = []
    taken = {a for m in members for a in m.booking.device_addresses()}
    for resource, count in sorted(res.devices.items()):
        pool = [a for r, a in pod.booking.devices if r == resource and a not in taken]
        if count > len(pool):
            raise Refusal("insufficient_devices",
                          f"pod {pod.name!r}: requested {count} {resource}, {len(pool)} left in the pod budget",
                          explanation)
        devices.extend((resource, a) for a in pool[:count])

    booking = Booking(cpus=cpus, numa_nodes=pod.booking.numa_nodes, mems=pod.booking.mems,
                      devices=tuple(sorted(devices)))
    w = _workload(req, booking, shared=res.cpus == 0)
    new_state = state.with_workload(w).with_pod(replace(pod, members=tuple(sorted((*pod.members, w.name)))))
    explanation["alignment"] = alignment(machine, pod.booking)
    return Decision(state=new_state, workload=w, pod_created=pod_created, explanation=explanation)


# ---------------------------------------------------------------------------
# explanations


def _free_view(machine: Machine, state: AgentState) -> dict[str, dict[str, int]]:
    available = allocatable_cpus(machine, state)
    usage = memory_usage(state)
    out = {}
    for n in machine.node_ids:
        out[str(n)] = {"cpus": len(available & machine.cpus_of_nodes((n,))),
                       "memory_bytes": free_bytes(machine.memory, usage, n, "memory")}
    return out


def _provider_summaries(providers, result) -> list[dict[str, Any]]:
    names = [name for name, _ in providers]
    return [{**dict(summary), "provider": names[summary.provider]}
            for summary in result.provider_summaries]


def _per_node_cpu_text(machine: Machine, available: CpuSet) -> str:
    parts = [f"node {n}: {len(available & machine.cpus_of_nodes((n,)))}" for n in machine.node_ids]
    return " (" + ", ".join(parts) + ")" if len(parts) > 1 else ""


def _topology_reason(machine, state, res, policy_name, merged, free_view) -> str:
    parts = []
    if res.cpus:
        per_node = [v["cpus"] for v in free_view.values()]
        parts.append(f"{res.cpus} CPUs requested; {sum(per_node)} free, but at most "
                     f"{max(per_node, default=0)} on one NUMA node")
    if res.memory_bytes:
        per_node = [v["memory_bytes"] for v in free_view.values()]
        parts.append(f"{res.memory_bytes} bytes of memory requested; at most {max(per_node, default=0)} "
                     f"free on one NUMA node")
    for resource, count in sorted(res.devices.items()):
        why = device_refusal_reason(machine.devices, state.devices_in_use(), resource, count)
        if why:
            parts.append(why)
    what = "; ".join(parts) or "the providers' hints do not agree on a NUMA node set"
    rule = TopologyPolicy(policy_name).rule
    if merged.mask is None:
        merged_text = "merged hint: none (no NUMA node set satisfies every provider)"
    else:
        merged_text = f"merged hint {{{merged.mask.format()}}} {'preferred' if merged.preferred else 'not preferred'}"
    return f"TopologyAffinityError: {what}; {merged_text}; {rule}".rstrip("; ")
