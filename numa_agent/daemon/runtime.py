"""The agent's event loop: one thread, woken only by the kernel.

It waits (selectors, no polling loop) on:
- the enforcer's descriptors (`Enforcer.fds`), which tell when a workload's
  processes are gone: inotify on each workload's `cgroup.events` (cgroup
  mode) or an epoll instance of the workload processes' pidfds (affinity
  mode);
- the hotplug event source (kernel uevents);
- a stop pipe;
and wakes on a timer only to ping the systemd watchdog when one is set, to
retry releases that failed, to let a burst of hotplug events settle before
the machine is re-read (a memory hot-add is two uevents per memory block), and
where hotplug is on, to read the nodes' memory figures for changes that send
no uevent (a balloon driver, a hugepage pool resized).

A release that fails (the checkpoint cannot be written: a read-only or full
state filesystem) is kept as pending and retried with exponential backoff
(RETRY_FIRST doubling up to RETRY_CAP seconds), never in a tight loop: an
enforcer whose descriptor stays readable for an exit (the simulated tree's
pidfds) has it set aside until the retry; one that reports an exit once
(inotify in cgroup mode, the affinity fallback's epoll) would forget the
release without the pending set. One log line when
releases start failing, one when they are all done.
"""

from __future__ import annotations

import bisect
import logging
import os
import selectors
import threading
import time
from typing import Callable, Iterable, Mapping

from numa_agent.core.backoff import Backoff
from numa_agent.core.names import is_engine_cgroup
from numa_agent.discovery.files import DiscoveryError
from numa_agent.enforcement.plan import WORKLOAD_PREFIX, CgroupSpec, workload_relpath
from numa_agent.hotplug.events import EventsLost, HotplugEvent
from numa_agent.service.refusals import InConflict, UnknownWorkload
from numa_agent.state.model import AgentState, Workload

log = logging.getLogger("numa_agent.runtime")

RETRY_FIRST = 0.25  # seconds before the first retry of a failed release
RETRY_CAP = 4.0  # the longest wait between retries: recovery within seconds
# Where isolation may hold a setting in a daemon (irqbalance's banned CPUs), how
# often the loop wakes to see it has not restarted and forgotten it: well
# within irqbalance's first rebalance (10 s after it starts, by default). A
# wake with nothing held reads nothing.
WATCH_INTERVAL = 2.0
# The machine is re-read once hotplug events stop coming for HOTPLUG_SETTLE
# seconds, and at the latest HOTPLUG_SETTLE_MAX after the first: one re-read
# for a DIMM of many memory blocks or a socket's CPUs, not one per event.
HOTPLUG_SETTLE = 0.25
HOTPLUG_SETTLE_MAX = 2.0
# How often the nodes' memory figures (MemTotal, hugepage pools) are read: a
# few small files; the machine is re-read only when they changed.
MEMORY_POLL_INTERVAL = 5.0


