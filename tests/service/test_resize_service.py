"""`resize` through the service on a simulated cgroup tree: the cgroup, the shared
pool, the checkpoint and the kubelet's view follow before the answer; a refusal or
a failure changes nothing; a crash between checkpoint and cgroups leaves the new
booking, which the next start enforces."""

import os

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.errors import CgroupNoSpaceError
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.kubelet.files import served_documents
from numa_agent.service.refusals import NoCapacity, NotPermitted, TopologyRefused, Unavailable, UnknownWorkload
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.support.simulated_service import cg_file, start
from tests.support.synthetic import make_topology

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
OTHER = Caller(pid=os.getpid(), uid=1001, gid=1001)
GiB = 1 << 30


@pytest.fixture
def env(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 * GiB)
    machine = build_machine(topo, PolicyConfig(topology_policy="restricted"))
    root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    return machine, tmp_path / "state", root


def saved(state_dir, name):
    return next(w for w in CheckpointStore(state_dir).load()["workloads"] if w["name"] == name)


def test_grow_and_shrink_follow_in_the_cgroup_pool_and_checkpoint(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    first = CpuSet.parse(service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=GiB), ME)["cpus"])
    out = service.resize("web", ME, cpus=4, memory_bytes=2 * GiB)
    grown = CpuSet.parse(out["cpus"])
    assert first.issubset(grown) and len(grown) == 4
    assert CpuSet.parse(cg_file(root, "wl-web", "cpuset.cpus")) == grown
    assert cg_file(root, "wl-web", "memory.max") == str(2 * GiB)
    pool = CpuSet.parse(cg_file(root, "shared", "cpuset.cpus"))
    assert pool.isdisjoint(grown) and pool | grown == machine.usable_cpus
    assert CpuSet.parse(saved(state_dir, "web")["booking"]["cpus"]) == grown
    shown = served_documents(None, *service.view())["cpu_manager_state"]["entries"]
    assert CpuSet.parse(next(iter(shown.values()))["web"]) == grown  # the kubelet's view follows it
    out = service.resize("web", ME, cpus=2)
    assert CpuSet.parse(out["cpus"]) == first
    assert CpuSet.parse(cg_file(root, "wl-web", "cpuset.cpus")) == first
    assert CpuSet.parse(cg_file(root, "shared", "cpuset.cpus")) == machine.usable_cpus - first
    assert "cpus_added" not in saved(state_dir, "web")


def test_a_refused_resize_changes_nothing(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="web", cpus=6, memory_bytes=GiB), ME)
    before = (cg_file(root, "wl-web", "cpuset.cpus"), cg_file(root, "shared", "cpuset.cpus"),
              CheckpointStore(state_dir).load())
    with pytest.raises(TopologyRefused):
        service.resize("web", ME, cpus=9)  # restricted: node 0 holds 7
    with pytest.raises(NoCapacity):
        service.resize("web", ME, memory_bytes=64 * GiB)
    assert (cg_file(root, "wl-web", "cpuset.cpus"), cg_file(root, "shared", "cpuset.cpus"),
            CheckpointStore(state_dir).load()) == before


def test_only_the_owner_or_root_resizes(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="web", cpus=2), ME)
    with pytest.raises(NotPermitted):
        service.resize("web", OTHER, cpus=4)
    with pytest.raises(UnknownWorkload):
        service.resize("nobody", ME, cpus=4)


def test_an_enforcement_failure_rolls_the_resize_back(env, monkeypatch):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    first = service.admit(AdmitRequest(name="web", cpus=2), ME)["cpus"]

    def full(*args, **kw):
        raise CgroupNoSpaceError("write cpuset.cpus: ENOSPC", path="wl-web")

    monkeypatch.setattr(service.enforcer.cgroup, "write_cpuset", full)
    with pytest.raises(Unavailable):
        service.resize("web", ME, cpus=4)
    monkeypatch.undo()
    assert service.state.workload("web").booking.cpus == CpuSet.parse(first)
    assert saved(state_dir, "web")["booking"]["cpus"] == first
    assert cg_file(root, "wl-web", "cpuset.cpus") == first


def test_a_crash_after_the_checkpoint_leaves_the_new_booking_enforced_at_restart(env, monkeypatch, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="web", cpus=2), sleepers())

    class Killed(BaseException):
        """The agent dies here: nothing after the checkpoint runs, no rollback."""

    def die(*args, **kw):
        raise Killed()

    monkeypatch.setattr(service.enforcer, "apply", die)
    with pytest.raises(Killed):
        service.resize("web", ME, cpus=4)
    monkeypatch.undo()
    booked = CpuSet.parse(saved(state_dir, "web")["booking"]["cpus"])
    assert len(booked) == 4  # the checkpoint holds the new booking, the cgroup the old
    assert len(CpuSet.parse(cg_file(root, "wl-web", "cpuset.cpus"))) == 2
    service2, report = start(machine, state_dir, root)
    assert report.released == ()
    assert service2.state.workload("web").booking.cpus == booked
    assert CpuSet.parse(cg_file(root, "wl-web", "cpuset.cpus")) == booked
    assert CpuSet.parse(cg_file(root, "shared", "cpuset.cpus")).isdisjoint(booked)


def test_a_pod_member_is_resized_inside_its_pod(env):
    from numa_agent.enforcement.plan import workload_relpath
    from numa_agent.service.requests import PodBudget
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="main", pod="pd", cpus=2, pod_budget=PodBudget(cpus=6)), ME)
    service.admit(AdmitRequest(name="side", pod="pd"), ME)
    out = service.resize("main", ME, cpus=4)
    grown = CpuSet.parse(out["cpus"])
    rel = workload_relpath(service.state.workload("main"))
    assert len(grown) == 4 and CpuSet.parse(cg_file(root, rel, "cpuset.cpus")) == grown
    side = workload_relpath(service.state.workload("side"))
    assert CpuSet.parse(cg_file(root, side, "cpuset.cpus")).isdisjoint(grown)
