"""The affinity fallback's re-pin of the shared pool: each followed process's
descendants found through a descriptor held since it was admitted."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement import affinity_enforcer as enforcer_module
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.plan import SHARED_CGROUP, CgroupSpec
from tests.support.processes import kill_all


def two_cpus() -> tuple[CpuSet, CpuSet]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to move between")
    return CpuSet(allowed), CpuSet([allowed[0]])


def pool_layout(pool: CpuSet, pids: list[int]) -> dict:
    """As update_layout hands it over when an exclusive admission changes the pool."""
    layout = {f"shared/s{i}": CgroupSpec(f"shared/s{i}", pool, (0,), workload=f"s{i}", pid=pid, inherit=True)
              for i, pid in enumerate(pids)}
    return {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0,)), **layout}


def repin(enforcer: AffinityEnforcer, pids: list[int], old: CpuSet, new: CpuSet) -> None:
    enforcer.apply(pool_layout(old, pids), pool_layout(new, pids), changed=frozenset({SHARED_CGROUP}))


def children_paths_read(monkeypatch) -> list[str]:
    paths: list[str] = []
    real = enforcer_module._read_proc

    def read(path):
        if path.endswith("/children"):
            paths.append(path)
        return real(path)

    monkeypatch.setattr(enforcer_module, "_read_proc", read)
    return paths


def test_a_pool_change_reads_no_children_file_by_path_for_a_followed_process(monkeypatch, sleepers):
    wide, narrow = two_cpus()
    procs = [sleepers() for _ in range(4)]
    pids = [p.pid for p in procs]
    enforcer = AffinityEnforcer("test")
    try:
        for i, pid in enumerate(pids):
            assert enforcer.track(f"shared/s{i}", pid)
        paths = children_paths_read(monkeypatch)
        repin(enforcer, pids, wide, narrow)
        assert paths == []  # read through the descriptor held since track
        assert all(CpuSet(os.sched_getaffinity(pid)) == narrow for pid in pids)
    finally:
        enforcer.close()


def test_without_a_held_descriptor_the_children_file_is_read_by_path(monkeypatch, sleepers):
    """Out of descriptors when a workload was followed: it is still followed,
    and a re-pin still finds its children, through the path."""
    wide, narrow = two_cpus()
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "subprocess.Popen(['sleep', '60']); print(flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE)
    enforcer = AffinityEnforcer("test")
    real_open = os.open

    def no_children(path, *args, **kwargs):
        if str(path).endswith("/children"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)

    try:
        assert parent.stdout is not None
        parent.stdout.readline()  # its child is forked
        monkeypatch.setattr(enforcer_module.os, "open", no_children)
        assert enforcer.track("shared/s0", parent.pid)
        monkeypatch.setattr(enforcer_module.os, "open", real_open)
        paths = children_paths_read(monkeypatch)
        repin(enforcer, [parent.pid], wide, narrow)
        assert f"/proc/{parent.pid}/task/{parent.pid}/children" in paths
        (child,) = enforcer_module._Tasks().children(parent.pid, parent.pid)
        assert CpuSet(os.sched_getaffinity(child)) == narrow
    finally:
        enforcer.close()
        kill_all(enforcer_module._Tasks().children(parent.pid, parent.pid))
        parent.kill()
        parent.wait()


def test_a_released_workload_lets_go_of_its_descriptors(sleepers):
    proc = sleepers()
    enforcer = AffinityEnforcer("test")
    before = len(os.listdir("/proc/self/fd"))
    assert enforcer.track("shared/s0", proc.pid)
    assert len(os.listdir("/proc/self/fd")) > before
    enforcer.apply(pool_layout(CpuSet([0]), [proc.pid]), pool_layout(CpuSet([0]), []),
                   changed=frozenset({"shared/s0"}))
    assert not enforcer.exists("shared/s0")
    assert len(os.listdir("/proc/self/fd")) == before
    enforcer.close()


def pin_in_flight(threads, children) -> list[int]:
    """The tasks _pin_trees pins of process 10, with these listings."""
    pins: list[int] = []
    finder = SimpleNamespace(threads=threads, children=children)
    enforcer_module._pin_trees([10], CpuSet([0]), finder=finder, setaffinity=lambda tid, ids: pins.append(tid))
    return pins


def test_a_child_forked_as_its_parent_is_pinned_is_pinned_once_it_shows():
    """A fork in flight at its parent's pin copied the old mask, and the child
    is in the parent's children file only once the fork is done."""
    reads: list[int] = []

    def children(pid, tid):
        reads.append(tid)
        return [20] if pid == 10 and reads.count(10) > 1 else []

    assert sorted(pin_in_flight(lambda pid: [pid], children)) == [10, 20]


