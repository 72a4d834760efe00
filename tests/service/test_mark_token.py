"""The workload mark's token: only the agent issues it, and it holds only
for the process it was issued for. A forged mark (another user's own, or a
token copied from another pid) books nothing at a rebuild."""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat

import pytest

from numa_agent.cli.numa_run import workload_env
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.mark import issue_mark, mark_verifies, start_time_of
from numa_agent.daemon.mark_key import load_or_create_key
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.processes import process_identity
from numa_agent.service.agent_service import AgentService
from numa_agent.service.rebuild import reconcile
from numa_agent.service.recovery import restore
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.model import AgentState
from tests.service.test_rebuild import KEY, machine_of, marked
from tests.service.test_rebuild_restore import only
from tests.support.marks import give_mark, spawn_awaiting_mark

# ---- the token ---------------------------------------------------------------------

def test_a_token_verifies_only_for_its_own_name_pid_and_start_time():
    token = issue_mark(KEY, "db", 100, 5000)
    assert mark_verifies(KEY, "db", 100, 5000, token)
    assert not mark_verifies(KEY, "db", 101, 5000, token)  # another pid
    assert not mark_verifies(KEY, "db", 100, 5001, token)  # a recycled pid
    assert not mark_verifies(KEY, "web", 100, 5000, token)
    assert not mark_verifies(bytes(32), "db", 100, 5000, token)  # another key (another boot)
    assert not mark_verifies(None, "db", 100, 5000, token) and not mark_verifies(KEY, "db", 100, 5000, None)
    assert start_time_of("0d5c-boot:5000") == 5000 and start_time_of(None) is None


# ---- the rule ----------------------------------------------------------------------

@pytest.mark.parametrize("case, forged", [
    ("a user's own mark, no token", marked(300, "mine", "2-3", uid=1000, mark=None)),
    ("a token copied from another pid", marked(300, "db", "2-3", uid=1000,
                                               mark=issue_mark(KEY, "db", 100, 100))),
    ("a made-up token", marked(300, "db", "2-3", uid=1000, mark="00" * 32)),
    ("root's process with a wrong token", marked(300, "db", "2-3", uid=0, mark="ab" * 32)),
    ("a held-looking one (whole pool)", marked(300, "x", "0-7", uid=1000, mark=None)),
])
def test_a_forged_mark_is_neither_rebuilt_nor_held(case, forged):
    out = reconcile(machine_of(), AgentState(), [forged], key=KEY)
    assert out.rebuilt == () and out.held == () and out.state.workloads == ()
    assert out.state.exclusive_cpus() == CpuSet()
    warned = [text for level, text in out.messages if level == logging.WARNING]
    assert len(warned) == 1 and "unverified mark" in warned[0] and "not rebuilt" in warned[0]
    assert f"pid 300 uid {forged.uid}" in warned[0] and repr(forged.name) in warned[0]


def test_a_forger_older_than_the_genuine_process_does_not_take_its_place():
    forged = marked(50, "db", "4-5", uid=1000, mark="00" * 32)
    # A copy of the leader's token looks like one of its children: passed over, books nothing.
    copied = marked(60, "db", "6", uid=1000, mark=issue_mark(KEY, "db", 100, 100))
    genuine = marked(100, "db", "2-3", uid=1234)
    child = marked(101, "db", "2-3", uid=1234, ppid=100)  # inherited the leader's token
    out = reconcile(machine_of(), AgentState(), [forged, copied, genuine, child], key=KEY)
    assert out.rebuilt == ("db",) and out.state.workload("db").pid == 100
    assert out.state.exclusive_cpus() == CpuSet.parse("2-3")
    warned = [text for _, text in out.messages if "unverified" in text]
    assert len(warned) == 1 and "pid 50 " in warned[0]  # not the child, nor the copy


