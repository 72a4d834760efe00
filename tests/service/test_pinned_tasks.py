"""Tasks that share one engine cgroup, each booked apart (a Slurm step's tasks in
`.../user/task_special`): each is pinned inside the cgroup, which stays its
engine's, followed by its process, released when that exits, and kept across a
restart. On the simulated hierarchy, where a pin is recorded, not made."""

import os

import pytest

from numa_agent.api.errors import BadRequest
from numa_agent.api.validation import parse_admit_request
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.record import RECORD_XATTR
from numa_agent.service.refusals import InConflict, NoCapacity
from numa_agent.service.requests import AdmitRequest
from tests.service.test_engine_cgroup import Machine
from tests.support.agent_process import wait_for

STEP = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_special"


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


def _task(machine, name="slurm-7-0-0"):
    """A task in the step's one cgroup, and its admission pinned inside it."""
    proc = machine.container(STEP)
    me = Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid())
    view = machine.service.admit(AdmitRequest(name=name, cpus=2, in_place=True, pinned=True), me)
    return proc, me, view


def _pinned_to(machine, pid):
    return machine.service.enforcer.simulated_pins.get(pid)


def test_each_task_of_a_shared_cgroup_is_pinned_to_cpus_of_its_own(machine):
    first, _, one = _task(machine, "slurm-7-0-0")
    second, _, two = _task(machine, "slurm-7-0-1")
    a, b = CpuSet.parse(one["cpus"]), CpuSet.parse(two["cpus"])
    assert len(a) == len(b) == 2 and not a & b
    assert _pinned_to(machine, first.pid) == a and _pinned_to(machine, second.pid) == b
    # The cgroup stays its engine's: no cpuset written there, no record, both tasks still in it.
    rel = STEP.strip("/")
    top = machine.top
    assert top.files.read(top.path(rel) / "cpuset.cpus").strip() == b""
    assert top.read_xattr(rel, RECORD_XATTR) is None
    assert sorted(machine.top.procs(rel)) == sorted([first.pid, second.pid])
    w = machine.service.state.workload("slurm-7-0-0")
    assert w.pinned_in == STEP and w.cgroup is None
    listed = {v["name"]: v for v in machine.service.list_workloads()}
    assert listed["slurm-7-0-1"]["pinned_in"] == STEP and listed["slurm-7-0-1"]["engine_cgroup"] is None


def test_a_pinned_task_is_released_when_its_process_exits_and_its_cpus_come_back(machine):
    first, _, one = _task(machine, "slurm-7-0-0")
    _task(machine, "slurm-7-0-1")
    first.kill()
    first.wait()
    wait_for(lambda: machine.service.state.workload("slurm-7-0-0") is None)
    assert machine.service.state.workload("slurm-7-0-1") is not None
    # Its CPUs are free again: nobody holds them.
    held = CpuSet.union_of(w.booking.cpus for w in machine.service.state.workloads)
    assert len(held) == 2 and not held & CpuSet.parse(one["cpus"])


def test_the_cgroup_cannot_be_booked_whole_while_tasks_are_pinned_inside_it_nor_the_reverse(machine):
    _, me, _ = _task(machine)
    with pytest.raises(InConflict, match="pinned inside it"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-9", cpus=2, in_place=True), me)
    other = "/system.slice/slurmstepd.scope/job_8/step_0/user/task_special"
    proc = machine.container(other)
    them = Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid())
    machine.service.admit(AdmitRequest(name="slurm-8-0-0", cpus=2, in_place=True), them)
    with pytest.raises(InConflict, match="already holds workload slurm-8-0-0"):
        machine.service.admit(AdmitRequest(name="slurm-8-0-1", cpus=2, in_place=True, pinned=True), them)