def test_a_thread_cloned_as_its_maker_is_pinned_is_pinned_once_it_shows():
    listings: list[int] = []

    def threads(pid):
        listings.append(pid)
        return [10, 11] if listings.count(10) > 1 else [pid]

    assert sorted(pin_in_flight(threads, lambda pid, tid: [])) == [10, 11]


FORKER = """
import os, subprocess, sys, threading, time
# A long-lived child forked before any re-pin, which forks on its own; then
# short-lived children forked without pause by the main thread and a second thread.
subprocess.Popen([sys.executable, "-c",
                  "import subprocess, time\\n"
                  "while True:\\n"
                  "    subprocess.Popen(['sleep', '0.2']); time.sleep(0.01)"])
def fork_forever():
    while True:
        subprocess.Popen(["sleep", "0.2"]); time.sleep(0.01)
threading.Thread(target=fork_forever, daemon=True).start()
print(flush=True)
fork_forever()
"""


def tree(pid: int, finder) -> list[int]:
    """Every task of `pid`'s tree as it stands."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for tid in finder.threads(p):
            out.append(tid)
            todo.extend(finder.children(p, tid))
    return out


def test_a_followed_process_forking_while_the_pool_changes_ends_whole_on_the_new_pool():
    wide, narrow = two_cpus()
    other = CpuSet([sorted(wide)[-1]])
    proc = subprocess.Popen([sys.executable, "-c", FORKER], stdout=subprocess.PIPE)
    enforcer = AffinityEnforcer("test")
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        deadline = time.monotonic() + 10
        while len(enforcer_module._Tasks().children(proc.pid, proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert enforcer.track("shared/s0", proc.pid)
        old = wide
        for target in (narrow, other, narrow, other, wide):
            repin(enforcer, [proc.pid], old, target)
            checked = 0
            for tid in tree(proc.pid, enforcer_module._Tasks()):
                try:
                    assert CpuSet(os.sched_getaffinity(tid)) == target, tid
                    checked += 1
                except ProcessLookupError:
                    pass  # a short-lived child that ended
            assert checked >= 4  # the process, its thread, the long-lived child and some of theirs
            old = target
    finally:
        enforcer.close()
        kill_all(tree(proc.pid, enforcer_module._Tasks()))
        proc.wait()


def test_no_file_is_held_in_the_upper_half_of_the_open_files_limit(monkeypatch, sleepers):
    """The descriptors the agent cannot do without (pidfds, clients) keep their room."""
    procs = [sleepers() for _ in range(2)]
    enforcer = AffinityEnforcer("test")
    try:
        assert enforcer.track("shared/s0", procs[0].pid)
        assert enforcer._followed["shared/s0"].held is not None
        monkeypatch.setattr(enforcer_module, "_held_limit", lambda: 3)  # every number is above
        assert enforcer.track("shared/s1", procs[1].pid)
        assert enforcer._followed["shared/s1"].held is None and enforcer.populated("shared/s1")
        paths = children_paths_read(monkeypatch)
        wide, narrow = two_cpus()
        repin(enforcer, [p.pid for p in procs], wide, narrow)
        assert paths == [f"/proc/{procs[1].pid}/task/{procs[1].pid}/children"] * 2  # first and second look
        assert all(CpuSet(os.sched_getaffinity(p.pid)) == narrow for p in procs)
    finally:
        enforcer.close()


def test_a_pool_change_lists_a_followed_process_s_threads_through_a_held_descriptor(monkeypatch, sleepers):
    wide, narrow = two_cpus()
    procs = [sleepers() for _ in range(3)]
    pids = [p.pid for p in procs]
    enforcer = AffinityEnforcer("test")
    listed: list = []
    real_listdir = os.listdir
    try:
        for i, pid in enumerate(pids):
            assert enforcer.track(f"shared/s{i}", pid)
        monkeypatch.setattr(os, "listdir", lambda path=".": listed.append(path) or real_listdir(path))
        repin(enforcer, pids, wide, narrow)
        # Each tree's threads through its held descriptor (twice: the first and the second
        # look); by path only /proc itself, once:
        # the search for the processes that left a tree but carry its mark (test_strays.py).
        assert len(listed) == 2 * len(pids) + 1 and [p for p in listed if isinstance(p, str)] == ["/proc"]
        assert all(CpuSet(os.sched_getaffinity(pid)) == narrow for pid in pids)
    finally:
        enforcer.close()


def test_a_held_file_that_does_not_answer_whole_is_read_by_path_instead(tmp_path):
    """A children file longer than one read, and a descriptor that lists no
    PIDs (not what it was): the finder takes the path's answer."""
    proc = tmp_path / "proc"
    many = list(range(100000, 101000))  # 7,000 bytes
    for pid, children in ((10, many), (20, [21, 22])):
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "task" / str(pid) / "children").write_text(" ".join(map(str, children)) + " ")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "not-a-tid").write_text("")
    (tmp_path / "garbage").write_text("not pids\n")
    fds = [os.open(proc / "10" / "task", os.O_RDONLY | os.O_DIRECTORY),
           os.open(proc / "10" / "task" / "10" / "children", os.O_RDONLY),
           os.open(tmp_path / "other", os.O_RDONLY | os.O_DIRECTORY),
           os.open(tmp_path / "garbage", os.O_RDONLY)]
    try:
        finder = enforcer_module._Tasks(str(proc), held={10: enforcer_module._Held(fds[0], fds[1]),
                                                         20: enforcer_module._Held(fds[2], fds[3])})
        assert finder.threads(10) == [10] and finder.children(10, 10) == many
        assert finder.threads(20) == [20] and finder.children(20, 20) == [21, 22]
    finally:
        for fd in fds:
            os.close(fd)


