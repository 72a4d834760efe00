"""The intruder scan over written /proc trees (ProcReader, the real reader),
the watcher's once-per-intruder log, and what it costs when nobody holds
exclusive CPUs (nothing at all)."""

from __future__ import annotations

import logging
import os

from numa_agent.core.cpuset import CpuSet
from numa_agent.observe.model import Guarded, cpu_owners
from numa_agent.observe.procfs import ProcReader
from numa_agent.observe.watcher import IntruderWatcher, cgroup_name, scan
from tests.observe.proc_tree import add_task

DB = Guarded("db", CpuSet([2, 3]), cgroup="/numa-agent/wl-db")


def _machine(proc):
    add_task(proc, 100, 100, "db", 2, "2-3", cgroup="/numa-agent/wl-db")
    add_task(proc, 100, 101, "db-worker", 3, "2-3", cgroup="/numa-agent/wl-db")
    add_task(proc, 200, 200, "busy loop", 3, "0-3", cgroup="/user.slice")  # the intruder
    add_task(proc, 300, 300, "moved away", 3, "0-1", cgroup="/user.slice")  # last ran there, not allowed now
    add_task(proc, 400, 400, "elsewhere", 0, "0-3")
    add_task(proc, 12, 12, "ksoftirqd/2", 2, "2", kernel=True)  # per-CPU: not an intruder
    add_task(proc, 13, 13, "kworker/u8:1", 2, "0-3", kernel=True)  # unbound: flagged kernel


def test_scan_finds_the_outside_tasks_allowed_and_last_run_there(tmp_path):
    proc = tmp_path / "proc"
    _machine(proc)
    found, tasks = scan(ProcReader(str(proc)), cpu_owners([DB]))
    assert tasks == 7
    assert sorted((i.pid, i.tid, i.command, i.cpu, i.kernel) for i in found) == [
        (13, 13, "kworker/u8:1", 2, True), (200, 200, "busy loop", 3, False)]


def test_affinity_mode_knows_the_process_and_what_it_forked_by_its_mark(tmp_path):
    proc = tmp_path / "proc"
    add_task(proc, 100, 100, "db", 2, "2-3")
    add_task(proc, 100, 105, "db-thread", 3, "2-3")
    add_task(proc, 150, 150, "db-child", 3, "2-3", env={"NUMA_AGENT_WORKLOAD": "db"})
    add_task(proc, 160, 160, "other", 3, "0-3", env={"NUMA_AGENT_WORKLOAD": "web"})
    found, _ = scan(ProcReader(str(proc)), cpu_owners([Guarded("db", CpuSet([2, 3]), pid=100)]))
    assert [(i.pid, i.command) for i in found] == [(160, "other")]


def test_another_users_process_cannot_hide_behind_the_workloads_mark(tmp_path):
    proc = tmp_path / "proc"
    add_task(proc, 100, 100, "db", 2, "2-3", uid=1000)
    add_task(proc, 150, 150, "db-child", 3, "2-3", env={"NUMA_AGENT_WORKLOAD": "db"}, uid=1000)
    add_task(proc, 151, 151, "sudo-child", 3, "2-3", env={"NUMA_AGENT_WORKLOAD": "db"}, uid=0)
    add_task(proc, 160, 160, "hiding", 3, "0-3", env={"NUMA_AGENT_WORKLOAD": "db"}, uid=1001)
    owner = Guarded("db", CpuSet([2, 3]), pid=100, owner_uid=1000)
    found, _ = scan(ProcReader(str(proc)), cpu_owners([owner]))
    assert [(i.pid, i.command) for i in found] == [(160, "hiding")]


def test_a_tree_without_tasks_shows_none(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 1 kB\n")
    assert scan(ProcReader(str(tmp_path / "proc")), cpu_owners([DB])) == ([], 0)
    assert scan(ProcReader(str(tmp_path / "missing")), cpu_owners([DB])) == ([], 0)


def test_each_intruder_is_logged_once_and_a_reused_pid_is_a_new_one(tmp_path, caplog):
    proc = tmp_path / "proc"
    _machine(proc)
    watcher = IntruderWatcher(lambda: [DB], ProcReader(str(proc)), 2.0, clock=lambda: 50.0)
    with caplog.at_level(logging.WARNING, logger="numa_agent.observe"):
        first = watcher.scan_once()
        watcher.scan_once()
    assert len(first.intruders) == 2 and first.tasks == 7 and first.finished_unix == 50.0
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["intruder on workload db's exclusive CPU 3: pid 200 tid 200 (busy loop)"]  # kernel: debug
    assert watcher.seen_total == 1
    assert [i.pid for i in watcher.by_workload()["db"]] == [13, 200]
    # pid 200 exits, and a new process gets its pid
    add_task(proc, 200, 200, "busy loop", 3, "0-3", cgroup="/user.slice", start_time=5000)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="numa_agent.observe"):
        watcher.scan_once()
    assert [r.getMessage().split(": ")[1] for r in caplog.records] == ["pid 200 tid 200 (busy loop)"]
    assert watcher.seen_total == 2


class _Untouchable:
    def stats(self):
        raise AssertionError("scanned although no workload holds exclusive CPUs")


def test_nothing_is_read_while_no_workload_holds_exclusive_cpus():
    watcher = IntruderWatcher(lambda: [], _Untouchable(), 2.0)  # type: ignore[arg-type]
    assert watcher.scan_once().intruders == ()
    assert watcher.by_workload() == {}


def test_the_timer_thread_stops_when_asked(tmp_path):
    watcher = IntruderWatcher(lambda: [], ProcReader(str(tmp_path)), 3600.0).start()
    watcher.stop()
    assert watcher._ticker is not None and not watcher._ticker.thread.is_alive()


def test_on_this_machine_allowed_cpus_come_from_the_system_call():
    me = os.getpid()
    assert ProcReader("/proc").allowed(me, me) == CpuSet(os.sched_getaffinity(0))
    assert ProcReader("/proc").allowed(me, 0x3FFFFFFF) is None  # no such task


def test_cgroup_names_as_proc_shows_them():
    assert cgroup_name("/sys/fs/cgroup/numa-agent/wl-db", "/sys/fs/cgroup") == "/numa-agent/wl-db"
    assert cgroup_name("/sys/fs/cgroup", "/sys/fs/cgroup") == "/"
    assert cgroup_name("/elsewhere/wl-db", "/sys/fs/cgroup") is None
    assert cgroup_name(None, "/sys/fs/cgroup") is None and cgroup_name("/x", None) is None