def test_roots_unsigned_mark_from_an_older_numa_run_is_still_rebuilt():
    out = reconcile(machine_of(), AgentState(), [marked(300, "old", "2-3", uid=0, mark=None)], key=KEY)
    assert out.rebuilt == ("old",) and out.state.workload("old").owner_uid == 0


def test_without_a_key_nothing_but_roots_unsigned_marks_is_trusted():
    out = reconcile(machine_of(), AgentState(), [marked(300, "db", "2-3")], key=None)
    assert out.rebuilt == () and out.state.workloads == ()


def test_marks_under_a_new_key_are_said_once_and_quietly():
    others = [marked(300 + i, f"w{i}", "2-3", uid=1000, mark=issue_mark(b"k" * 32, f"w{i}", 300 + i, 100))
              for i in range(5)]
    out = reconcile(machine_of(), AgentState(), others, key=KEY, key_new=True)
    assert out.rebuilt == () and out.held == () and out.state.workloads == ()
    assert not [text for level, text in out.messages if level >= logging.WARNING]
    (said,) = [text for level, text in out.messages if level == logging.INFO]
    assert said.startswith("5 process(es)") and "pids 300, 301, 302, 303, 304" in said


# ---- the key -----------------------------------------------------------------------

def test_the_key_is_private_and_survives_a_restart(tmp_path):
    path = tmp_path / "run" / "mark.key"
    path.parent.mkdir()
    key, new = load_or_create_key(path)
    assert new and len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(path) == (key, False)  # the next agent start reads it back
    assert [p.name for p in path.parent.iterdir()] == ["mark.key"]  # no temporary left


@pytest.mark.parametrize("damage", ["short", "empty", "readable by others", "symlink"])
def test_a_damaged_key_is_replaced(tmp_path, damage):
    path = tmp_path / "mark.key"
    old = load_or_create_key(path).secret
    if damage == "short":
        path.write_bytes(old[:7])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "readable by others":
        path.chmod(0o644)
    else:
        path.unlink()
        (tmp_path / "elsewhere").write_bytes(old)
        path.symlink_to(tmp_path / "elsewhere")
    new, made = load_or_create_key(path)
    assert made and len(new) == 32 and new != old and not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and load_or_create_key(path).secret == new


def _make_key(path: str, barrier, out) -> None:
    barrier.wait()
    out.put(load_or_create_key(__import__("pathlib").Path(path)).secret)


def test_two_agents_making_the_key_at_once_end_with_one_key(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for round_ in range(10):
        path = tmp_path / f"mark-{round_}.key"
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_make_key, args=(str(path), barrier, out)) for _ in range(2)]
        for p in procs:
            p.start()
        keys = {out.get(timeout=20), out.get(timeout=20)}
        for p in procs:
            p.join()
        assert keys == {path.read_bytes()}


# ---- admission to rebuild, on real processes -----------------------------------------

def test_admission_issues_the_mark_and_numa_run_exports_it(tmp_path):
    m = machine_of(cpus=2, reserved=1)
    store = CheckpointStore(tmp_path / "state")
    enforcer = AffinityEnforcer("test", proc_root=only(tmp_path))
    service = AgentService(m, store, enforcer, mark_key=KEY)
    service.install(restore(m, store, enforcer, mark_key=KEY)[0])
    proc = spawn_awaiting_mark(["sleep", "60"], {"NUMA_AGENT_WORKLOAD": "sleeper"})
    try:
        caller = Caller(pid=proc.pid, uid=1000, gid=1000, identity=process_identity(proc.pid))
        assert service.admit(AdmitRequest(name="sleeper", cpus=1), caller, dry_run=True)["mark"] is None
        answer = service.admit(AdmitRequest(name="sleeper", cpus=1, request_id="r" * 32), caller)
        start = start_time_of(caller.identity)
        assert mark_verifies(KEY, "sleeper", proc.pid, start, answer["mark"])
        replayed = service.admit(AdmitRequest(name="sleeper", cpus=1, request_id="r" * 32), caller)
        assert replayed["replayed"] and replayed["mark"] == answer["mark"]
        assert workload_env(answer)["NUMA_AGENT_MARK"] == answer["mark"]
        assert "mark" not in service.list_workloads()[0]  # only the admitted process is told
    finally:
        proc.kill()
        proc.wait()
        enforcer.close()


