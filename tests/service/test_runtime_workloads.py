"""Containers a runtime enforces (NRI, `AdmitRequest.runtime`): booked as any
admission, but the agent makes no cgroup for them, moves no process, follows
none, and keeps them until released by name, across its own restart. Their
exclusive CPUs still leave the shared pool. On the simulated cgroup tree of an
agent started as the daemon starts it."""

from __future__ import annotations

import os

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon.runtime import _workload_at
from numa_agent.enforcement.plan import SHARED_CGROUP
from numa_agent.enforcement.processes import process_identity
from numa_agent.observe.watcher import guarded_of
from numa_agent.service.refusals import InvalidInput, NotPermitted
from numa_agent.service.requests import AdmitRequest, PodBudget, RuntimeRef
from tests.service.test_engine_cgroup import Machine, root_caller
from tests.service.test_release_revoked import Agent as AffinityAgent
from tests.service.test_release_revoked import M, needs_two

REQUEST_ID = "0123456789abcdef0123456789abcdef"


def ref(container_id="c0ffee01", pod="web-0", container="app") -> RuntimeRef:
    return RuntimeRef(runtime="nri", container_id=container_id, sandbox_id="5andb0x", namespace="prod",
                      pod=pod, pod_uid="uid-1", container=container)


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


def agent_cgroups(m: Machine) -> list[str]:
    return m.service.enforcer.existing()


def pool_cpus(m: Machine) -> CpuSet:
    return m.service.enforcer.read_cpuset(SHARED_CGROUP)[0]


def test_a_runtime_container_is_booked_without_a_cgroup_and_its_cpus_leave_the_pool(machine):
    before = machine.top.cgroup_of(os.getpid())
    view = machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    cpus = CpuSet.parse(view["cpus"])
    assert len(cpus) == 2 and view["cgroup"] is None and view["mems"]
    assert not any("ctr-a" in rel for rel in agent_cgroups(machine))  # no cgroup of its own
    assert machine.top.cgroup_of(os.getpid()) == before  # the caller was not moved
    assert not pool_cpus(machine) & cpus  # the pool's cgroup gave them up
    assert not CpuSet.parse(machine.service.status()["shared_pool"]) & cpus
    w = machine.service.state.workload("ctr-a")
    assert w is not None and w.runtime == ref() and w.pid is None


def test_only_root_books_a_runtime_container(machine):
    with pytest.raises(NotPermitted, match="only root"):
        machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()),
                              Caller(pid=os.getpid(), uid=1000, gid=1000))
    assert machine.service.state.workloads == ()


def test_it_survives_a_restart_as_it_is_and_is_released_by_name(machine):
    view = machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    machine.restart()
    w = machine.service.state.workload("ctr-a")
    assert w is not None and w.runtime == ref()  # not released for want of a process or cgroup
    assert w.booking.cpus == CpuSet.parse(view["cpus"])
    assert not pool_cpus(machine) & w.booking.cpus
    assert not any("ctr-a" in rel for rel in agent_cgroups(machine))
    machine.service.release("ctr-a", root_caller())
    assert machine.service.state.workloads == () and machine.service.state.revoked == ()
    assert w.booking.cpus.issubset(pool_cpus(machine))  # back to the pool


def test_a_retried_admission_gets_the_same_booking(machine):
    body = AdmitRequest(name="ctr-a", cpus=2, runtime=ref(), request_id=REQUEST_ID)
    first = machine.service.admit(body, root_caller())
    before = machine.top.cgroup_of(os.getpid())
    again = machine.service.admit(body, root_caller())
    assert again["replayed"] is True and again["cpus"] == first["cpus"]
    assert [w.name for w in machine.service.state.workloads] == ["ctr-a"]
    assert machine.top.cgroup_of(os.getpid()) == before  # a replay joins nothing either
    assert not any("ctr-a" in rel for rel in agent_cgroups(machine))


def test_a_resize_grows_it_in_place_and_the_pool_follows(machine):
    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    view = machine.service.resize("ctr-a", root_caller(), cpus=4)
    cpus = CpuSet.parse(view["cpus"])
    assert len(cpus) == 4 and view["cgroup"] is None
    w = machine.service.state.workload("ctr-a")
    assert w is not None and w.runtime == ref() and w.booking.cpus == cpus
    assert not pool_cpus(machine) & cpus
    assert not any("ctr-a" in rel for rel in agent_cgroups(machine))


