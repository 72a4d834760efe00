"""Noticing emptied cgroups without inotify: the fallback when no inotify
instance can be had (`inotify_init1` EMFILE once the user's
fs.inotify.max_user_instances are taken, ENOSYS, ...).

`PollingWatcher` answers as `EventWatcher` does, from the `populated` line
of each watched cgroup's `cgroup.events`, read when a periodic timer
(timerfd, so the event loop still sleeps on a descriptor) fires or when
the caller asks. It reports a cgroup once it went from populated to empty:
as inotify, it never reports one that has not held a process yet (a cgroup
made for an admission is empty until the process is moved in; `occupied`
is told of the move, so an exit before the next tick is not missed).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import threading

from numa_agent.enforcement.cgroup import CgroupV2, EventWatcher
from numa_agent.enforcement.errors import CgroupError, CgroupMissingError
from numa_agent.enforcement.libc import libc

log = logging.getLogger("numa_agent.enforcement")

POLL_INTERVAL = 1.0  # seconds between two readings of the watched cgroups

_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def open_watcher(cgroup: CgroupV2) -> EventWatcher | PollingWatcher:
    """inotify where an instance can be had; else polling, said once in the log."""
    try:
        return EventWatcher(cgroup)
    except CgroupError as exc:
        log.warning("%s: noticing workload exits by reading each cgroup.events every %g s instead "
                    "(raise fs.inotify.max_user_instances if they ran out)", exc, POLL_INTERVAL)
        return PollingWatcher(cgroup)


class PollingWatcher:
    """EventWatcher's interface over periodic reads of `cgroup.events`."""

    def __init__(self, cgroup: CgroupV2, interval: float = POLL_INTERVAL) -> None:
        self._cgroup = cgroup
        # relpath -> (populated as last read or told, a token of that entry). The
        # API's threads watch, unwatch and tell moves while the event loop reads:
        # a reading is stored only over the entry it started from (its token),
        # so it never undoes a move told meanwhile nor brings back a dropped watch.
        self._populated: dict[str, tuple[bool, int]] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._fd = _periodic_timer(interval)

    def fileno(self) -> int:
        return self._fd

    def watch(self, relpath: str) -> None:
        with self._lock:
            if relpath in self._populated:
                return
        now = self._cgroup.populated(relpath)  # a missing one raises, as inotify
        with self._lock:
            self._populated.setdefault(relpath, (now, next(self._tokens)))

    def occupied(self, relpath: str) -> None:
        with self._lock:
            if relpath in self._populated:
                self._populated[relpath] = (True, next(self._tokens))

    def unwatch(self, relpath: str) -> None:
        with self._lock:
            self._populated.pop(relpath, None)

    def watched(self) -> list[str]:
        with self._lock:
            return sorted(self._populated)

    def read_events(self) -> list[str]:
        """Watched cgroups that held processes and are empty now (or gone)."""
        try:
            os.read(self._fd, 8)  # the expirations: the count does not matter
        except BlockingIOError:
            pass
        emptied = []
        with self._lock:
            entries = list(self._populated.items())
        for relpath, entry in entries:
            try:
                now: bool | None = self._cgroup.populated(relpath)
            except CgroupMissingError:
                now = None  # removed: its watch is gone, as inotify's
            with self._lock:
                if self._populated.get(relpath) is not entry:
                    continue  # changed meanwhile (moved in, unwatched): read again next tick
                if now is None:
                    del self._populated[relpath]
                    emptied.append(relpath)
                    continue
                self._populated[relpath] = (now, entry[1])
            if entry[0] and not now:
                emptied.append(relpath)
        return emptied

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            with self._lock:
                self._populated.clear()

    def __enter__(self) -> PollingWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _periodic_timer(interval: float) -> int:
    """A timerfd readable every `interval` seconds (OSError if none can be had)."""
    fd = libc().timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"timerfd_create: {os.strerror(code)}")
    seconds, fraction = divmod(interval, 1.0)
    every = _Timespec(int(seconds), int(fraction * 1e9))
    spec = _Itimerspec(every, every)
    if libc().timerfd_settime(fd, 0, ctypes.byref(spec), None) != 0:
        code = ctypes.get_errno()
        os.close(fd)
        raise OSError(code, f"timerfd_settime: {os.strerror(code)}")
    return fd