def test_a_genuine_mark_is_rebuilt_and_a_copied_one_is_not(tmp_path, caplog):
    m = machine_of(cpus=2, reserved=1)  # CPU 1 to hand out
    store = CheckpointStore(tmp_path / "state")
    enforcer = AffinityEnforcer("test", proc_root=only(tmp_path))
    service = AgentService(m, store, enforcer, mark_key=KEY)
    service.install(restore(m, store, enforcer, mark_key=KEY)[0])
    genuine = spawn_awaiting_mark(["sleep", "60"], {"NUMA_AGENT_WORKLOAD": "sleeper"})
    forger = None
    try:
        caller = Caller(pid=genuine.pid, uid=1000, gid=1000, identity=process_identity(genuine.pid))
        answer = service.admit(AdmitRequest(name="sleeper", cpus=1), caller)
        give_mark(genuine, answer["mark"])
        # Someone copies the token into a process of theirs on the same CPU.
        forger = spawn_awaiting_mark(["sleep", "60"], {"NUMA_AGENT_WORKLOAD": "sleeper2"})
        give_mark(forger, answer["mark"])
        os.sched_setaffinity(forger.pid, CpuSet.parse(answer["cpus"]).ids())
        enforcer.close()  # the agent dies and its checkpoint is lost
        store.path.unlink()
        store.previous_path.unlink(missing_ok=True)
        enforcer2 = AffinityEnforcer("test", proc_root=only(tmp_path, genuine.pid, forger.pid))
        with caplog.at_level(logging.WARNING, logger="numa_agent.recovery"):
            state, report = restore(m, store, enforcer2, mark_key=KEY)
        enforcer2.close()
        assert report.rebuilt == ("sleeper",) and report.held == ()
        assert [w.name for w in state.workloads] == ["sleeper"]
        assert state.exclusive_cpus() == CpuSet.parse(answer["cpus"])
        assert f"unverified mark on pid {forger.pid}" in caplog.text and "not rebuilt" in caplog.text
    finally:
        for p in (genuine, forger):
            if p is not None:
                p.kill()
                p.wait()


def test_the_key_lives_in_the_runtime_directory_or_with_a_simulated_machine_in_the_state_directory():
    from numa_agent.daemon.config import AgentConfig
    from numa_agent.daemon.startup import mark_key_path
    real = AgentConfig(socket="/run/numa-agent/agent.sock", state_dir="/var/lib/numa-agent")
    assert str(mark_key_path(real)) == "/run/numa-agent/mark.key"
    simulated = AgentConfig(socket="/tmp/x/agent.sock", state_dir="/tmp/s", sysfs_root="/tmp/sysfs")
    assert str(mark_key_path(simulated)) == "/tmp/s/mark.key"


def test_a_key_made_by_another_agent_right_after_we_found_none_is_taken_not_replaced(tmp_path, monkeypatch):
    """The interleaving the concurrent test hits only now and then, made certain:
    the other agent links its key in between our read and our decision."""
    from numa_agent.daemon import mark_key
    path, theirs, real_read = tmp_path / "mark.key", [], mark_key._read

    def read_then_race(held, name):
        seen = real_read(held, name)
        if not theirs:
            monkeypatch.setattr(mark_key, "_read", real_read)
            theirs.append(load_or_create_key(path).secret)  # the other agent, in between
            monkeypatch.setattr(mark_key, "_read", read_then_race)
        return seen

    monkeypatch.setattr(mark_key, "_read", read_then_race)
    assert load_or_create_key(path).secret == theirs[0] == path.read_bytes()
