"""Tasks pinned inside a cgroup they share, attacked: a caller gone or replaced
by a reused PID before its pin, resizes and hotplug of a pinned booking, whole
bookings around it, and restarts from a damaged or lost checkpoint. On the
simulated hierarchy, where a pin is recorded, not made (`simulated_pins`)."""

import dataclasses
import os

import msgspec
import pytest

from numa_agent.admission.machine import build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon.startup import Agent
from numa_agent.enforcement.processes import process_identity
from numa_agent.enforcement.record import RECORD_XATTR, encode_record
from numa_agent.service.refusals import InConflict, InvalidInput, NoCapacity, NotPermitted, Unavailable
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.model import AgentState
from tests.service.test_engine_cgroup import Machine

STEP = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_special"


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


def _caller(proc, identity=None):
    return Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid(),
                  identity=identity if identity is not None else process_identity(proc.pid))


def _task(machine, name="slurm-7-0-0", cpus=2):
    proc = machine.container(STEP)
    me = _caller(proc)
    view = machine.service.admit(AdmitRequest(name=name, cpus=cpus, in_place=True, pinned=True), me)
    return proc, me, view


def _pinned_to(machine, pid):
    return machine.service.enforcer.simulated_pins.get(pid)


def _exit_before_apply(machine, proc):
    """The caller exits between the decision (under the lock) and its pin."""
    unit = machine.service._unit
    real = unit.apply

    def apply(pending):
        if pending.move is not None:
            proc.kill()
            proc.wait()
        return real(pending)

    unit.apply = apply


def test_a_caller_gone_before_its_pin_is_refused_and_books_nothing(machine):
    proc = machine.container(STEP)
    me = _caller(proc)
    _exit_before_apply(machine, proc)
    with pytest.raises(Unavailable, match="exited"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), me)
    assert machine.service.state.workloads == ()
    assert not machine.service.enforcer.exists("pinned/slurm-7-0-0")


def test_a_pid_another_process_took_since_the_caller_asked_is_never_pinned(machine):
    stranger = machine.container(STEP)
    # What the API read off the socket when the caller connected: its identity, not the stranger's.
    me = _caller(stranger, identity="1:1")
    with pytest.raises(Unavailable, match="exited"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), me)
    assert _pinned_to(machine, stranger.pid) is None
    assert machine.service.state.workloads == ()


def test_a_resized_pinned_task_is_pinned_again_to_what_it_holds_now(machine):
    proc, me, view = _task(machine, cpus=2)
    grown = machine.service.resize("slurm-7-0-0", me, cpus=3)
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(grown["cpus"]) and len(CpuSet.parse(grown["cpus"])) == 3
    shrunk = machine.service.resize("slurm-7-0-0", me, cpus=1)
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(shrunk["cpus"]) and len(CpuSet.parse(shrunk["cpus"])) == 1
    assert machine.service.state.workload("slurm-7-0-0").pinned_in == STEP


def test_hotplug_taking_a_pinned_tasks_cpu_pins_it_to_what_is_left(machine):
    proc, _, view = _task(machine, cpus=2)
    lost = min(CpuSet.parse(view["cpus"]))
    old = machine.service.machine
    topology = old.topology
    offline = dataclasses.replace(topology, cpus=tuple(dataclasses.replace(c, online=False) if c.id == lost else c
                                                       for c in topology.cpus))
    machine.service.replace_machine(build_machine(offline, old.policy))
    left = machine.service.state.workload("slurm-7-0-0").booking.cpus
    assert lost not in left and len(left) == 1
    assert _pinned_to(machine, proc.pid) == left


def test_status_shows_a_pinned_task_without_its_shared_cgroups_memory(machine):
    _task(machine)
    status = machine.service.status(memory=True)
    (view,) = status["workloads"]
    assert view["pinned_in"] == STEP and view["engine_cgroup"] is None
    # Its own process's pages (numa_maps), never the shared cgroup's memory.numa_stat.
    assert view["memory_numa"] is None or view["memory_numa"]["source"] == "numa_maps"
    machine.service.metrics_snapshot()


def _checkpoint(machine):
    return machine.service.store.directory


