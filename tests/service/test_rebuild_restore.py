"""Workloads rebuilt from their processes and entries held for an operator,
through restore, the service's status, health and release, with a written
/proc tree and with real processes."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.service.refusals import InConflict, NoCapacity, NotPermitted
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.service.test_rebuild import KEY, ROOT, USER, machine_of, make_proc, write_proc


@pytest.fixture
def proc(tmp_path):
    return make_proc(tmp_path)


def only(tmp_path, *pids):
    """A /proc that shows only `pids` (the real entries), so that marked
    processes of anything else running on this machine stay out of the test."""
    root = tmp_path / f"proc-view-{'-'.join(map(str, pids)) or 'empty'}"
    root.mkdir()
    (root / "sys").symlink_to("/proc/sys")
    for pid in pids:
        (root / str(pid)).symlink_to(f"/proc/{pid}")
    return str(root)

# ---- held entries through restore, status, health and release --------------------------

def test_held_cpus_are_reported_and_kept_until_an_operator_releases_them(proc, tmp_path, caplog):
    m = machine_of(cpus=4, reserved=1)  # CPU 0 reserved
    # a process whose affinity moved since it was given its CPUs: exclusive or shared?
    write_proc(proc, 300, {"NUMA_AGENT_WORKLOAD": "batch", "NUMA_AGENT_CPUS": "1-3"}, cpus="2-3")
    store = CheckpointStore(tmp_path / "state")
    enforcer = AffinityEnforcer("test", proc_root=str(proc))
    with caplog.at_level(logging.ERROR, logger="numa_agent.recovery"):
        state, report = restore(m, store, enforcer, mark_key=KEY)
    assert report.held == ("batch",) and report.rebuilt == ()
    assert "pid 300" in caplog.text and "CPUs 2-3" in caplog.text and "batch" in caplog.text
    service = AgentService(m, store, enforcer)
    service.install(state)
    try:
        status = service.status()
        assert [q["name"] for q in status["quarantined"]] == ["batch"]
        q = status["quarantined"][0]
        assert q["cpus"] == "2-3" and q["pid"] == 300 and "differs from the CPUs" in q["reason"]
        assert "numa-agent release batch" in q["remedy"]
        assert status["workloads"] == [] and service.list_workloads() == []
        health = service.health()
        assert health["quarantined"] == [{"name": "batch", "cpus": "2-3", "pid": 300}]
        assert "batch" in health["attention"] and health["workloads"] == 0
        # the held CPUs are not handed out
        assert service.admit(AdmitRequest(name="new", cpus=1), USER, dry_run=True)["cpus"] == "1"
        with pytest.raises(NoCapacity):
            service.admit(AdmitRequest(name="new", cpus=2), USER, dry_run=True)
        # only root releases them; the event loop's release of workloads without a
        # live process does not
        with pytest.raises(InConflict, match="only `numa-agent release batch` as root"):
            service.release("batch", None, reason="exited")
        with pytest.raises(NotPermitted):
            service.release("batch", USER)
        service.release("batch", ROOT)
        assert service.status()["quarantined"] == [] and "attention" not in service.health()
        assert service.admit(AdmitRequest(name="new", cpus=3), USER, dry_run=True)["cpus"] == "1-3"
    finally:
        enforcer.close()


def test_a_hold_is_found_again_after_a_restart_while_the_process_runs(proc, tmp_path):
    m = machine_of(cpus=4, reserved=0)
    write_proc(proc, 300, {"NUMA_AGENT_WORKLOAD": "batch", "NUMA_AGENT_CPUS": "0-3"}, cpus="0-3")
    store = CheckpointStore(tmp_path / "state")
    for _ in range(2):  # the whole pool: held, and held again after a restart
        enforcer = AffinityEnforcer("test", proc_root=str(proc))
        state, report = restore(m, store, enforcer, mark_key=KEY)
        AgentService(m, store, enforcer).install(state)
        enforcer.close()
        assert report.held == ("batch",)
        assert state.workload("batch").booking.cpus == CpuSet.parse("0-3")


# ---- real processes through restore --------------------------------------------------------

needs_two = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or 1 not in os.sched_getaffinity(0),
                               reason="needs CPUs 0 and 1")


@needs_two
@pytest.mark.parametrize("damage", ["truncated", "bit-flipped", "emptied", "deleted"])
def test_a_lost_checkpoint_is_rebuilt_from_the_running_process(tmp_path, damage, caplog):
    from tests.state.test_checkpoint_generations import DAMAGE
    m = machine_of(cpus=2, reserved=1)  # CPU 0 reserved, CPU 1 to hand out
    store = CheckpointStore(tmp_path / "state")
    enforcer = AffinityEnforcer("test", proc_root=only(tmp_path))
    service = AgentService(m, store, enforcer)
    state, _ = restore(m, store, enforcer, mark_key=KEY)
    service.install(state)
    sleeper_proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "NUMA_AGENT_WORKLOAD": "sleeper"})
    other = subprocess.Popen(["sleep", "60"])
    try:
        admitted = service.admit(AdmitRequest(name="sleeper", cpus=1),
                                 Caller(pid=sleeper_proc.pid, uid=os.geteuid(), gid=os.getegid()))
        assert admitted["cpus"] == "1" and os.sched_getaffinity(sleeper_proc.pid) == {1}
        # a second save, so that there is a .prev to remove (or only the journal has it)
        service.admit(AdmitRequest(name="extra", shared=True), Caller(pid=other.pid, uid=0, gid=0))
        enforcer.close()  # the agent dies
        DAMAGE[damage](store.path)
        store.previous_path.unlink(missing_ok=True)
        enforcer2 = AffinityEnforcer("test", proc_root=only(tmp_path, sleeper_proc.pid, other.pid))
        with caplog.at_level(logging.WARNING, logger="numa_agent.recovery"):
            state2, report = restore(m, store, enforcer2, mark_key=KEY)
        service2 = AgentService(m, store, enforcer2)
        service2.install(state2)
        assert report.rebuilt == ("sleeper",) and report.held == ()
        w = service2.state.workload("sleeper")
        assert w.booking.cpus == CpuSet.parse("1") and w.pid == sleeper_proc.pid and not w.shared
        assert "rebuilding from the cgroup tree" not in caplog.text
        assert "marked NUMA_AGENT_WORKLOAD" in caplog.text or damage == "deleted"
        with pytest.raises(NoCapacity):
            service2.admit(AdmitRequest(name="next", cpus=1), ROOT, dry_run=True)
        view = service2.list_workloads()[0]
        assert view["rebuilt"] == "partial" and view["cpus"] == "1"
        # it is followed: its exit releases it
        sleeper_proc.kill()
        sleeper_proc.wait()
        assert enforcer2.released(set(enforcer2.fds())) == ["wl-sleeper"]
        enforcer2.close()
    finally:
        for p in (sleeper_proc, other):
            if p.poll() is None:
                p.kill()
                p.wait()
