"""CgroupEnforcer under the commit unit's parallel writes (issue 37): changes that
share no cgroup are applied from different threads at once. Each test forces the
interleaving with a barrier or events, never with a sleep."""

from __future__ import annotations

import threading

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.plan import RELEASED_CGROUP, SHARED_CGROUP, CgroupSpec
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs


def _run(*targets):
    """Run each target in a thread; the exceptions they raised."""
    errors: list[BaseException] = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_two_evictions_at_once_both_make_do_with_one_released_cgroup(fake_root, sleepers):
    """Two releases of different workloads, applied at once, each find
    `shared/_released` missing and make it: the second must not fail on EEXIST
    (and so roll a release back)."""
    enforcer = CgroupEnforcer(CgroupV2(fake_root, SimulatedCgroupfs(fake_root)))
    try:
        enforcer.setup()
        pool = CpuSet.parse("0-11")
        layout = {
            SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0, 1)),
            "wl-a": CgroupSpec("wl-a", CpuSet([12]), (0,), workload="a"),
            "wl-b": CgroupSpec("wl-b", CpuSet([13]), (0,), workload="b"),
        }
        enforcer.apply({}, layout)
        for rel in ("wl-a", "wl-b"):
            enforcer.cgroup.move_pid(rel, sleepers().pid)
        after = {SHARED_CGROUP: layout[SHARED_CGROUP],
                 RELEASED_CGROUP: CgroupSpec(RELEASED_CGROUP, pool, (0, 1))}
        both_looked = threading.Barrier(2)
        exists = enforcer.cgroup.exists

        def looked(relpath: str) -> bool:
            found = exists(relpath)
            if relpath == RELEASED_CGROUP:
                both_looked.wait()  # each saw it missing before either made it
            return found

        enforcer.cgroup.exists = looked  # type: ignore[method-assign]
        errors = _run(lambda: enforcer.evict("wl-a", None, None, after),
                      lambda: enforcer.evict("wl-b", None, None, after))
        enforcer.cgroup.exists = exists  # type: ignore[method-assign]
        assert errors == []
        assert not exists("wl-a") and not exists("wl-b")
        assert len(enforcer.pids(RELEASED_CGROUP)) == 2
    finally:
        enforcer.close()


class _Paused:
    """A CgroupV2 whose `populated` of one cgroup, in one thread, stops after
    reading until `go` is set (`read` set when it has read)."""

    def __init__(self, cg: CgroupV2, relpath: str) -> None:
        self._cg, self._relpath = cg, relpath
        self.thread: threading.Thread | None = None
        self.read, self.go = threading.Event(), threading.Event()

    def populated(self, relpath: str) -> bool:
        found = self._cg.populated(relpath)
        if relpath == self._relpath and threading.current_thread() is self.thread:
            self.read.set()
            self.go.wait()
        return found


def _reading(watcher, paused: _Paused) -> tuple[threading.Thread, list]:
    """read_events in a thread of its own, stopped after reading `paused`'s cgroup."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(watcher.read_events()), daemon=True)
    paused.thread = thread
    thread.start()
    paused.read.wait()
    return thread, out


def test_polling_keeps_a_move_in_told_while_a_reading_was_under_way(cg, fakefs, sleepers):
    """The event loop reads `a` empty; meanwhile an API thread moves the process
    in and says so (`occupied`). The reading must not overwrite that with its
    older 'empty', or the process's exit before the next tick is never reported."""
    from numa_agent.enforcement.polling import PollingWatcher

    cg.create("a")
    paused = _Paused(cg, "a")
    with PollingWatcher(cg) as watcher:
        watcher.watch("a")
        watcher._cgroup = paused  # type: ignore[assignment]
        thread, out = _reading(watcher, paused)
        proc = sleepers()
        try:
            cg.move_pid("a", proc.pid)
            watcher.occupied("a")
        finally:
            paused.go.set()
        thread.join()
        assert out == [[]]
        fakefs.process_exited(proc.pid)
        assert watcher.read_events() == ["a"]


def test_polling_does_not_bring_back_a_watch_dropped_while_reading(cg, fakefs, sleepers):
    """A release unwatches `a` (and removes it) while the event loop is reading
    it: the reading must not put `a` back, or the same name admitted again
    starts from the old cgroup's 'populated' and its fresh, empty cgroup is
    reported as emptied before its process is moved in."""
    from numa_agent.enforcement.polling import PollingWatcher

    cg.create("a")
    proc = sleepers()
    cg.move_pid("a", proc.pid)
    paused = _Paused(cg, "a")
    with PollingWatcher(cg) as watcher:
        watcher.watch("a")
        watcher._cgroup = paused  # type: ignore[assignment]
        thread, out = _reading(watcher, paused)
        try:
            watcher.unwatch("a")  # the release: evicted and removed
            cg.create("b")
            cg.move_pid("b", proc.pid)
            cg.remove("a")
        finally:
            paused.go.set()
        thread.join()
        assert out == [[]]
        assert watcher.watched() == []
        cg.create("a")  # admitted again: watched before its process is moved in
        watcher.watch("a")
        assert watcher.read_events() == []


def test_an_eviction_does_not_write_an_older_pool_over_a_newer_one(fake_root, sleepers):
    """A release evicts into `shared/_released`, missing, with the pool of its own
    change (older); once it has made the cgroup, the pool's writer (the commit unit,
    under its pool lock) writes a newer, wider pool into `shared/` and `shared/_released`.
    The eviction must not then write its older pool there: the released processes
    would stay off CPUs the pool has again."""
    enforcer = CgroupEnforcer(CgroupV2(fake_root, SimulatedCgroupfs(fake_root)))
    try:
        enforcer.setup()
        older, newer = CpuSet.parse("0-9"), CpuSet.parse("0-11")
        layout = {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, older, (0, 1)),
                  "wl-a": CgroupSpec("wl-a", CpuSet([12]), (0,), workload="a")}
        enforcer.apply({}, layout)
        enforcer.cgroup.move_pid("wl-a", sleepers().pid)
        released_at = {rel: CgroupSpec(rel, cpus, (0, 1)) for rel, cpus in
                       ((SHARED_CGROUP, older), (RELEASED_CGROUP, older))}
        wider = {rel: CgroupSpec(rel, newer, (0, 1)) for rel in (SHARED_CGROUP, RELEASED_CGROUP)}
        create = enforcer.cgroup.create

        def made(relpath: str, exist_ok: bool = False):
            out = create(relpath, exist_ok=exist_ok)
            if relpath == RELEASED_CGROUP:  # the pool's writer, from another thread, meanwhile
                assert _run(lambda: enforcer.apply(released_at, wider, changed=frozenset(wider))) == []
            return out

        enforcer.cgroup.create = made  # type: ignore[method-assign]
        assert _run(lambda: enforcer.evict("wl-a", None, None, released_at)) == []
        enforcer.cgroup.create = create  # type: ignore[method-assign]
        assert enforcer.pids(RELEASED_CGROUP) and not enforcer.exists("wl-a")
        assert enforcer.cgroup.read_effective(RELEASED_CGROUP)[0] == newer
    finally:
        enforcer.close()