def test_a_restart_after_both_checkpoints_are_lost_adopts_nothing_of_the_shared_cgroup(machine):
    first, _, _ = _task(machine, "slurm-7-0-0")
    _task(machine, "slurm-7-0-1")
    machine.agent.stop()
    for entry in _checkpoint(machine).iterdir():
        if entry.is_file():
            entry.unlink()
    machine.agent = Agent(machine.cfg).start()
    assert machine.service.state.workloads == ()
    # The step's cgroup is still its engine's: booked neither whole nor for a task.
    assert machine.service.engine_index() == []
    second = machine.container(STEP)
    machine.service.admit(AdmitRequest(name="slurm-7-0-2", cpus=2, in_place=True, pinned=True), _caller(second))


def _restart_with(machine, change):
    """Restart after the checkpoint's pinned workloads were changed by `change` (a damaged entry)."""
    directory = machine.service.store.directory
    machine.agent.stop()
    store = CheckpointStore(directory)
    data = store.load()
    data["workloads"] = [{**w, **change(w)} for w in data["workloads"]]
    store.commit(AgentState.from_json(data), snapshot=True)
    store.close()
    machine.agent = Agent(machine.cfg).start()


@pytest.mark.parametrize("garbage", ["", "relative/path", "/../../etc", "/", "/system.slice"])
def test_a_damaged_pinned_in_neither_stops_the_agent_nor_its_views(machine, garbage):
    proc, me, _ = _task(machine)
    _restart_with(machine, lambda w: {"pinned_in": garbage})
    machine.service.status(memory=True)
    machine.service.list_workloads()
    machine.service.metrics_snapshot()
    # Nor an admission beside it.
    other = machine.container(STEP)
    machine.service.admit(AdmitRequest(name="slurm-7-0-1", cpus=2, in_place=True, pinned=True), _caller(other))


@pytest.mark.parametrize("pinned", [False, True])
def test_a_booking_below_a_cgroup_of_pinned_tasks_is_refused_naming_them(machine, pinned):
    _task(machine)
    proc = machine.container(STEP + "/inner")
    with pytest.raises(InConflict, match=r"which holds workloads pinned inside it \(tasks booked apart\)$"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-9", cpus=2, in_place=True, pinned=pinned),
                              _caller(proc))
    assert [w.name for w in machine.service.state.workloads] == ["slurm-7-0-0"]


def test_roots_booking_above_a_cgroup_of_pinned_tasks_is_refused_naming_them(machine):
    _task(machine)
    root = Caller(pid=os.getpid(), uid=0, gid=0)
    with pytest.raises(InConflict, match=r"which holds workloads pinned inside it \(tasks booked apart\)$"):
        machine.service.admit(AdmitRequest(name="ctr-0123456789ab", cpus=2,
                                           cgroup="/system.slice/slurmstepd.scope/job_7"), root)
    assert [w.name for w in machine.service.state.workloads] == ["slurm-7-0-0"]


def test_a_task_moved_out_of_its_shared_cgroup_while_the_agent_was_down_is_released(machine):
    proc, _, _ = _task(machine, "slurm-7-0-0")
    _task(machine, "slurm-7-0-1")
    machine.agent.stop()
    elsewhere = "system.slice/slurmstepd.scope/job_7/step_extern"
    top = machine.top
    top.create(elsewhere)
    top.move_pid(elsewhere, proc.pid)
    machine.agent = Agent(machine.cfg).start()
    assert [w.name for w in machine.service.state.workloads] == ["slurm-7-0-1"]
    assert not machine.service.enforcer.exists("pinned/slurm-7-0-0")


def test_a_stale_record_on_a_cgroup_of_pinned_tasks_is_not_adopted_as_a_whole_booking(machine):
    _task(machine, "slurm-7-0-0")
    pinned = machine.service.state.workload("slurm-7-0-0")
    machine.agent.stop()
    # As a crash might leave it: a whole booking's record, never handed back, on the same cgroup.
    stale = msgspec.structs.replace(pinned, name="slurm-7-0-5", pinned_in=None, cgroup=STEP)
    machine.top.write_xattr(STEP.strip("/"), RECORD_XATTR, encode_record(stale))
    machine.agent = Agent(machine.cfg).start()
    assert [w.name for w in machine.service.state.workloads] == ["slurm-7-0-0"]
    assert machine.top.files.read(machine.top.path(STEP.strip("/")) / "cpuset.cpus").strip() == b""