def test_a_restarted_agent_keeps_the_pinned_tasks_and_follows_their_processes(machine):
    first, _, one = _task(machine, "slurm-7-0-0")
    second, _, two = _task(machine, "slurm-7-0-1")
    machine.restart()
    kept = {w.name: w for w in machine.service.state.workloads}
    assert set(kept) == {"slurm-7-0-0", "slurm-7-0-1"}
    assert kept["slurm-7-0-0"].booking.cpus == CpuSet.parse(one["cpus"])
    assert machine.service.enforcer.populated("pinned/slurm-7-0-1")
    second.kill()
    second.wait()
    wait_for(lambda: machine.service.state.workload("slurm-7-0-1") is None)
    assert machine.service.state.workload("slurm-7-0-0") is not None


def test_released_by_name_a_running_task_is_handed_back_to_its_cgroups_cpus(machine):
    first, me, one = _task(machine)
    machine.service.release("slurm-7-0-0", me)
    assert machine.service.state.workloads == ()
    # Every CPU asked: the kernel bounds it by the cpuset of the cgroup it is in.
    with open("/sys/devices/system/cpu/possible") as f:
        every = CpuSet.parse(f.read().strip())
    assert _pinned_to(machine, first.pid) == every
    assert not machine.service.enforcer.populated("pinned/slurm-7-0-0")  # no longer followed


@pytest.mark.parametrize("body,why", [
    ({"name": "x", "cpus": 2, "pinned": True}, "in_place"),
    ({"name": "x", "shared": True, "in_place": True, "pinned": True}, "exclusive CPUs"),
    ({"name": "x", "memory_bytes": 1 << 20, "in_place": True, "pinned": True}, "exclusive CPUs"),
])
def test_pinned_is_for_exclusive_cpus_in_the_callers_own_cgroup(body, why):
    import msgspec

    with pytest.raises(BadRequest, match=why):
        parse_admit_request(msgspec.json.encode(body))


def test_start_up_reads_the_marked_processes_of_engines_cgroups_only(machine):
    from tests.support.marks import give_mark, spawn_awaiting_mark

    procs = []
    for where in (STEP, None, "wl-x"):  # an engine's cgroup, outside the hierarchy, the agent's own tree
        proc = spawn_awaiting_mark(["sleep", "60"], {"NUMA_AGENT_WORKLOAD": f"t{len(procs)}"})
        procs.append(proc)
        machine.procs.append(proc)
        if where == "wl-x":
            enforcer = machine.service.enforcer
            enforcer.cgroup.create("wl-x", exist_ok=True)
            enforcer.cgroup.move_pid("wl-x", proc.pid)
        elif where is not None:
            machine.container(STEP).kill()  # (makes the cgroups)
            machine.top.move_pid(STEP.strip("/"), proc.pid)
        give_mark(proc, "token")
    found = machine.service.enforcer.live_marked()
    assert [(p.pid, p.cgroup) for p in found] == [(procs[0].pid, STEP)]


def test_a_refusal_of_a_pinned_task_names_its_own_cgroup_whose_cpuset_bounds_it(machine):
    _task(machine)
    proc = machine.container(STEP)
    me = Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid())
    with pytest.raises(NoCapacity, match=f"the cpuset of cgroup {STEP}\\)"):
        machine.service.admit(AdmitRequest(name="slurm-7-0-1", cpus=64, in_place=True, pinned=True), me)


def test_a_released_process_booked_again_is_no_longer_revoked_even_after_a_restart(machine):
    proc, me, _ = _task(machine, "slurm-7-0-0")
    machine.service.release("slurm-7-0-0", me)  # by name while it runs: its release stands
    assert [r.name for r in machine.service.state.revoked] == ["slurm-7-0-0"]
    machine.service.admit(AdmitRequest(name="slurm-7-0-0-again", cpus=2, in_place=True, pinned=True), me)
    # Its process is the new workload's now: nothing hands it back, nor skips its rebuild.
    assert machine.service.state.revoked == ()
    machine.restart()  # the revocations' copy beside the mark key does not bring it back
    assert machine.service.state.revoked == ()
    assert machine.service.state.workload("slurm-7-0-0-again").pid == proc.pid
