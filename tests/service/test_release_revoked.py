"""An operator's release sticks: a workload released while its process runs
goes to the shared pool and never comes back at a restart, whether the agent
died before it re-pinned the process or not; its revocation is kept only
while that process runs. With real processes in the affinity fallback, and on
a simulated cgroup tree."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading

import pytest

from numa_agent.cli.status_cmd import format_status
from numa_agent.core.caller import Caller
from numa_agent.core.mark import issue_mark, start_time_of
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.processes import process_identity
from numa_agent.kubelet.files import StateFiles
from numa_agent.kubelet.state_files import CPU_MANAGER_STATE
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.service.test_agent_service import Crash
from tests.service.test_rebuild import KEY, ROOT, machine_of
from tests.support.marks import give_mark, spawn_awaiting_mark
from tests.support.pod_resources import list_response
from tests.support.tattling_lock import TattlingLock

needs_two = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
pytestmark = needs_two
MARKED = {"NUMA_AGENT_WORKLOAD": "sleeper", "NUMA_AGENT_CPUS": "1", "NUMA_AGENT_EXCLUSIVE": "1"}


class Agent:
    """The service over one state directory, started as the agent starts it
    (restore, then install), seeing only the given processes in /proc."""

    def __init__(self, tmp_path, machine, *pids, generation=0):
        view = tmp_path / f"proc-{generation}"
        view.mkdir()
        (view / "sys").symlink_to("/proc/sys")
        (view / "stat").symlink_to("/proc/stat")
        for pid in pids:
            (view / str(pid)).symlink_to(f"/proc/{pid}")
        self.store = CheckpointStore(tmp_path / "state")
        self.enforcer = AffinityEnforcer("test", proc_root=str(view))
        self.state, self.report = restore(machine, self.store, self.enforcer, mark_key=KEY)
        self.service = AgentService(machine, self.store, self.enforcer, mark_key=KEY)
        self.kubelet_files = StateFiles(tmp_path / "kubelet")
        self.kubelet_files.check()
        self.service.state_publisher = self.kubelet_files
        self.service.install(self.state)
        self.closed = False

    def close(self):
        if not self.closed:
            self.kubelet_files.close()
            self.enforcer.close()
        self.closed = True


M = machine_of(cpus=2, reserved=1)  # CPU 0 reserved (in the pool), CPU 1 to hand out


@pytest.fixture
def agent(tmp_path):
    """The first agent over a new state directory; a test stops it (close) to restart."""
    first = Agent(tmp_path, M)
    yield first
    first.close()


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def admitted_sleeper(agent, procs, name="sleeper", env=MARKED):
    """A process admitted as numa-run's is, then exec'd with its mark."""
    proc = spawn_awaiting_mark(["sleep", "60"], {**env, "NUMA_AGENT_WORKLOAD": name})
    procs.append(proc)
    caller = Caller(pid=proc.pid, uid=os.geteuid(), gid=os.getegid(), identity=process_identity(proc.pid))
    answer = agent.service.admit(AdmitRequest(name=name, cpus=1), caller)
    give_mark(proc, answer["mark"])
    return proc, answer


def absent_everywhere(agent, tmp_path, name):
    """Not in status, PodResources nor the kubelet's state files."""
    service = agent.service
    assert name not in [w["name"] for w in service.status()["workloads"]]
    assert name not in [p.name for p in list_response(service.machine, service.state, "default").pod_resources]
    assert agent.kubelet_files.flush()
    cpu_state = json.loads((tmp_path / "kubelet" / CPU_MANAGER_STATE).read_text())
    assert name not in cpu_state.get("entries", {})
    return True


def test_a_release_while_the_process_runs_moves_it_to_the_pool_and_it_stays_released(tmp_path, agent, procs):
    proc, answer = admitted_sleeper(agent, procs)
    assert answer["cpus"] == "1" and os.sched_getaffinity(proc.pid) == {1}
    agent.service.release("sleeper", ROOT)
    assert os.sched_getaffinity(proc.pid) == {0, 1}  # the shared pool
    journalled = CheckpointStore(tmp_path / "state").load()
    agent.close()

    again = Agent(tmp_path, M, proc.pid, generation=1)  # a restart over the same state directory
    try:
        assert again.report.rebuilt == () and again.report.held == ()
        assert absent_everywhere(again, tmp_path, "sleeper")
        assert [r["pid"] for r in journalled["revoked"]] == [proc.pid]
        assert [(r["name"], r["pid"]) for r in again.service.status()["released"]] == [("sleeper", proc.pid)]
        assert os.sched_getaffinity(proc.pid) == {0, 1}
        assert again.service.admit(AdmitRequest(name="next", cpus=1), ROOT, dry_run=True)["cpus"] == "1"
    finally:
        again.close()