def test_a_power_cut_between_the_checkpoint_and_the_pin_is_pinned_at_the_restart(machine, monkeypatch):
    # The agent dies after the admission's checkpoint, before the caller's pin.
    monkeypatch.setattr(machine.service.enforcer, "_pin_caller", lambda relpath, pid, spec: None)
    proc, _, view = _task(machine)
    assert _pinned_to(machine, proc.pid) is None
    monkeypatch.undo()
    machine.restart()
    assert machine.service.enforcer.populated("pinned/slurm-7-0-0")
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(view["cpus"])


def test_a_power_cut_between_a_shrinks_checkpoint_and_its_pin_is_pinned_at_the_restart(machine, monkeypatch):
    proc, me, view = _task(machine, cpus=3)
    monkeypatch.setattr(machine.service.enforcer, "_apply_pinned", lambda relpath, before, spec: None)
    shrunk = machine.service.resize("slurm-7-0-0", me, cpus=1)
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(view["cpus"])  # still the three
    monkeypatch.undo()
    machine.restart()
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(shrunk["cpus"])


def _as_user(proc, uid=1000):
    return Caller(pid=proc.pid, uid=uid, gid=uid, identity=process_identity(proc.pid))


def test_a_user_cannot_pin_inside_a_cgroup_holding_another_users_process(machine):
    proc = machine.container(STEP)  # root's, as far as the agent can tell
    with pytest.raises(NotPermitted, match="holds pid"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-0-u1000", cpus=2, in_place=True, pinned=True),
                              _as_user(proc))
    assert machine.service.state.workloads == () and _pinned_to(machine, proc.pid) is None


def test_a_user_cannot_pin_inside_a_cgroup_delegated_to_it(machine):
    proc = machine.container(STEP)
    os.chown(machine.top.path(STEP.strip("/")), 1000, 1000)
    with pytest.raises(NotPermitted, match="delegated to uid 1000"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-0-u1000", cpus=2, in_place=True, pinned=True),
                              _as_user(proc))
    assert machine.service.state.workloads == ()


def test_nobody_pins_inside_the_agents_own_tree(machine):
    proc = machine.container("/numa-agent/shared/_released")
    for caller in (_caller(proc), _as_user(proc)):
        with pytest.raises((InvalidInput, NotPermitted)):
            machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), caller)
    assert machine.service.state.workloads == ()


def test_a_pinned_task_is_booked_inside_its_own_cgroups_cpus_not_only_its_parents(machine):
    # Slurm may narrow the task's own cgroup below what the step's parent grants:
    # a pinned task runs within its own cgroup's cpuset, which the agent never writes.
    proc = machine.container(STEP, parent_cpus="0-7")
    machine.top.write_cpuset(STEP.strip("/"), CpuSet.parse("4-7"), [0, 1])
    view = machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True),
                                 _caller(proc))
    assert CpuSet.parse(view["cpus"]).issubset(CpuSet.parse("4-7"))
    with pytest.raises(NoCapacity, match="inside the CPUs its engine granted"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-1", cpus=3, in_place=True, pinned=True),
                              _caller(machine.container(STEP)))


def test_a_power_cut_before_a_release_by_name_is_enforced_hands_the_task_back_at_the_restart(machine, monkeypatch):
    proc, me, view = _task(machine)
    # The agent dies after the release's checkpoint, before the task is pinned back.
    monkeypatch.setattr(machine.service.enforcer, "_apply_pinned", lambda relpath, before, spec: None)
    monkeypatch.setattr(machine.service.enforcer, "evict", lambda relpath, pid, identity, layout: None)
    machine.service.release("slurm-7-0-0", me)
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(view["cpus"])  # still on the CPUs given back
    monkeypatch.undo()
    machine.restart()
    assert machine.service.state.workloads == ()
    with open("/sys/devices/system/cpu/possible") as f:
        every = CpuSet.parse(f.read().strip())
    assert _pinned_to(machine, proc.pid) == every


def test_a_restart_never_follows_nor_pins_a_process_that_reuses_a_pinned_tasks_pid(machine):
    proc, _, _ = _task(machine)
    # As if the task exited while the agent was down and another process took its pid.
    _restart_with(machine, lambda w: {"pid_identity": "1:1"})
    assert machine.service.state.workloads == ()
    assert not machine.service.enforcer.exists("pinned/slurm-7-0-0")
    assert _pinned_to(machine, proc.pid) is None


