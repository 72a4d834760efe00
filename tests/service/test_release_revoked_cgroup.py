"""An operator's release sticks in cgroup mode too: on a simulated cgroup tree,
a workload released while its process runs is not adopted back from its
booking record at the next start, also when the agent died between the
release's checkpoint and the cgroup's removal; a later workload of the same
name is not taken for it."""

from __future__ import annotations

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.service.test_agent_service import ROOT, Crash, make_machine
from tests.support.simulated_service import cg_file, start


@pytest.fixture
def env(tmp_path):
    machine = make_machine()
    return machine, tmp_path / "state", make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])


def procs_of(root, rel):
    return [int(p) for p in cg_file(root, rel, "cgroup.procs").split()]


def test_a_released_workload_whose_process_runs_is_not_adopted_again(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    caller = sleepers()
    service.admit(AdmitRequest(name="db", cpus=2), caller)
    service.release("db", ROOT)
    assert not (root / "wl-db").exists() and procs_of(root, "shared/_released") == [caller.pid]
    service2, report = start(machine, state_dir, root)
    assert report.adopted == () and service2.state.workloads == ()
    assert [r["pid"] for r in service2.status()["released"]] == [caller.pid]


def test_a_crash_before_the_release_is_enforced_does_not_bring_the_workload_back(env, sleepers, monkeypatch):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    caller = sleepers()
    cpus = CpuSet.parse(service.admit(AdmitRequest(name="db", cpus=2), caller)["cpus"])

    def die(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(service.enforcer, "apply", die)  # kill -9 after the checkpoint
    with pytest.raises(Crash):
        service.release("db", ROOT)
    assert procs_of(root, "wl-db") == [caller.pid]  # its cgroup and record are still there

    service2, report = start(machine, state_dir, root)
    assert report.adopted == () and service2.state.workloads == ()
    assert not (root / "wl-db").exists()
    assert procs_of(root, "shared/_released") == [caller.pid]
    assert cpus.issubset(CpuSet.parse(cg_file(root, "shared", "cpuset.cpus")))  # its CPUs back in the pool
    assert [r.name for r in service2.state.revoked] == ["db"]  # its process still runs


def test_a_later_workload_of_the_same_name_is_not_taken_for_the_released_one(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="db", cpus=2), sleepers())
    service.release("db", ROOT)
    service.admit(AdmitRequest(name="db", cpus=1), sleepers())
    assert [r.name for r in service.state.revoked] == ["db"]
    (state_dir / "checkpoint.json").unlink()  # the checkpoint lost: adopted from its record
    (state_dir / "checkpoint.json.prev").unlink(missing_ok=True)
    (state_dir / "checkpoint.journal").unlink(missing_ok=True)
    service2, report = start(machine, state_dir, root)
    assert report.adopted == ("db",) and len(service2.state.workload("db").booking.cpus) == 1
    assert CheckpointStore(state_dir).load()["workloads"][0]["name"] == "db"


def test_a_crash_before_an_engines_cgroup_is_handed_back_does_not_bring_its_workload_back(tmp_path, monkeypatch):
    from tests.service.test_engine_cgroup import CONTAINER, Machine, engine_cpus, root_caller
    machine = Machine(tmp_path)
    try:
        proc = machine.container()
        machine.service.admit(AdmitRequest(name="c", cpus=2, cgroup=CONTAINER), root_caller())

        def die(*args, **kwargs):
            raise Crash()

        monkeypatch.setattr(machine.service.enforcer, "apply", die)  # kill -9 after the checkpoint
        with pytest.raises(Crash):
            machine.service.release("c", root_caller())
        machine.restart()
        assert machine.service.state.workload("c") is None
        assert engine_cpus(machine) == machine.top.read_effective("libpod_parent")[0]  # handed back
        assert machine.service.enforcer.read_record(CONTAINER) is None
        assert machine.top.cgroup_of(proc.pid) == CONTAINER  # the engine's process, left where it is
    finally:
        machine.close()
