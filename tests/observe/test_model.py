"""The pure rules: parsing stat, status, cgroup, memory.numa_stat and numa_maps,
and judging a task on an exclusive CPU."""

from __future__ import annotations

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.processes import parse_cgroup
from numa_agent.observe.model import (
    Guarded,
    Intruder,
    by_workload,
    cpu_owners,
    judge,
    last_cpu,
    locality,
    parse_allowed,
    parse_numa_maps,
    parse_numa_stat,
    parse_stat,
)
from tests.observe.proc_tree import KTHREAD, stat_line

WL = Guarded("db", CpuSet([2, 3]), cgroup="/numa-agent/wl-db")


def test_stat_with_a_command_holding_spaces_and_parentheses():
    text = stat_line(10, 11, "a) (b c", 3, start_time=777)
    task = parse_stat(10, 11, text)
    assert task is not None
    assert (task.comm, task.cpu, task.start_time, task.kernel) == ("a) (b c", 3, 777, False)
    assert last_cpu(text) == 3


def test_a_stat_cut_short_is_no_task():
    assert parse_stat(1, 1, "1 (init) S 0 1") is None
    assert last_cpu("1 (init) S 0 1") is None


def test_kernel_flag_and_allowed_list():
    task = parse_stat(5, 5, stat_line(5, 5, "kworker/2:1", 2, flags=KTHREAD))
    assert task is not None and task.kernel
    assert parse_allowed("Name:\tx\nCpus_allowed_list:\t0-1,4\n") == CpuSet([0, 1, 4])
    assert parse_allowed("Name:\tx\n") is None
    assert parse_cgroup("0::/numa-agent/wl-db\n") == "/numa-agent/wl-db"
    assert parse_cgroup("1:name=systemd:/\n") is None


def _task(cpu: int, *, kernel: bool = False, pid: int = 40):
    task = parse_stat(pid, pid, stat_line(pid, pid, "t", cpu, flags=KTHREAD if kernel else 0))
    assert task is not None
    return task


def test_an_outside_task_allowed_and_last_run_there_is_an_intruder():
    found = judge(_task(3), CpuSet.parse("0-3"), WL)
    assert found == Intruder("db", 40, 40, "t", 3, 1000, False)
    assert found.to_json() == {"pid": 40, "tid": 40, "command": "t", "cpu": 3}


def test_no_longer_allowed_there_is_no_intruder():
    assert judge(_task(3), CpuSet.parse("0-1"), WL) is None
    assert judge(_task(3), None, WL) is None  # its status vanished: it exited


def test_per_cpu_kernel_threads_are_part_of_the_cpu_unbound_ones_are_not():
    assert judge(_task(2, kernel=True), CpuSet([2]), WL) is None
    unbound = judge(_task(2, kernel=True), CpuSet.parse("0-3"), WL)
    assert unbound is not None and unbound.kernel


def test_inside_by_cgroup_or_below_it_or_by_process_and_its_mark():
    assert WL.holds(1, "/numa-agent/wl-db", None)
    assert WL.holds(1, "/numa-agent/wl-db/child", None)
    assert not WL.holds(1, "/numa-agent/wl-dbx", None)
    assert not WL.holds(1, None, "db")  # with a cgroup, only the cgroup says
    pinned = Guarded("db", CpuSet([2]), pid=7)
    assert pinned.holds(7, None, None) and pinned.holds(9, None, "db")
    assert not pinned.holds(9, None, "other") and not pinned.holds(9, None, None)


def test_owners_and_grouping():
    other = Guarded("web", CpuSet([5]))
    assert cpu_owners([WL, other]) == {2: WL, 3: WL, 5: other}
    a, b = Intruder("db", 9, 9, "x", 2, 1, False), Intruder("db", 3, 4, "y", 3, 1, False)
    assert by_workload([a, b]) == {"db": (b, a)}


def test_numa_stat_adds_anon_and_file_per_node():
    text = ("anon N0=1000 N1=24\nfile N0=10 N1=0\nkernel_stack N0=999 N1=999\n"
            "shmem N0=5 N1=5\nanon_thp N0=4096 N1=0\n")
    assert parse_numa_stat(text) == {0: 1010, 1: 24}
    assert parse_numa_stat("") == {}


def test_numa_maps_pages_times_the_mapping_page_size():
    text = ("00400000 default file=/bin/x mapped=3 N0=3 kernelpagesize_kB=4\n"
            "7f0000000000 bind:1 anon=512 dirty=512 N1=2 kernelpagesize_kB=2048\n"
            "7ffd00000000 default stack anon=2 dirty=2 N0=1 N1=1\n")
    assert parse_numa_maps(text, 4096) == {0: 4 * 4096, 1: 2 * (2 << 20) + 4096}


def test_locality_counts_what_lies_outside_the_booked_nodes():
    assert locality({0: 300, 1: 100}, (0,), "memory.numa_stat") == {
        "source": "memory.numa_stat", "bytes": {"0": 300, "1": 100}, "total_bytes": 400,
        "outside_bytes": 100, "outside_ratio": 0.25}
    assert locality({}, (0,), "numa_maps")["outside_ratio"] == 0.0
    unbooked = locality({0: 5}, (), "memory.numa_stat")
    assert unbooked["outside_bytes"] is None and unbooked["outside_ratio"] is None