def test_a_released_task_pinned_again_under_another_name_keeps_its_new_pin_as_the_pool_changes(machine):
    proc, me, _ = _task(machine, "slurm-7-0-0")
    machine.service.release("slurm-7-0-0", me)  # by name while it runs: revoked
    again = machine.service.admit(AdmitRequest(name="slurm-7-0-0-again", cpus=2, in_place=True, pinned=True), me)
    other = machine.container("/system.slice/other.scope")
    machine.service.admit(AdmitRequest(name="other", cpus=2), _caller(other))  # the pool changes
    assert _pinned_to(machine, proc.pid) == CpuSet.parse(again["cpus"])


def test_a_power_cut_in_the_middle_of_a_pin_is_finished_at_the_restart(machine, monkeypatch):
    import subprocess
    import sys

    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    machine.procs.append(proc)
    machine.container(STEP)  # makes the cgroup (and a task of its own)
    machine.top.move_pid(STEP.strip("/"), proc.pid)
    while len(os.listdir(f"/proc/{proc.pid}/task")) < 2:
        os.sched_yield()
    enforcer = machine.service.enforcer

    def main_thread_only(relpath, pid, spec):  # the agent dies after the first thread's pin
        enforcer.pins.track(relpath, pid, spec.record.pid_identity)
        enforcer._record_pin(pid, spec.cpus.ids())

    monkeypatch.setattr(enforcer, "_pin_caller", main_thread_only)
    view = machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), _caller(proc))
    monkeypatch.undo()
    booked = CpuSet.parse(view["cpus"])
    # What a restart does with the tree as the kernel kept it (the pins made survive, as
    # affinity does): the whole layout applied from nothing, the task followed again.
    enforcer.apply({}, machine.service.layout)
    for tid in map(int, os.listdir(f"/proc/{proc.pid}/task")):
        assert _pinned_to(machine, tid) == booked


def test_a_release_by_name_staged_before_the_admissions_pin_is_applied_after_it(machine):
    import threading

    proc = machine.container(STEP)
    me = _caller(proc)
    unit = machine.service._unit
    real_apply, real_stage = unit.apply, unit.stage
    admission_staged, release_staged, go = threading.Event(), threading.Event(), threading.Event()

    def apply(pending):
        if pending.move is not None:  # the admission: held until the release is staged behind it
            admission_staged.set()
            go.wait()
        return real_apply(pending)

    def stage(new_state, *args, **kwargs):
        pending = real_stage(new_state, *args, **kwargs)
        if admission_staged.is_set() and pending.move is None:
            release_staged.set()
        return pending

    unit.apply, unit.stage = apply, stage
    errors = []

    def run(call):
        try:
            call()
        except Exception as exc:  # reported below
            errors.append(exc)

    admitting = threading.Thread(target=run, args=(lambda: machine.service.admit(
        AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, pinned=True), me),))
    admitting.start()
    admission_staged.wait()
    releasing = threading.Thread(target=run, args=(lambda: machine.service.release("slurm-7-0-0", me),))
    releasing.start()
    release_staged.wait()
    go.set()
    admitting.join()
    releasing.join()
    assert errors == []
    assert machine.service.state.workloads == ()
    assert not machine.service.enforcer.exists("pinned/slurm-7-0-0")
    with open("/sys/devices/system/cpu/possible") as f:
        assert _pinned_to(machine, proc.pid) == CpuSet.parse(f.read().strip())


def test_a_restart_in_the_affinity_fallback_still_follows_a_pinned_task(machine):
    """No cgroup v2 for the agent this time: it cannot tell the task's cgroup, only
    follow its process, as it did before any check of the cgroup."""
    from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
    from numa_agent.service.recovery import restore

    _task(machine, "slurm-7-0-0")
    directory, booked_on = machine.service.store.directory, machine.service.machine
    machine.agent.stop()
    store, fallback = CheckpointStore(directory), AffinityEnforcer("no cgroup v2 (a test)")
    try:
        state, report = restore(booked_on, store, fallback)
        assert [w.name for w in state.workloads] == ["slurm-7-0-0"] and report.released == ()
        assert fallback.populated("pinned/slurm-7-0-0")
    finally:
        fallback.close()
        store.close()
    machine.agent = Agent(machine.cfg).start()  # for the fixture's close
