"""What an admission costs must depend on what changes, not on how many
workloads exist: with many live workloads, a shared admission writes and
reads back only its own cgroup, an exclusive one the pool and its own; a
plain shared workload inherits the pool (empty cpuset.cpus) and follows it."""

from __future__ import annotations

import os
import subprocess

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement import affinity_enforcer as enforcer_module
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.plan import desired_layout
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.support.processes import kill_all
from tests.support.simulated_service import cg_file
from tests.support.synthetic import make_topology

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
LIVE = 30


class CountingFiles(SimulatedCgroupfs):
    """The simulated tree, counting which cgroups' files are written and read."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str]] = []
        self.reads: list[tuple[str, str]] = []

    def _rel(self, file) -> str:
        return os.path.relpath(file.parent, self.root)

    def write(self, file, value):
        self.writes.append((self._rel(file), file.name))
        return super().write(file, value)

    def read(self, file):
        self.reads.append((self._rel(file), file.name))
        return super().read(file)

    def reset(self) -> None:
        self.writes.clear()
        self.reads.clear()


def make_machine():
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    return build_machine(topo, PolicyConfig())


@pytest.fixture
def cgroup_service(tmp_path):
    machine = make_machine()
    root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    files = CountingFiles(root)
    enforcer = CgroupEnforcer(CgroupV2(root, files))
    store = CheckpointStore(tmp_path / "state")
    enforcer.setup()
    state, _ = restore(machine, store, enforcer)
    service = AgentService(machine, store, enforcer)
    service.install(state)
    yield service, files, root
    enforcer.close()


def fill(service, count):
    for i in range(count):
        service.admit(AdmitRequest(name=f"s{i:03d}", shared=True), ME)


def test_a_plain_shared_workload_inherits_the_pool(cgroup_service):
    service, files, root = cgroup_service
    service.admit(AdmitRequest(name="plain", shared=True), ME)
    service.admit(AdmitRequest(name="bound", shared=True, cpunodebind=[1]), ME)
    pool = CpuSet.parse(cg_file(root, "shared", "cpuset.cpus"))
    assert cg_file(root, "shared/plain", "cpuset.cpus") == ""
    assert CpuSet.parse(cg_file(root, "shared/plain", "cpuset.cpus.effective")) == pool
    # Narrower than its parent: written explicitly.
    bound = CpuSet.parse(cg_file(root, "shared/bound", "cpuset.cpus"))
    assert bound == pool & service.machine.cpus_of_nodes((1,))
    # The pool shrinks: the inheriting workload follows without a write.
    files.reset()
    out = service.admit(AdmitRequest(name="x", cpus=2), ME)
    taken = CpuSet.parse(out["cpus"])
    assert ("shared/plain", "cpuset.cpus") not in files.writes
    assert CpuSet.parse(cg_file(root, "shared/plain", "cpuset.cpus.effective")) == pool - taken
    assert CpuSet.parse(cg_file(root, "shared/bound", "cpuset.cpus")) == bound - taken
    service.release("x", ME)
    assert CpuSet.parse(cg_file(root, "shared/plain", "cpuset.cpus.effective")) == pool


def test_a_shared_admission_writes_and_reads_back_only_its_own_cgroup(cgroup_service):
    service, files, root = cgroup_service
    fill(service, LIVE)
    files.reset()
    service.admit(AdmitRequest(name="new", shared=True), ME)
    written = {rel for rel, _ in files.writes if rel != "."}
    assert written == {"shared/new"}
    effective_reads = {rel for rel, name in files.reads if name == "cpuset.cpus.effective"}
    assert effective_reads == {"shared/new"}
    files.reset()
    service.release("new", ME)
    # The test's own process is still in it: it moves to shared/_released.
    assert {rel for rel, _ in files.writes if rel not in (".", "shared/new")} <= {"shared/_released"}
    assert not (root / "shared" / "new").exists()
    assert service._layout == desired_layout(service.machine, service.state)


def test_an_exclusive_admission_writes_the_pool_and_its_own_cgroup_only(cgroup_service):
    service, files, root = cgroup_service
    fill(service, LIVE)
    files.reset()
    service.admit(AdmitRequest(name="x", cpus=1), ME)
    written = {rel for rel, _ in files.writes if rel != "."}
    assert written <= {"agent", "shared", "shared/_released", "wl-x"} and "wl-x" in written
    effective_reads = {rel for rel, name in files.reads if name == "cpuset.cpus.effective"}
    assert not any(rel.startswith("shared/s") for rel in effective_reads)
    assert service._layout == desired_layout(service.machine, service.state)


def test_a_shared_admission_pins_nobody_else_in_the_affinity_fallback(tmp_path, monkeypatch, sleepers):
    from numa_agent.discovery.sysfs import read_topology

    machine = build_machine(read_topology("/"), PolicyConfig())  # affinity pins on this machine's CPUs
    if len(machine.usable_cpus) < 2:
        pytest.skip("needs two usable CPUs")
    enforcer = AffinityEnforcer("test")
    service = AgentService(machine, CheckpointStore(tmp_path / "state"), enforcer)
    service.install(service.state)
    pinned: list[tuple[int, bool]] = []
    real_pin = enforcer_module._pin_trees

    def pin(pids, cpus, descendants=True, finder=None, **kwargs):
        pinned.extend((pid, descendants) for pid in pids)
        return real_pin(pids, cpus, descendants, finder, **kwargs)

    monkeypatch.setattr(enforcer_module, "_pin_trees", pin)
    callers = [sleepers() for _ in range(5)]
    for i, caller in enumerate(callers):
        service.admit(AdmitRequest(name=f"s{i}", shared=True), caller)
    pinned.clear()
    newcomer = sleepers()
    service.admit(AdmitRequest(name="new", shared=True), newcomer)
    # Only the caller's own process; no scan of the machine for descendants.
    assert pinned == [(newcomer.pid, False)]
    # An exclusive admission shrinks the pool: each shared workload is re-pinned.
    pinned.clear()
    service.admit(AdmitRequest(name="x", cpus=1), sleepers())
    assert {pid for pid, _ in pinned} >= {c.pid for c in callers} | {newcomer.pid}
    pool = service.status()["shared_pool"]
    assert all(CpuSet(os.sched_getaffinity(c.pid)) == CpuSet.parse(pool) for c in callers)
    enforcer.close()


def test_the_pool_followers_move_as_one_plan_before_the_new_holder(tmp_path, monkeypatch, sleepers):
    """An exclusive admission in the affinity fallback plans only what changed (not a step
    per workload on the pool), pins the pool's followers before the new holder takes its
    CPU, and skips a follower whose process has exited."""
    from numa_agent.discovery.sysfs import read_topology

    machine = build_machine(read_topology("/"), PolicyConfig())
    if len(machine.usable_cpus) < 2:
        pytest.skip("needs two usable CPUs")
    enforcer = AffinityEnforcer("test")
    service = AgentService(machine, CheckpointStore(tmp_path / "state"), enforcer)
    service.install(service.state)
    callers = [sleepers() for _ in range(6)]
    for i, caller in enumerate(callers):
        service.admit(AdmitRequest(name=f"s{i}", shared=True), caller)
    gone = subprocess.Popen(["sleep", "60"])
    service.admit(AdmitRequest(name="gone", shared=True), Caller(pid=gone.pid, uid=1000, gid=1000))
    gone.kill()
    gone.wait()  # exited, not yet released: its pidfd says so

    planned: list = []
    pinned: list[int] = []
    real_order, real_pin = enforcer_module.order_changes, enforcer_module._pin_trees

    def order(old, new, only=None):
        planned.append(only)
        return real_order(old, new, only)

    def pin(pids, cpus, descendants=True, finder=None, **kwargs):
        pinned.extend(pids)
        return real_pin(pids, cpus, descendants, finder, **kwargs)

    monkeypatch.setattr(enforcer_module, "order_changes", order)
    monkeypatch.setattr(enforcer_module, "_pin_trees", pin)
    holder = sleepers()
    service.admit(AdmitRequest(name="x", cpus=1), holder)
    assert planned and all(only is not None and not any(rel.startswith("shared/s") for rel in only)
                           for only in planned)
    assert set(pinned) == {c.pid for c in callers} | {holder.pid}  # not the exited one
    assert pinned.index(holder.pid) > max(pinned.index(c.pid) for c in callers)
    pool = CpuSet.parse(service.status()["shared_pool"])
    assert all(CpuSet(os.sched_getaffinity(c.pid)) == pool for c in callers)
    enforcer.close()


class FakeProc:
    """A process table that changes while it is being pinned: `later` maps a
    task to what appears once that task is pinned (threads made, children
    forked, by it just before), as a program would that makes threads while
    it is re-pinned. Records each pin; `gone` tasks exit before theirs."""

    def __init__(self, threads, children=None, later=None, gone=()):
        self.threads_of = {pid: list(tids) for pid, tids in threads.items()}
        self.children_of = dict(children or {})
        self.later = dict(later or {})
        self.gone = set(gone)
        self.pins: list[int] = []
        self.listings = 0

    def setaffinity(self, tid, ids):
        if tid in self.gone:
            raise ProcessLookupError(tid)
        self.pins.append(tid)
        for pid, new_threads, new_children in self.later.pop(tid, ()):
            self.threads_of.setdefault(pid, []).extend(new_threads)
            self.children_of.setdefault(tid, []).extend(new_children)

    def threads(self, pid):
        self.listings += 1
        return list(self.threads_of.get(pid, []))

    def children(self, pid, tid):
        return list(self.children_of.get(tid, []))


def pin_fake(proc, pids, descendants=True):
    return enforcer_module._pin_trees(pids, CpuSet([0]), descendants, finder=proc,
                                      setaffinity=proc.setaffinity)


def test_a_process_of_one_thread_costs_one_pin_and_two_listings():
    # The second listing, once the whole tree is pinned: what was in flight at the pin.
    proc = FakeProc({10: [10], 11: [11]})
    assert pin_fake(proc, [10, 11]) == 2
    assert sorted(proc.pins) == [10, 11] and proc.listings == 4


def test_threads_and_children_made_while_the_pool_is_re_pinned_are_pinned_too():
    # 10 has threads 10 and 11; 11, before its pin, makes thread 12, which
    # before its own makes 13 and forks 20; 10 forked 30 (threads 30, 31).
    proc = FakeProc({10: [10, 11], 30: [30, 31]}, children={10: [30]},
                    later={11: [(10, [12], [])], 12: [(10, [13], [20])], 20: [(20, [21], [])]})
    proc.threads_of[20] = [20]
    pin_fake(proc, [10])
    assert sorted(proc.pins) == [10, 11, 12, 13, 20, 21, 30, 31]
    assert len(proc.pins) == len(set(proc.pins))  # each once


def test_a_task_that_exits_mid_repin_is_skipped_and_the_rest_pinned():
    proc = FakeProc({10: [10, 11, 12], 20: [20]}, children={12: [20]}, gone={11, 99})
    pin_fake(proc, [10, 99])  # 99: exited before the apply reached it
    assert sorted(proc.pins) == [10, 12, 20]


def test_the_caller_alone_is_pinned_without_its_descendants():
    proc = FakeProc({10: [10, 11]}, children={10: [20]})
    proc.threads_of[20] = [20]
    pin_fake(proc, [10], descendants=False)
    assert sorted(proc.pins) == [10, 11]


def test_a_real_tree_making_threads_while_re_pinned_ends_on_the_new_cpus():
    import subprocess
    import sys
    import time

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to move between")
    # A process that keeps starting short-lived threads, and a child that does the same.
    churn = ("import threading, time, subprocess, sys\n"
             "if sys.argv[1] == 'parent': subprocess.Popen([sys.executable, '-c', sys.argv[2], 'child', ''])\n"
             "while True:\n"
             "    [threading.Thread(target=time.sleep, args=(0.05,)).start() for _ in range(4)]\n"
             "    time.sleep(0.005)\n")
    proc = subprocess.Popen([sys.executable, "-c", churn, "parent", churn])
    try:
        deadline = time.monotonic() + 10
        finder = enforcer_module._Tasks()
        while not finder.children(proc.pid, proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        target = CpuSet([allowed[-1]])
        for _ in range(5):
            enforcer_module._pin_trees([proc.pid], target)
            tasks = []
            for pid in (proc.pid, *finder.children(proc.pid, proc.pid)):
                tasks += finder.threads(pid)
            for tid in tasks:
                try:
                    assert CpuSet(os.sched_getaffinity(tid)) == target, tid
                except ProcessLookupError:
                    pass  # a short-lived thread that ended
            target = CpuSet([allowed[0]]) if target == CpuSet([allowed[-1]]) else CpuSet([allowed[-1]])
    finally:
        kill_all([*enforcer_module._Tasks().children(proc.pid, proc.pid), proc.pid])
        proc.wait()


def test_without_children_files_one_scan_serves_every_tree_of_an_apply(tmp_path, monkeypatch):
    # A /proc of a kernel without CONFIG_PROC_CHILDREN: 10 -> 11 -> 13, and 12 on its own.
    proc = tmp_path / "proc"
    for pid, ppid, threads in ((10, 1, (10,)), (11, 10, (11, 14)), (12, 1, (12,)), (13, 11, (13,))):
        for tid in threads:
            (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (a (b) c) S {ppid} {pid} {pid} 0 -1\n")
    scans = []
    real_scan = enforcer_module._scan_parents
    monkeypatch.setattr(enforcer_module, "_scan_parents", lambda p: scans.append(p) or real_scan(p))
    finder = enforcer_module._Tasks(str(proc))
    pinned: list[int] = []
    enforcer_module._pin_trees([10, 12], CpuSet([0]), finder=finder,
                               setaffinity=lambda tid, ids: pinned.append(tid))
    assert sorted(pinned) == [10, 11, 12, 13, 14]
    assert len(scans) == 1