def test_a_pod_of_runtime_containers_has_no_cgroup_and_takes_no_other_kind(machine):
    machine.service.admit(AdmitRequest(name="ctr-a", pod="web-0", cpus=2, runtime=ref(),
                                       pod_budget=PodBudget(cpus=4)), root_caller())
    machine.service.admit(AdmitRequest(name="ctr-b", pod="web-0", cpus=2, runtime=ref("c0ffee02")),
                          root_caller())
    assert not any("web-0" in rel or "ctr-" in rel for rel in agent_cgroups(machine))
    assert not pool_cpus(machine) & machine.service.state.exclusive_cpus()
    with pytest.raises(InvalidInput, match="runtime enforces"):
        machine.service.admit(AdmitRequest(name="plain", pod="web-0", cpus=0), root_caller())
    machine.service.release("ctr-a", root_caller())
    machine.service.release("ctr-b", root_caller())
    assert machine.service.state.pods == ()


def test_a_workload_the_agent_enforces_still_gets_its_cgroup_beside_them(machine, sleepers):
    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    caller = sleepers(uid=0)
    machine.service.admit(AdmitRequest(name="plain", cpus=2), caller)
    assert "wl-plain" in agent_cgroups(machine)
    assert machine.top.cgroup_of(caller.pid).endswith("/wl-plain")


@needs_two
def test_in_the_affinity_fallback_it_pins_nothing_shrinks_the_pool_and_outlives_a_restart(tmp_path, sleepers):
    first = AffinityAgent(tmp_path, M)
    mine = os.sched_getaffinity(0)
    try:
        view = first.service.admit(AdmitRequest(name="ctr-a", cpus=1, runtime=ref()), root_caller())
        assert view["cpus"] == "1" and os.sched_getaffinity(0) == mine  # the caller is not pinned
        pid = sleepers(uid=os.geteuid()).pid
        shared = Caller(pid=pid, uid=os.geteuid(), gid=os.getegid(), identity=process_identity(pid))
        first.service.admit(AdmitRequest(name="sh", shared=True), shared)
        assert os.sched_getaffinity(pid) == {0}  # the pool without the container's CPU
    finally:
        first.close()
    again = AffinityAgent(tmp_path, M, pid, generation=1)
    try:
        w = again.service.state.workload("ctr-a")
        assert w is not None and w.runtime == ref() and w.booking.cpus == CpuSet.parse("1")
        assert os.sched_getaffinity(0) == mine
        again.service.release("ctr-a", root_caller())
        assert again.service.state.workload("ctr-a") is None
    finally:
        again.close()


def test_list_workloads_and_status_show_the_runtime_ref_as_an_object(machine):
    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    machine.service.admit(AdmitRequest(name="plain", cpus=0), root_caller())
    listed = {v["name"]: v for v in machine.service.list_workloads()}
    assert listed["ctr-a"]["runtime"] == {"runtime": "nri", "container_id": "c0ffee01", "sandbox_id": "5andb0x",
                                          "namespace": "prod", "pod": "web-0", "pod_uid": "uid-1",
                                          "container": "app"}
    assert listed["plain"]["runtime"] is None
    shown = {v["name"]: v for v in machine.service.status()["workloads"]}
    assert shown["ctr-a"]["runtime"] == listed["ctr-a"]["runtime"]
    assert shown["ctr-a"].get("intruders", []) == []  # its container's tasks are not the agent's to judge


def test_an_exit_in_the_agents_tree_never_names_a_runtime_container(machine):
    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    state = machine.service.state
    assert _workload_at(state, "wl-ctr-a", machine.service.layout) is None


def test_the_intruder_watch_guards_no_runtime_container(machine):
    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    machine.service.admit(AdmitRequest(name="plain", cpus=2), root_caller(machine.container().pid))
    guarded = guarded_of(machine.service.state, machine.service.enforcer.path_of, None)
    assert [g.name for g in guarded] == ["plain"]


def test_the_metrics_name_each_runtime_container_as_kubernetes_does(machine):
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from numa_agent.views.metrics import AgentCollector

    machine.service.admit(AdmitRequest(name="ctr-a", cpus=2, runtime=ref()), root_caller())
    machine.service.admit(AdmitRequest(name="ctr-b", cpus=0, memory_bytes=1 << 20,
                                       runtime=ref("c0ffee02", container="side\x1b[2J")), root_caller())
    machine.service.admit(AdmitRequest(name="plain", cpus=0), root_caller())
    machine.service.release("ctr-a", root_caller())
    registry = CollectorRegistry()
    registry.register(AgentCollector(machine.service.metrics_snapshot))
    lines = [line for line in generate_latest(registry).decode().splitlines()
             if line.startswith("numa_agent_kubernetes_container_info{")]
    assert lines == ['numa_agent_kubernetes_container_info{container="side\\\\x1b[2J",namespace="prod",'
                     'pod="web-0",workload="ctr-b"} 1.0']