def test_a_release_during_a_pool_re_pin_cannot_turn_a_held_file_into_another_s(monkeypatch, sleepers):
    """A pool re-pin queued a follower with the files held for it; before it reads
    them, a release of that follower (another thread) lets go of them, and an
    open elsewhere takes the lowest free number: a bystander's /proc/PID/task.
    The re-pin must still read the follower's own files, never the bystander's:
    the bystander, no workload at all, keeps its CPUs."""
    wide, narrow = two_cpus()
    procs = [sleepers() for _ in range(2)]
    pids = [p.pid for p in procs]
    bystander = sleepers()
    os.sched_setaffinity(bystander.pid, wide.ids())
    enforcer = AffinityEnforcer("test")
    real_pin = enforcer_module._pin_trees
    opened: list[int] = []
    seen: dict = {}

    def release_s0_first(pins, cpus, *args, finder=None, **kwargs):
        if finder is not None and pids[0] in finder.held and not seen:
            seen["task"] = finder.held[pids[0]].task
            # The release of s0, applied from another thread meanwhile.
            release = threading.Thread(target=enforcer.apply, args=(
                pool_layout(narrow, pids), {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, narrow, (0,)),
                                            "shared/s1": pool_layout(narrow, pids)["shared/s1"]}),
                kwargs={"changed": frozenset({"shared/s0"})})
            release.start()
            release.join()
            # Any open now takes the lowest free number: the held one, if it was let go.
            while True:
                fd = os.open(f"/proc/{bystander.pid}/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                opened.append(fd)
                if fd >= seen["task"]:
                    break
        return real_pin(pins, cpus, *args, finder=finder, **kwargs)

    try:
        for i, pid in enumerate(pids):
            assert enforcer.track(f"shared/s{i}", pid)
        monkeypatch.setattr(enforcer_module, "_pin_trees", release_s0_first)
        repin(enforcer, pids, wide, narrow)
        assert "task" in seen and not enforcer.exists("shared/s0")
        assert CpuSet(os.sched_getaffinity(bystander.pid)) == wide  # not reached through a reused number
        assert CpuSet(os.sched_getaffinity(pids[1])) == narrow
    finally:
        for fd in opened:
            os.close(fd)
        enforcer.close()
