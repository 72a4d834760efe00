"""Rebuilding workloads from the processes numa-run marked (affinity fallback):
the pure rule, the /proc scan on a written tree and on real processes, and the
held (quarantined) entries through restore, status, health and release."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.mark import issue_mark
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.marked import MarkedProcess, scan_marked
from numa_agent.service.rebuild import reconcile
from numa_agent.state.model import AgentState, Booking, Workload
from tests.support.synthetic import make_topology

BOOT = "0d5c5f1e-0000-4000-8000-000000000000"
KEY = bytes(range(32))  # the agent's mark key in these tests
ROOT = Caller(pid=os.getpid(), uid=0, gid=0)
USER = Caller(pid=os.getpid(), uid=1000, gid=1000)


def machine_of(cpus=8, reserved=1, **policy):
    topo = make_topology(sockets=1, cores_per_node=cpus, threads_per_core=1,
                         memory_per_node_bytes=8 << 30)
    return build_machine(topo, PolicyConfig(reserved_cpu_count=reserved, **policy))


def marked(pid, name, cpus, env_cpus="same", start=None, uid=1000, ppid=1, mems="0", devices="",
           env_exclusive=None, mark="issued", cgroup=None):
    """As numa-run started it: the mark the agent issued for it, or (a child,
    ppid not 1) inherited from its parent, started at tick = pid by default."""
    affinity = CpuSet.parse(cpus)
    start_time = pid if start is None else start
    if mark == "issued":
        mark = issue_mark(KEY, name, pid, start_time) if ppid == 1 else issue_mark(KEY, name, ppid, ppid)
    return MarkedProcess(pid=pid, ppid=ppid, name=name, uid=uid,
                         start_time=start_time, identity=f"{BOOT}:{pid}",
                         affinity=affinity, env_cpus=cpus if env_cpus == "same" else env_cpus,
                         env_mems=mems, env_devices=devices, env_exclusive=env_exclusive, mark=mark,
                         cgroup=cgroup)


# ---- the rule -------------------------------------------------------------------------

def test_an_unknown_marked_process_is_rebuilt_exclusive_from_its_affinity():
    m = machine_of()  # CPU 0 reserved
    out = reconcile(m, AgentState(), [marked(100, "db", "2-3", uid=1234)], key=KEY)
    w = out.state.workload("db")
    assert out.rebuilt == ("db",) and out.held == ()
    assert w.booking.cpus == CpuSet.parse("2-3") and not w.shared
    assert (w.owner_uid, w.pid, w.pid_identity) == (1234, 100, f"{BOOT}:100")
    assert w.booking.mems == (0,)
    assert w.request["rebuilt"] == "partial" and "memory" in w.request["unknown"]


def test_known_workloads_and_children_are_not_rebuilt_again():
    m = machine_of()
    state = AgentState(workloads=(Workload(name="db", owner_uid=0, pid=100,
                                           booking=Booking(cpus=CpuSet.parse("2-3"))),))
    out = reconcile(m, state, [marked(100, "db", "2-3"), marked(101, "db", "2-3", ppid=100),
                               marked(200, "web", "4"), marked(201, "web", "4", ppid=200)], key=KEY)
    assert out.rebuilt == ("web",)
    assert out.state.workload("web").pid == 200  # the oldest of its name, not its child


def test_a_reserved_cpu_in_the_affinity_means_the_shared_pool():
    m = machine_of()
    out = reconcile(m, AgentState(), [marked(100, "side", "0-7")], key=KEY)
    w = out.state.workload("side")
    assert out.rebuilt == ("side",) and w.shared and not w.booking.cpus


def test_a_cpu_held_by_another_workload_stays_with_it_and_is_reported(caplog):
    m = machine_of()
    state = AgentState(workloads=(Workload(name="db", owner_uid=0, pid=100,
                                           booking=Booking(cpus=CpuSet.parse("2-3"))),))
    out = reconcile(m, state, [marked(200, "web", "3-4")], key=KEY)
    assert out.state.workload("web").booking.cpus == CpuSet.parse("4")
    assert out.state.workload("db").booking.cpus == CpuSet.parse("2-3")
    errors = [text for level, text in out.messages if level == logging.ERROR]
    assert errors and "CPUs 3 are already booked to db" in errors[0] and "pid 200" in errors[0]


def test_two_processes_on_the_same_cpus_are_never_double_booked():
    m = machine_of()
    out = reconcile(m, AgentState(), [marked(100, "a", "2-3"), marked(200, "b", "2-3")], key=KEY)
    assert out.rebuilt == ("a",) and out.held == ("b",)
    assert out.state.workload("b").booking.cpus == CpuSet()
    assert "booked to a" in out.state.workload("b").request["reason"]


@pytest.mark.parametrize("case, processes, reason", [
    ("whole pool, no reservation", [marked(100, "x", "0-7")], "whole shared pool"),
    ("moved since admission", [marked(100, "x", "2-3", env_cpus="2-5")], "differs from the CPUs it was given"),
    ("not a workload name", [marked(100, "../etc", "2")], "not a workload name"),
])
def test_what_cannot_be_attributed_is_held(case, processes, reason):
    m = machine_of(reserved=0) if "pool" in case else machine_of()
    out = reconcile(m, AgentState(), processes, key=KEY)
    assert out.rebuilt == () and len(out.held) == 1
    w = out.state.workload(out.held[0])
    assert w.quarantined and w.owner_uid == 0 and w.pid is None
    assert reason in w.request["reason"] and w.request["pid"] == 100
    assert [level for level, _ in out.messages] == [logging.ERROR]
    assert "pid 100" in out.messages[0][1] and "numa-agent release" in out.messages[0][1]


def test_the_whole_pool_is_held_not_handed_out():
    m = machine_of(reserved=0)
    out = reconcile(m, AgentState(), [marked(100, "x", "0-7")], key=KEY)
    assert out.state.exclusive_cpus() == CpuSet.parse("0-7")


# ---- the /proc scan -------------------------------------------------------------------

def write_proc(root, pid, env, cpus="0-7", uid=1000, start=500, ppid=1, comm="sleep", sign=True):
    """A /proc/PID; a marked one (`sign`) with the mark the agent issued for it."""
    if sign and "NUMA_AGENT_WORKLOAD" in env and "NUMA_AGENT_MARK" not in env:
        env = {**env, "NUMA_AGENT_MARK": issue_mark(KEY, env["NUMA_AGENT_WORKLOAD"], pid, start)}
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                              f"Cpus_allowed_list:\t{cpus}\n")


def make_proc(tmp_path):
    root = tmp_path / "proc"
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (root / "self").mkdir()
    return root


@pytest.fixture
def proc(tmp_path):
    return make_proc(tmp_path)


def test_scan_reads_marked_processes_from_a_written_tree(proc):
    write_proc(proc, 300, {"PATH": "/bin", "NUMA_AGENT_WORKLOAD": "db", "NUMA_AGENT_CPUS": "2-3",
                           "NUMA_AGENT_MEMS": "0"}, cpus="2-3", uid=1234, start=900)
    write_proc(proc, 301, {"NUMA_AGENT_WORKLOAD": "db"}, cpus="2-3", start=950, ppid=300)
    write_proc(proc, 400, {"PATH": "/bin"})  # not marked
    (proc / "500").mkdir()  # exited while scanned: no files
    found = scan_marked(str(proc))
    assert [(p.pid, p.name, p.uid, p.start_time, p.ppid) for p in found] == [
        (300, "db", 1234, 900, 1), (301, "db", 1000, 950, 300)]
    assert found[0].affinity == CpuSet.parse("2-3") and found[0].env_cpus == "2-3"
    assert found[0].identity == f"{BOOT}:900" and found[1].env_cpus is None


def test_scan_finds_a_real_marked_process():
    p = subprocess.Popen(["sleep", "30"], env={**os.environ, "NUMA_AGENT_WORKLOAD": "real-one",
                                               "NUMA_AGENT_CPUS": "0"})
    try:
        found = [m for m in scan_marked() if m.pid == p.pid]
        assert len(found) == 1 and found[0].name == "real-one"
        assert found[0].affinity == CpuSet(os.sched_getaffinity(p.pid))
        assert found[0].uid == os.geteuid()
    finally:
        p.kill()
        p.wait()


def test_only_the_affinity_enforcer_scans_every_marked_process(tmp_path):
    from numa_agent.enforcement.cgroup import CgroupV2
    from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
    from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root
    root = make_simulated_cgroup_root(tmp_path / "cg", CpuSet.parse("0-3"), [0])
    cgroup = CgroupEnforcer(CgroupV2(root, SimulatedCgroupfs(root)))
    affinity = AffinityEnforcer("test", proc_root=str(tmp_path / "no-proc"))
    try:
        # The cgroup enforcer's are only those in engines' cgroups (tests/service/test_pinned_tasks.py):
        # none where its root is the whole hierarchy.
        assert cgroup.live_marked() == [] and affinity.live_marked() == []
    finally:
        cgroup.close()
        affinity.close()


def test_a_task_pinned_in_an_engines_cgroup_is_rebuilt_pinned_there_and_only_exclusive():
    m = machine_of(reserved=0)
    step = "/slurmstepd.scope/job_5/step_0/user/task_special"
    out = reconcile(m, AgentState(), [marked(100, "slurm-5-0-0-u0", "2-3", env_exclusive=True, cgroup=step),
                                      marked(101, "slurm-5-0-1-u0", "0-7", env_exclusive=False, cgroup=step),
                                      marked(102, "slurm-5-0-2-u0", "4-7", env_cpus="4-5", cgroup=step)],
                    key=KEY)
    w = out.state.workload("slurm-5-0-0-u0")
    assert out.rebuilt == ("slurm-5-0-0-u0",) and w.pinned_in == step and w.cgroup is None
    assert w.booking.cpus == CpuSet.parse("2-3") and w.pid == 100
    # A shared one runs on what its engine gave it, one that moved is not the agent's to
    # attribute: neither is rebuilt, and nothing is held for an operator outside the tree.
    assert out.held == () and [x.name for x in out.state.workloads] == ["slurm-5-0-0-u0"]
    assert any("slurm-5-0-1-u0" in text and "not rebuilt" in text for _, text in out.messages)


def test_numa_run_saying_shared_or_exclusive_settles_what_the_affinity_cannot():
    m = machine_of(reserved=0)
    shared = reconcile(m, AgentState(), [marked(100, "side", "0-7", env_exclusive=False)], key=KEY)
    assert shared.rebuilt == ("side",) and shared.held == () and shared.state.workload("side").shared
    assert shared.state.exclusive_cpus() == CpuSet()  # nothing held: the pool stays the pool
    moved = reconcile(machine_of(), AgentState(), [marked(100, "side", "2-5", env_cpus="2-7", env_exclusive=False)], key=KEY)
    assert moved.rebuilt == ("side",) and moved.state.workload("side").shared
    whole = reconcile(m, AgentState(), [marked(100, "big", "0-7", env_cpus="0-7", env_exclusive=True)], key=KEY)
    assert whole.rebuilt == ("big",) and whole.state.workload("big").booking.cpus == CpuSet.parse("0-7")


def test_numa_run_marks_exclusive_and_shared_workloads():
    from numa_agent.cli.numa_run import workload_env

    assert workload_env({"name": "a", "cpus": "2", "exclusive": True})["NUMA_AGENT_EXCLUSIVE"] == "1"
    assert workload_env({"name": "b", "cpus": "0-7", "exclusive": False})["NUMA_AGENT_EXCLUSIVE"] == "0"


def test_scan_reads_the_exclusive_flag(proc):
    write_proc(proc, 300, {"NUMA_AGENT_WORKLOAD": "a", "NUMA_AGENT_EXCLUSIVE": "1"}, cpus="2")
    write_proc(proc, 301, {"NUMA_AGENT_WORKLOAD": "b", "NUMA_AGENT_EXCLUSIVE": "0"})
    write_proc(proc, 302, {"NUMA_AGENT_WORKLOAD": "c"})
    assert {p.name: p.env_exclusive for p in scan_marked(str(proc))} == {"a": True, "b": False, "c": None}


def test_a_shared_workload_squeezed_onto_the_reserved_cpus_is_rebuilt_shared():
    """Every unreserved CPU exclusive to others: the shared pool is the reserved
    CPUs alone, and a shared workload there is still a shared workload."""
    m = machine_of()
    reserved = m.reserved_cpus.format()
    for flag in (False, None):
        out = reconcile(m, AgentState(), [marked(100, "side", reserved, env_exclusive=flag)], key=KEY)
        assert out.rebuilt == ("side",) and out.held == () and out.state.workload("side").shared
