"""EventWatcher: inotify on cgroup.events, driven through the fake tree."""

from __future__ import annotations

import inspect
import selectors
import threading

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement import cgroup as cgroup_module
from numa_agent.enforcement.cgroup import EventWatcher
from numa_agent.enforcement.errors import CgroupError, CgroupMissingError, CgroupUnsupportedError
from tests.support.tattling_lock import TattlingLock


@pytest.fixture(autouse=True)
def _inotify_to_be_had(request, cg, _inotify_exhausted_when_asked):
    """These test inotify itself: where no instance can be had (a busy machine's
    max_user_instances taken, NUMA_AGENT_TESTS_NO_INOTIFY) they are skipped, and the
    agent's fallback is tested in test_polling.py. Those that stand in a libc of
    their own (through monkeypatch) run everywhere."""
    if "monkeypatch" in inspect.signature(request.function).parameters:
        return
    try:
        EventWatcher(cg).close()
    except CgroupError as exc:
        pytest.skip(f"no inotify instance to be had here: {exc}")


def ready(watcher, timeout=2.0):
    with selectors.DefaultSelector() as sel:
        sel.register(watcher, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def test_nothing_pending_means_empty_list(cg):
    cg.create("w")
    with EventWatcher(cg) as watcher:
        watcher.watch("w")
        assert watcher.read_events() == []
        assert not ready(watcher, timeout=0)


def test_populated_changes_wake_the_selector(cg, fakefs, sleepers):
    cg.create("a")
    cg.create("b")
    cg.write_cpuset("a", CpuSet([0]), [0])
    proc = sleepers()
    with EventWatcher(cg) as watcher:
        watcher.watch("a")
        watcher.watch("b")
        watcher.watch("a")  # idempotent
        assert watcher.watched() == ["a", "b"]
        cg.move_pid("a", proc.pid)
        assert ready(watcher)
        assert watcher.read_events() == ["a"]
        assert cg.populated("a")
        fakefs.process_exited(proc.pid)
        assert ready(watcher)
        assert watcher.read_events() == ["a"]
        assert not cg.populated("a")


def test_moves_report_both_cgroups_once(cg, sleepers):
    cg.create("a")
    cg.create("b")
    proc = sleepers()
    cg.move_pid("a", proc.pid)
    with EventWatcher(cg) as watcher:
        for rel in ("", "a", "b"):
            watcher.watch(rel)
        cg.move_pid("b", proc.pid)
        # The root stays populated, so its events file is not rewritten.
        assert sorted(watcher.read_events()) == ["a", "b"]


def test_removed_cgroup_drops_its_watch(cg):
    cg.create("w")
    with EventWatcher(cg) as watcher:
        watcher.watch("w")
        cg.remove("w")
        assert watcher.read_events() == []
        assert watcher.watched() == []


def test_unwatch_stops_reports(cg, sleepers):
    cg.create("w")
    with EventWatcher(cg) as watcher:
        watcher.watch("w")
        watcher.unwatch("w")
        watcher.unwatch("w")  # harmless twice
        cg.move_pid("w", sleepers().pid)
        assert watcher.read_events() == []


def test_watch_missing_cgroup(cg):
    with EventWatcher(cg) as watcher:
        with pytest.raises(CgroupMissingError, match=r"watch .*ghost/cgroup.events failed: ENOENT"):
            watcher.watch("ghost")


def test_close_is_idempotent(cg):
    watcher = EventWatcher(cg)
    fd = watcher.fileno()
    assert fd >= 0
    watcher.close()
    watcher.close()
    assert watcher.fileno() == -1


class _NoInotify:
    pass


class _FailingInotify:
    def inotify_init1(self, flags):
        import ctypes
        ctypes.set_errno(24)  # EMFILE
        return -1


def test_libc_without_inotify(cg, monkeypatch):
    monkeypatch.setattr(cgroup_module, "libc", lambda: _NoInotify())
    with pytest.raises(CgroupUnsupportedError, match="inotify_init1 is not available"):
        EventWatcher(cg)


def test_inotify_init_failure(cg, monkeypatch):
    monkeypatch.setattr(cgroup_module, "libc", lambda: _FailingInotify())
    with pytest.raises(CgroupError, match=r"inotify_init1 \(inotify\) failed: EMFILE"):
        EventWatcher(cg)


def test_queue_overflow_reports_every_watched_cgroup(cg):
    import os
    import struct
    cg.create("a")
    cg.create("b")
    with EventWatcher(cg) as watcher:
        watcher.watch("b")
        watcher.watch("a")
        inotify_fd = watcher._fd
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        # wd -1 with IN_Q_OVERFLOW, then an unknown wd carrying a padded name.
        os.write(write_end, struct.pack("iIII", -1, 0x4000, 0, 0)
                 + struct.pack("iIII", 999, 0x2, 0, 16) + b"x" * 16)
        os.close(write_end)
        watcher._fd = read_end
        try:
            assert watcher.read_events() == ["a", "b"]
        finally:
            watcher._fd = inotify_fd
            os.close(read_end)


def test_a_cgroup_made_again_under_the_same_name_is_watched_again(cg, sleepers):
    """An engine's cgroup removed and made again (the same name admitted again
    by an API thread) before the event loop read the old one's removal: the new
    one's watch must not be taken for the old one's, nor dropped with it."""
    cg.create("w")
    with EventWatcher(cg) as watcher:
        watcher.watch("w")
        cg.remove("w")
        cg.create("w")
        watcher.watch("w")
        assert watcher.read_events() == []
        assert watcher.watched() == ["w"]
        cg.move_pid("w", sleepers().pid)
        assert watcher.read_events() == ["w"]


def test_an_event_between_adding_a_watch_and_mapping_it_is_not_lost(cg, sleepers, monkeypatch):
    """An API thread watches `w`; the kernel hands out the watch, the process moves
    in and the event loop reads (another thread) before the watch is mapped to `w`:
    its event must still be reported as `w`'s, then or at the next reading."""
    cg.create("w")
    try:
        watcher = EventWatcher(cg)
    except CgroupError as exc:
        pytest.skip(f"no inotify instance to be had here: {exc}")
    real = cgroup_module.libc()
    reader_out: list = []
    settled = threading.Event()  # the reading is done, or waits for the watch to finish
    lock = TattlingLock(settled)

    def read() -> None:
        reader_out.extend(watcher.read_events())
        settled.set()

    class Hooked:
        def __getattr__(self, name):
            return getattr(real, name)

        def inotify_add_watch(self, fd, path, mask):
            wd = real.inotify_add_watch(fd, path, mask)
            cg.move_pid("w", sleepers().pid)  # cgroup.events changes: an event for wd is queued
            reader = threading.Thread(target=read)
            reader.start()
            settled.wait()
            hooked["reader"] = reader
            return wd

    hooked: dict = {}
    with watcher:
        watcher._lock = lock
        monkeypatch.setattr(cgroup_module, "libc", lambda: Hooked())
        watcher.watch("w")
        hooked["reader"].join()
        assert reader_out + watcher.read_events() == ["w"]
