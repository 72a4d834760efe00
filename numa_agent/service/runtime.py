"""The agent's event loop: one thread, woken only by the kernel.

It waits (selectors, no polling loop) on:
- the enforcer's descriptors (`Enforcer.fds`), which tell when a workload's
  processes are gone: inotify on each workload's `cgroup.events` (cgroup
  mode) or the workload processes' pidfds (affinity mode);
- the hotplug event source (kernel uevents);
- a stop pipe;
and wakes on a timer only to ping the systemd watchdog when one is set.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from typing import Callable

from numa_agent.enforcement.plan import workload_relpath
from numa_agent.hotplug.events import EventsLost

log = logging.getLogger("numa_agent.runtime")


class EventLoop:
    def __init__(self, service, *, hotplug_source=None,
                 on_hotplug: Callable[[list], None] | None = None,
                 watchdog_interval: float | None = None,
                 watchdog_ping: Callable[[], object] | None = None) -> None:
        self.service = service
        self.hotplug_source = hotplug_source
        self.on_hotplug = on_hotplug
        self.watchdog_interval = watchdog_interval
        self.watchdog_ping = watchdog_ping
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None

    def start(self) -> "EventLoop":
        self._thread = threading.Thread(target=self.run, name="numa-agent-events", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        enforcer = self.service.enforcer
        sel = selectors.DefaultSelector()
        sel.register(self._stop_r, selectors.EVENT_READ, "stop")
        if self.hotplug_source is not None:
            sel.register(self.hotplug_source.fileno(), selectors.EVENT_READ, "hotplug")
        registered = _sync_fds(sel, set(), enforcer.fds())
        # Workloads whose process died while we were not yet watching.
        self._release_empty()
        next_ping = time.monotonic()
        while True:
            timeout = None
            if self.watchdog_interval:
                timeout = max(0.0, next_ping - time.monotonic())
            ready = sel.select(timeout)
            if self.watchdog_interval and self.watchdog_ping and time.monotonic() >= next_ping:
                self.watchdog_ping()
                next_ping = time.monotonic() + self.watchdog_interval
            kinds = {key.data for key, _ in ready}
            if "stop" in kinds:
                break
            try:
                ready_fds = {key.fd for key, _ in ready if key.data == "enforcer"}
                if ready_fds:
                    try:
                        self._release_paths(enforcer.released(ready_fds), check=False)
                    finally:
                        registered = _sync_fds(sel, registered, enforcer.fds())
                if "hotplug" in kinds and self.on_hotplug is not None:
                    try:
                        events = self.hotplug_source.read_events()
                    except EventsLost:
                        events = None  # the handler rescans sysfs
                    self.on_hotplug(events)
            except Exception:  # the loop must survive any one bad event
                log.exception("error while handling kernel events")
        sel.close()

    def _release_paths(self, relpaths: list[str], check: bool) -> None:
        by_path = {workload_relpath(w): w.name for w in self.service.state.workloads}
        for rel in relpaths:
            name = by_path.get(rel)
            if name is None:
                continue
            if check and self.service.enforcer.populated(rel):
                continue
            try:
                self.service.release(name, None, reason="exited")
            except Exception as exc:  # already released by its owner, or enforcement trouble
                log.info("release of %s after exit: %s", name, exc)

    def _release_empty(self) -> None:
        paths = [workload_relpath(w) for w in self.service.state.workloads]
        self._release_paths(paths, check=True)


def _sync_fds(sel, registered: set[int], wanted: list[int]) -> set[int]:
    # A closed descriptor's number can be reused by a new one at once (a
    # pidfd), so start over rather than diff: unregistering a stale number is
    # harmless.
    for fd in registered:
        try:
            sel.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass
    for fd in sorted(set(wanted)):
        sel.register(fd, selectors.EVENT_READ, "enforcer")
    return set(wanted)