def test_a_crash_between_the_releases_checkpoint_and_the_re_pin_leaves_it_released(tmp_path, agent, procs,
                                                                                    monkeypatch, caplog):
    proc, _ = admitted_sleeper(agent, procs)

    def die(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(agent.enforcer, "apply", die)  # kill -9 after the checkpoint
    with pytest.raises(Crash):
        agent.service.release("sleeper", ROOT)
    assert os.sched_getaffinity(proc.pid) == {1}  # never re-pinned
    agent.close()

    with caplog.at_level(logging.INFO, logger="numa_agent.recovery"):
        again = Agent(tmp_path, M, proc.pid, generation=1)
    try:
        assert again.report.rebuilt == () and again.report.held == ()
        assert f"pid {proc.pid} (NUMA_AGENT_WORKLOAD=sleeper" in caplog.text and "released by an operator" in caplog.text
        assert os.sched_getaffinity(proc.pid) == {0, 1}  # start-up moved it to the pool
        assert absent_everywhere(again, tmp_path, "sleeper")
        assert again.service.admit(AdmitRequest(name="next", cpus=1), ROOT, dry_run=True)["cpus"] == "1"
    finally:
        again.close()


def test_a_released_process_follows_the_pool_when_it_changes(tmp_path, agent, procs):
    proc, _ = admitted_sleeper(agent, procs)
    agent.service.release("sleeper", ROOT)
    assert os.sched_getaffinity(proc.pid) == {0, 1}
    other, answer = admitted_sleeper(agent, procs, name="other")  # takes CPU 1 from the pool
    assert answer["cpus"] == "1"
    assert os.sched_getaffinity(proc.pid) == {0}  # not an intruder on other's CPU
    agent.service.release("other", ROOT)
    assert os.sched_getaffinity(proc.pid) == {0, 1}


def test_a_released_process_is_not_left_on_an_older_pool_by_changes_applied_at_once(tmp_path, agent, procs,
                                                                                    monkeypatch):
    """An admission takes CPU 1 from the pool and hands the released process the
    pool it left ({0}); before it has pinned it, the admission's release is applied
    (another thread) and hands it the pool grown back ({0, 1}). The older pool must
    not be pinned last: the process would stay off CPU 1 until the pool changes again."""
    proc, _ = admitted_sleeper(agent, procs)
    agent.service.release("sleeper", ROOT)
    paused, go, settled = threading.Event(), threading.Event(), threading.Event()
    admitting: list[threading.Thread] = []
    evict = agent.enforcer.evict

    def held_up(*args, **kwargs):
        if threading.current_thread() in admitting and not paused.is_set():
            paused.set()
            go.wait()
        return evict(*args, **kwargs)

    monkeypatch.setattr(agent.enforcer, "evict", held_up)
    agent.service._unit._pool_lock = TattlingLock(settled)
    admission = threading.Thread(target=lambda: admitted_sleeper(agent, procs, name="other"))
    admitting.append(admission)
    admission.start()
    paused.wait()
    release = threading.Thread(target=lambda: (agent.service.release("other", ROOT), settled.set()))
    release.start()
    settled.wait()  # the release is done, or waits for the pool the admission hands out
    go.set()
    admission.join()
    release.join()
    assert agent.service.status()["shared_pool"] == "0-1"
    assert os.sched_getaffinity(proc.pid) == {0, 1}


def test_revocations_are_dropped_once_their_process_is_gone(tmp_path, agent, procs):
    proc, _ = admitted_sleeper(agent, procs)
    agent.service.release("sleeper", ROOT)
    other, _ = admitted_sleeper(agent, procs, name="other")
    agent.service.release("other", ROOT)
    assert [r.name for r in agent.service.state.revoked] == ["sleeper", "other"]
    proc.kill()
    proc.wait()
    assert [r["name"] for r in agent.service.status()["released"]] == ["other"]
    third, _ = admitted_sleeper(agent, procs, name="third")
    third.kill()
    third.wait()
    agent.service.release("third", ROOT)  # each release drops what no process carries any more
    assert [r.name for r in agent.service.state.revoked] == ["other"]
    agent.close()
    other.kill()
    other.wait()
    again = Agent(tmp_path, M, generation=1)  # and so does each start
    try:
        assert again.service.state.revoked == ()
        assert "revoked" not in CheckpointStore(tmp_path / "state").load()
    finally:
        again.close()


def test_an_exited_workload_leaves_no_revocation(tmp_path, agent, procs):
    proc, _ = admitted_sleeper(agent, procs)
    proc.kill()
    proc.wait()
    assert agent.enforcer.released(set(agent.enforcer.fds())) == ["wl-sleeper"]
    agent.service.release("sleeper", None, reason="exited")
    assert agent.service.state.revoked == () and agent.service.status()["released"] == []


def test_a_released_hold_is_not_held_again(tmp_path, procs):
    """A process held at start-up for an operator, released by root while it
    runs: the next start neither holds nor rebuilds it."""
    stray = spawn_awaiting_mark(["sleep", "60"], {"NUMA_AGENT_WORKLOAD": "stray", "NUMA_AGENT_CPUS": "0-1"})
    procs.append(stray)
    os.sched_setaffinity(stray.pid, {1})  # not what it was given: held
    give_mark(stray, issue_mark(KEY, "stray", stray.pid, start_time_of(process_identity(stray.pid))))
    agent = Agent(tmp_path, M, stray.pid)
    assert agent.report.held == ("stray",)
    agent.service.release("stray", ROOT)
    assert [r["pid"] for r in agent.service.status()["released"]] == [stray.pid]
    agent.close()
    again = Agent(tmp_path, M, stray.pid, generation=1)
    try:
        assert again.report.held == () and again.report.rebuilt == ()
        assert again.service.status()["quarantined"] == []
    finally:
        again.close()


def test_a_rebuilt_workload_was_created_when_its_process_started(tmp_path, agent, procs):
    proc, _ = admitted_sleeper(agent, procs)
    agent.close()
    for path in (agent.store.path, agent.store.previous_path, agent.store.journal_path):
        path.unlink(missing_ok=True)  # the checkpoint lost entirely
    again = Agent(tmp_path, M, proc.pid, generation=1)
    try:
        assert again.report.rebuilt == ("sleeper",)
        with open(f"/proc/{proc.pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as f:
            btime = int(next(line for line in f if line.startswith("btime")).split()[1])
        expected = btime + ticks / os.sysconf("SC_CLK_TCK")
        assert again.service.state.workload("sleeper").created_unix == expected
        assert again.service.status()["workloads"][0]["created_unix"] == expected
    finally:
        again.close()


def test_status_shows_a_released_process_as_unmanaged():
    status = {"workloads": [], "released": [{"name": "db", "pid": 4242, "released_unix": 1000.0,
                                             "reason": "released by an operator"}]}
    lines = format_status(status, now=1000.0 + 120)
    assert ("UNMANAGED pid 4242: was workload db, released by an operator 2m ago while it ran; it runs on "
            "the shared pool") in lines


def test_an_unknown_creation_time_shows_no_age():
    status = {"workloads": [{"name": "old", "owner_uid": 0, "cpus": "1", "created_unix": 0.0}]}
    row = next(line for line in format_status(status, now=1.8e9) if line.startswith("old "))
    assert row.split()[-1] == "-"


def test_a_revocation_covers_only_its_own_booking_and_process():
    from numa_agent.state.model import Revocation, Workload
    r = Revocation(name="db", pid=100, pid_identity="boot:500", created_unix=7.0, cgroup="wl-db")
    assert r.covers(Workload(name="db", owner_uid=0, pid=100, created_unix=7.0))
    assert not r.covers(Workload(name="db", owner_uid=0, pid=101, created_unix=8.0))  # admitted again later
    assert r.covers_process(100, "boot:500")
    assert not r.covers_process(100, "boot:501")  # the pid reused
    assert not r.covers_process(101, "boot:500")


class _Evictions:
    """An enforcer without cgroups that records what hand_to_pool asks of it."""

    def __init__(self):
        self.evicted = []

    def exists(self, relpath):
        return False

    def read_record(self, relpath):
        return None

    def evict(self, relpath, pid, identity, layout):
        self.evicted.append((relpath, pid, identity))


def test_one_live_process_released_many_times_is_read_and_re_pinned_once(monkeypatch):
    """A process that admitted itself under many names, each released while it ran:
    one revocation per name, one process. A change of the pool asks whether it lives
    and re-pins it once, not once per revocation."""
    import numa_agent.service.revocations as revocations
    from numa_agent.state.model import AgentState, Revocation

    me = os.getpid()
    identity = process_identity(me)
    revoked = tuple(Revocation(name=f"probe-{i}", pid=me, pid_identity=identity, cgroup=f"shared/probe-{i}")
                    for i in range(50))
    state = AgentState().with_revoked(revoked)
    reads = []
    real = revocations.process_identity

    def counting(pid, *args):
        reads.append(pid)
        return real(pid, *args)

    monkeypatch.setattr(revocations, "process_identity", counting)
    enforcer = _Evictions()
    revocations.hand_to_pool(state, enforcer, {})
    assert enforcer.evicted == [(None, me, identity)]
    assert len(reads) == 1
    reads.clear()
    assert revocations.pruned(state, enforcer).revoked == revoked  # all kept: their process runs
    assert len(reads) == 1