class EventLoop:
    def __init__(self, service, *, hotplug_source=None,
                 on_hotplug: Callable[[list | None], None] | None = None,
                 watchdog_interval: float | None = None,
                 watchdog_ping: Callable[[], object] | None = None,
                 memory_probe: Callable[[], tuple] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.hotplug_source = hotplug_source
        self.on_hotplug = on_hotplug
        # Per node (id, ...figures): compared between reads; a node whose
        # figures changed is reported to on_hotplug as a node "change" event.
        self.memory_probe = memory_probe
        self._memory_seen: tuple | None = None
        self._memory_at: float | None = None
        # Hotplug events waiting for the burst to settle (None in the list: some were lost).
        self._hotplug: list[HotplugEvent | None] = []
        self._hotplug_first = 0.0
        self._hotplug_at: float | None = None
        self.watchdog_interval = watchdog_interval
        self.watchdog_ping = watchdog_ping
        self.clock = clock
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._sel: selectors.BaseSelector | None = None
        self._registered: set[int] = set()
        self._next_ping = 0.0
        # Releases that failed, retried with backoff: relpath -> workload name.
        self.pending: dict[str, str] = {}
        # Enforcer descriptors set aside until the next retry: they report only
        # pending releases again and again (an exited process's pidfd).
        self._muted: set[int] = set()
        self._retry_at: float | None = None
        self._backoff = Backoff.starting(RETRY_FIRST, RETRY_CAP)
        self._failing_since: float | None = None
        # Isolation knobs whose restore failed: retried with the same backoff.
        self._isolation_at: float | None = None
        self._isolation_backoff = Backoff.starting(RETRY_FIRST, RETRY_CAP)

    def start(self) -> "EventLoop":
        self._thread = threading.Thread(target=self.run, name="numa-agent-events", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        self.open()
        try:
            while self.step():
                pass
        finally:
            self.close()

    def open(self) -> None:
        """Register the descriptors and release workloads whose processes
        died while nobody was watching; then `step` until it returns False."""
        # poll(2), not epoll: see _sync_fds.
        sel = self._sel = selectors.PollSelector()
        sel.register(self._stop_r, selectors.EVENT_READ, "stop")
        if self.hotplug_source is not None:
            sel.register(self.hotplug_source.fileno(), selectors.EVENT_READ, "hotplug")
        self._registered = _sync_fds(sel, set(), self.service.enforcer.fds())
        self._release_empty()
        self._next_ping = time.monotonic()
        if self.memory_probe is not None and self.on_hotplug is not None:
            self._memory_seen = self._read_memory()
            self._memory_at = self.clock() + MEMORY_POLL_INTERVAL

    def close(self) -> None:
        if self._sel is not None:
            self._sel.close()
            self._sel = None

    def step(self, max_wait: float | None = None) -> bool:
        """Wait for one batch of events (at most `max_wait` seconds, if given)
        and handle it; False once asked to stop."""
        sel = self._sel
        assert sel is not None, "open() first"
        ready = sel.select(self._timeout(max_wait))
        if self.watchdog_interval and self.watchdog_ping and time.monotonic() >= self._next_ping:
            self.watchdog_ping()
            self._next_ping = time.monotonic() + self.watchdog_interval
        kinds = {key.data for key, _ in ready}
        if "stop" in kinds:
            return False
        enforcer = self.service.enforcer
        try:
            try:
                self._handle_ready({key.fd for key, _ in ready if key.data == "enforcer"})
                if self._retry_at is not None and self.clock() >= self._retry_at:
                    self._retry()
                self._retry_isolation()
            finally:
                self._registered = _sync_fds(sel, self._registered, enforcer.fds(), self._muted)
            if "hotplug" in kinds and self.on_hotplug is not None:
                try:
                    self._queue_hotplug(self.hotplug_source.read_events())
                except EventsLost:
                    self._queue_hotplug([None])  # the handler rescans sysfs
            self._poll_memory()
            self._flush_hotplug()
        except Exception:  # the loop must survive any one bad event
            log.exception("error while handling kernel events")
        return True

    def _timeout(self, max_wait: float | None) -> float | None:
        waits = [] if max_wait is None else [max_wait]
        if self.watchdog_interval:
            waits.append(self._next_ping - time.monotonic())
        if self._retry_at is not None:
            waits.append(self._retry_at - self.clock())
        if self._isolation_at is not None:
            waits.append(self._isolation_at - self.clock())
        for at in (self._hotplug_at, self._memory_at):
            if at is not None:
                waits.append(at - self.clock())
        watched = getattr(self.service, "isolation_watched", None)
        if watched is not None and watched():
            waits.append(WATCH_INTERVAL)  # the step after it retries what the daemon lost
        return max(0.0, min(waits)) if waits else None

    # ---- hotplug ---------------------------------------------------------------------
    def _queue_hotplug(self, events: list[HotplugEvent | None]) -> None:
        if not events:
            return
        now = self.clock()
        if not self._hotplug:
            self._hotplug_first = now
        self._hotplug.extend(events)
        self._hotplug_at = min(now + HOTPLUG_SETTLE, self._hotplug_first + HOTPLUG_SETTLE_MAX)

    def _flush_hotplug(self) -> None:
        if self._hotplug_at is None or self.clock() < self._hotplug_at or self.on_hotplug is None:
            return
        events, self._hotplug, self._hotplug_at = self._hotplug, [], None
        if self.memory_probe is not None:
            self._memory_seen = self._read_memory()  # what this re-read of the machine sees
        self.on_hotplug(None if None in events else [e for e in events if e is not None])

    def _poll_memory(self) -> None:
        if self._memory_at is None or self.clock() < self._memory_at:
            return
        self._memory_at = self.clock() + MEMORY_POLL_INTERVAL
        seen, now = self._memory_seen, self._read_memory()
        if now is None or now == seen:
            return
        before = {figures[0]: figures for figures in seen or ()}
        after = {figures[0]: figures for figures in now}
        changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
        self._memory_seen = now
        self._queue_hotplug([HotplugEvent("node", "change", f"/sys/devices/system/node/node{n}", n)
                             for n in changed])

    def _read_memory(self) -> tuple | None:
        assert self.memory_probe is not None
        try:
            return self.memory_probe()
        except (OSError, DiscoveryError) as exc:
            log.debug("reading the nodes' memory figures failed: %s", exc)
            return None

    # ---- releases ------------------------------------------------------------------
    def _handle_ready(self, ready_fds: set[int]) -> None:
        enforcer = self.service.enforcer
        for fd in sorted(ready_fds):
            relpaths = enforcer.released({fd})
            if relpaths and all(rel in self.pending for rel in relpaths):
                self._mute(fd)  # readable for what already waits for the retry
                continue
            self._release_paths([rel for rel in relpaths if rel not in self.pending], check=False)

    def _mute(self, fd: int) -> None:
        assert self._sel is not None
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass
        self._registered.discard(fd)
        self._muted.add(fd)

    def _release_paths(self, relpaths: Iterable[str], check: bool) -> None:
        state = self.service.state
        for rel in relpaths:
            w = _workload_at(state, rel, self.service.layout)
            if w is None:
                continue
            if check and self.service.enforcer.populated(rel):
                continue
            self._release(rel, w.name)

    def _release(self, rel: str, name: str) -> None:
        try:
            self.service.release(name, None, reason="exited")
        except (UnknownWorkload, InConflict) as exc:  # already released by its owner, or held for an operator
            log.info("release of %s after exit: %s", name, exc)
            self._done(rel)
        except Exception as exc:  # the checkpoint or enforcement failed: retried
            self._failed(rel, name, exc)
        else:
            self._done(rel)

    def _failed(self, rel: str, name: str, exc: Exception) -> None:
        now = self.clock()
        self.pending[rel] = name
        self.service.counters.pending_releases = len(self.pending)
        if self._failing_since is None:
            self._failing_since = now
            log.warning("release of %s after exit failed: %s; retrying it (and any other that fails) "
                        "with backoff, at most every %g s, until it succeeds", name, exc, RETRY_CAP)
        else:
            log.debug("release of %s after exit failed again: %s", name, exc)
        if self._retry_at is None:
            self._retry_at = now + self._backoff.delay

    def _done(self, rel: str) -> None:
        if self.pending.pop(rel, None) is None:
            return
        self.service.counters.pending_releases = len(self.pending)
        if not self.pending and self._failing_since is not None:
            log.warning("pending releases done after %.1f s of failures", self.clock() - self._failing_since)
            self._failing_since = None
            self._retry_at = None
            self._backoff = self._backoff.reset()

    def _retry_isolation(self) -> None:
        pending = getattr(self.service, "isolation_pending", None)
        if pending is None or not pending():
            self._isolation_at, self._isolation_backoff = None, self._isolation_backoff.reset()
            return
        now = self.clock()
        if self._isolation_at is not None and now >= self._isolation_at:
            self.service.retry_isolation()
            self._isolation_backoff = self._isolation_backoff.doubled()
            self._isolation_at = None
            if not pending():
                self._isolation_backoff = self._isolation_backoff.reset()
                return
        if self._isolation_at is None:
            self._isolation_at = now + self._isolation_backoff.delay

    def _retry(self) -> None:
        # Set-aside descriptors come back: whatever they report beyond the
        # pending releases is handled by the next step.
        self._muted.clear()
        self._retry_at = None
        for rel, name in list(self.pending.items()):
            if self.service.enforcer.populated(rel):
                # Not empty any more (a process moved into the cgroup): not an
                # exit to release. A stuck pidfd reports it again if it was one.
                self._done(rel)
                continue
            self._release(rel, name)
        if self.pending:
            self._backoff = self._backoff.doubled()
            self._retry_at = self.clock() + self._backoff.delay

    def _release_empty(self) -> None:
        """Workloads whose process died while we were not yet watching."""
        paths = [workload_relpath(w) for w in self.service.state.workloads]
        self._release_paths(paths, check=True)


def _workload_at(state: AgentState, rel: str, layout: Mapping[str, CgroupSpec]) -> Workload | None:
    """The workload whose path is `rel`: its name is the path's last part
    (`wl-NAME`, `shared/NAME`, `pod-POD/NAME`), found by bisection in the
    workloads (sorted by name), so an event costs O(log N), not a map of all."""
    if is_engine_cgroup(rel):
        # An engine's cgroup: its workload is whichever names it (the layout's entry).
        spec = layout.get(rel)
        w = state.workload(spec.workload) if spec is not None and spec.workload else None
        return w if w is not None and w.cgroup == rel else None
    head, _, name = rel.rpartition("/")
    if not head:
        if not name.startswith(WORKLOAD_PREFIX):
            return None
        name = name[len(WORKLOAD_PREFIX):]
    workloads = state.workloads
    i = bisect.bisect_left(workloads, name, key=lambda w: w.name)
    if i < len(workloads) and workloads[i].name == name and workload_relpath(workloads[i]) == rel \
            and workloads[i].runtime is None:  # a runtime's container has no cgroup of the agent's
        return workloads[i]
    return None


def _sync_fds(sel: selectors.BaseSelector, registered: set[int], wanted: Iterable[int],
              muted: set[int] | None = None) -> set[int]:
    """Register what is wanted and not yet registered, unregister what is no
    longer wanted: O(change) selector calls. This is correct although a closed
    descriptor's number can be reused at once by a new one (a pidfd) because
    the selector is poll(2), which is handed the numbers afresh on every call
    and so watches whatever file a number names now. (epoll would have
    dropped the closed file's registration with it and never see the new
    file behind the same number; that is why this is not the DefaultSelector.)
    A muted number that the enforcer no longer lists is forgotten, so that a
    new descriptor given that number later is watched (one reused between two
    steps waits for the next retry, RETRY_CAP at most)."""
    want = set(wanted)
    if muted:
        muted.intersection_update(want)
        want -= muted
    for fd in registered - want:
        try:
            sel.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass
    for fd in sorted(want - registered):
        sel.register(fd, selectors.EVENT_READ, "enforcer")
    return want
