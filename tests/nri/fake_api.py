"""A fake `AgentApi` for the NRI handler's tests and benchmark: the real pure
admission core (decide, release, resize) over a real Machine and AgentState,
without the service's checkpoint, enforcement or lock. It records the calls."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import msgspec

from numa_agent.admission.admit import Refusal, decide, effective_cpus
from numa_agent.admission.admit import release as release_workload
from numa_agent.admission.machine import Machine, PolicyConfig, build_machine
from numa_agent.admission.resize import resize as resize_workload
from numa_agent.core.caller import Caller
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.service.cases.refusal import refused
from numa_agent.service.refusals import InConflict, UnknownWorkload
from numa_agent.service.requests import to_admission_request
from numa_agent.state.model import AgentState, Workload
from tests.support.synthetic import make_topology


def make_machine(policy: str = "best-effort", scope: str = "container", nodes: int = 2,
                 cores_per_node: int = 4, memory_policy: str = "static") -> Machine:
    """2 nodes x 4 cores x 2 threads, 8 GiB a node (CPU 0's core reserved by default)."""
    topo = make_topology(sockets=nodes, cores_per_node=cores_per_node, threads_per_core=2,
                         memory_per_node_bytes=8 << 30)
    return build_machine(topo, PolicyConfig(topology_policy=policy, topology_scope=scope,
                                             memory_policy=memory_policy))


@dataclass
class FakeApi:
    machine: Machine = field(default_factory=make_machine)
    state: AgentState = field(default_factory=AgentState)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    ready: bool = True
    by_request_id: dict[str, str] = field(default_factory=dict)  # as the service's index

    def view(self) -> tuple[Machine, AgentState] | None:
        return (self.machine, self.state) if self.ready else None

    def admit(self, request: Any, caller: Caller, dry_run: bool = False) -> dict[str, Any]:
        self.calls.append(("admit", request))
        assert caller.uid == 0 and caller.pid == os.getpid()
        replayed = self.state.workload(self.by_request_id.get(request.request_id or "", ""))
        if replayed is not None and replayed.request.get("request_id") == request.request_id:
            return self._answer(replayed)
        if self.state.workload(request.name) is not None:
            raise InConflict(f"a workload named {request.name!r} already exists")
        req = to_admission_request(request, caller, name=request.name, created_unix=0.0)
        try:
            decision = decide(self.machine, self.state, req)
        except Refusal as e:
            raise refused(e) from None
        fields = msgspec.structs.asdict(decision.workload)
        fields["request"] = {**decision.workload.request, "request_id": request.request_id}
        fields["runtime"] = request.runtime
        w = Workload(**fields)
        self.state = decision.state.with_workload(w)
        self.by_request_id[request.request_id] = w.name
        return self._answer(w)

    def release(self, name: str, caller: Caller | None, reason: str = "requested",
                request_id: str | None = None) -> dict[str, Any]:
        self.calls.append(("release", name))
        w = self.state.workload(name)
        if w is None or (request_id is not None and w.request.get("request_id") not in (None, request_id)):
            raise UnknownWorkload(f"no workload named {name!r}")
        self.state, _, pod = release_workload(self.state, name)
        return {"name": name, "released": True, "reason": reason, "pod_released": pod.name if pod else None}

    def resize(self, name: str, caller: Caller, cpus: int | None = None,
               memory_bytes: int | None = None) -> dict[str, Any]:
        self.calls.append(("resize", (name, cpus, memory_bytes)))
        try:
            decision = resize_workload(self.machine, self.state, name, cpus=cpus, memory_bytes=memory_bytes)
        except Refusal as e:
            raise refused(e) from None
        self.state = decision.state
        return self._answer(decision.workload)

    def _answer(self, w: Workload) -> dict[str, Any]:
        return {"name": w.name, "cpus": effective_cpus(self.machine, self.state, w).format(),
                "mems": list(w.booking.mems), "pod": w.pod}

    def names(self, kind: str) -> list[Any]:
        return [arg for call, arg in self.calls if call == kind]


# ------------------------------------------------------------------ NRI messages
def cid(n: int) -> str:
    """A 64-hex container id."""
    return f"{n:02x}" * 32


def sandbox(n: int, qos: str | None = "guaranteed", annotations: dict[str, str] | None = None,
            pod_resources: api.LinuxResources | None = None, systemd: bool = False) -> api.PodSandbox:
    """A pod whose cgroup parent says `qos` (None: outside kubepods)."""
    uid = f"uid-{n}"
    if qos is None:
        parent = "/system.slice/other"
    elif systemd:
        level = "" if qos == "guaranteed" else f"-{qos}"
        parent = f"kubepods{level}-pod{uid.replace('-', '_')}.slice"
    else:
        parent = "/kubepods" + ("" if qos == "guaranteed" else f"/{qos}") + f"/pod{uid}"
    linux = api.LinuxPodSandbox(cgroup_parent=parent)
    if pod_resources is not None:
        linux.pod_resources.CopyFrom(pod_resources)
    return api.PodSandbox(id=f"{n:02x}" * 32, name=f"pod{n}", namespace="default", uid=uid,
                          annotations=annotations or {}, linux=linux)


def resources(cpus: float | None = None, memory: int | None = None, shares: int | None = -1,
              period: int | None = 100_000, hugepages: dict[str, int] | None = None) -> api.LinuxResources:
    """Linux resources as the kubelet writes them: `cpus` as the CFS quota over
    `period`; shares = cpus * 1024 unless given (None: absent)."""
    cpu = api.LinuxCPU()
    if cpus is not None:
        cpu.quota.value = int(cpus * (period or 100_000))
    if period is not None:
        cpu.period.value = period
    if shares == -1 and cpus is not None:
        shares = int(cpus * 1024)
    if shares is not None and shares != -1:
        cpu.shares.value = shares
    out = api.LinuxResources(cpu=cpu, hugepage_limits=[api.HugepageLimit(page_size=k, limit=v)
                                                       for k, v in (hugepages or {}).items()])
    if memory is not None:
        out.memory.limit.value = memory
    return out


def container(n: int, pod: api.PodSandbox, res: api.LinuxResources | None = None, name: str = "app",
              state: int = api.CONTAINER_RUNNING, cpus: str = "") -> api.Container:
    c = api.Container(id=cid(n), pod_sandbox_id=pod.id, name=name, state=state,
                      linux=api.LinuxContainer(resources=res or resources()))
    if cpus:
        c.linux.resources.cpu.cpus = cpus
    return c


def create(pod: api.PodSandbox, ctr: api.Container) -> api.CreateContainerRequest:
    return api.CreateContainerRequest(pod=pod, container=ctr)
