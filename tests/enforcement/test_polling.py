"""Without inotify (its instances ran out): exits are noticed by polling, said once."""

from __future__ import annotations

import logging
import selectors
import subprocess

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement import libc
from numa_agent.enforcement.cgroup import CgroupV2, EventWatcher
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.errors import CgroupError
from numa_agent.enforcement.polling import PollingWatcher, open_watcher
from numa_agent.enforcement.protocol import Layout
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs
from tests.support.inotify_exhausted import exhausted_libc


@pytest.fixture
def no_inotify(monkeypatch):
    monkeypatch.setattr(libc, "_handle", exhausted_libc())


def readable(fd: int) -> bool:
    """Wait for `fd` (the watcher's timer fires within POLL_INTERVAL)."""
    with selectors.PollSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(10))


def test_the_fallback_is_taken_and_said_once(cg, no_inotify, caplog):
    with caplog.at_level(logging.WARNING, logger="numa_agent.enforcement"):
        watcher = open_watcher(cg)
    try:
        assert isinstance(watcher, PollingWatcher)
        [line] = [r.getMessage() for r in caplog.records]
        assert "inotify_init1 (inotify) failed: EMFILE" in line
        assert "every 1 s instead" in line and "max_user_instances" in line
    finally:
        watcher.close()


def test_inotify_is_used_where_it_can_be_had(cg):
    try:
        EventWatcher(cg).close()
    except CgroupError as exc:
        pytest.skip(f"no inotify instance to be had here: {exc}")
    with open_watcher(cg) as watcher:
        assert isinstance(watcher, EventWatcher)


def test_an_emptied_cgroup_is_reported_once_and_a_never_filled_one_never(cg, fakefs, sleepers):
    cg.create("a")
    cg.create("fresh")
    with PollingWatcher(cg) as watcher:
        watcher.watch("a")
        watcher.watch("fresh")
        proc = sleepers()
        cg.move_pid("a", proc.pid)
        watcher.occupied("a")
        assert readable(watcher.fileno())
        assert watcher.read_events() == []  # filled, not emptied; `fresh` never held anything
        fakefs.process_exited(proc.pid)
        assert watcher.read_events() == ["a"]
        assert watcher.read_events() == []
        assert watcher.watched() == ["a", "fresh"]


def test_an_exit_before_the_first_reading_is_not_missed(cg, fakefs, sleepers):
    cg.create("a")
    with PollingWatcher(cg) as watcher:
        watcher.watch("a")  # empty: the process is moved in next
        proc = sleepers()
        cg.move_pid("a", proc.pid)
        watcher.occupied("a")
        fakefs.process_exited(proc.pid)
        assert watcher.read_events() == ["a"]


def test_a_removed_cgroup_is_reported_and_forgotten(cg, fakefs, sleepers):
    cg.create("a")
    proc = sleepers()
    cg.move_pid("a", proc.pid)
    with PollingWatcher(cg) as watcher:
        watcher.watch("a")  # already populated: an engine's cgroup taken over
        fakefs.process_exited(proc.pid)
        cg.remove("a")  # by its engine, between two readings
        assert watcher.read_events() == ["a"]
        assert watcher.watched() == []
        watcher.unwatch("a")  # harmless


def test_the_enforcer_releases_by_polling_without_inotify(fake_root, no_inotify):
    """An admitted workload's exit reaches `released` through the timer's descriptor."""
    from numa_agent.enforcement.plan import CgroupSpec

    enforcer = CgroupEnforcer(CgroupV2(fake_root, SimulatedCgroupfs(fake_root)))
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert isinstance(enforcer.watcher, PollingWatcher)
        enforcer.setup()
        spec = CgroupSpec(relpath="wl-x", cpus=CpuSet([3]), mems=(0,), workload="x")
        layout: Layout = {"wl-x": spec}
        enforcer.apply({}, layout, move=("wl-x", proc.pid))
        assert enforcer.released(set(enforcer.fds())) == []  # a move in is no release
        proc.kill()
        proc.wait()
        released: list[str] = []
        while not released:
            ready = [fd for fd in enforcer.fds() if readable(fd)]
            assert ready
            released = enforcer.released(set(ready))
        assert released == ["wl-x"]
    finally:
        proc.kill()
        proc.wait()
        enforcer.close()
