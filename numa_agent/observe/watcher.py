"""The intruder scan: which tasks outside a workload sit on its exclusive CPUs.

`scan` walks every task's stat once (the last CPU, field 39, is the first
cut), and reads more only for a task whose last CPU is some workload's
exclusive CPU: its process's cgroup (or environment, in affinity mode) to tell
the workload's own tasks apart, then its status to confirm it is allowed there.

`IntruderWatcher` runs it on its own timer thread (never on the API's or the
admission path), does nothing while no workload holds exclusive CPUs, logs
each user-space intruder once (pid, tid and start time: a reused pid is a new
one; kernel threads at debug level only) and
keeps the last result as an immutable value for status and metrics.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from numa_agent.enforcement.plan import workload_relpath
from numa_agent.observe.model import (
    Guarded,
    Intruder,
    by_workload,
    cpu_owners,
    judge,
    last_cpu,
    parse_stat,
)
from numa_agent.observe.procfs import TaskSource
from numa_agent.observe.ticker import Ticker
from numa_agent.state.model import AgentState

log = logging.getLogger("numa_agent.observe")

LOGGED_CAP = 10_000


def cgroup_name(directory: str | None, mount: str | None) -> str | None:
    """A cgroup directory as /proc/PID/cgroup names it ("/a/b"), or None
    when it is not below the cgroup mount."""
    if directory is None or mount is None:
        return None
    rel = os.path.relpath(directory, mount)
    if rel == "." or rel.startswith(".."):
        return None if rel.startswith("..") else "/"
    return "/" + rel


def guarded_of(state: AgentState, path_of: Callable[[str], str | None],
               mount: str | None) -> list[Guarded]:
    """The workloads holding exclusive CPUs, each with what marks its own tasks."""
    out = []
    for w in state.workloads:
        if w.shared or not w.booking.cpus or w.quarantined or w.runtime is not None:
            continue  # (a runtime's container: its cgroup is the runtime's, its tasks unknown here)
        cgroup = cgroup_name(path_of(workload_relpath(w)), mount)
        out.append(Guarded(w.name, w.booking.cpus, cgroup, w.pid, w.owner_uid))
    return out


@dataclass(frozen=True)
class Scan:
    intruders: tuple[Intruder, ...] = ()
    tasks: int = 0  # tasks looked at
    seconds: float = 0.0  # how long the scan took
    finished_unix: float | None = None


def scan(source: TaskSource, owners: Mapping[int, Guarded]) -> tuple[list[Intruder], int]:
    """The intruders on `owners`' CPUs, and how many tasks were looked at."""
    found: list[Intruder] = []
    tasks = 0
    inside: dict[tuple[str, int], bool] = {}  # (workload, pid) -> its own process
    for pid, tid, text in source.stats():
        tasks += 1
        owner = owners.get(last_cpu(text))  # type: ignore[arg-type]
        if owner is None:
            continue
        key = (owner.name, pid)
        if key not in inside:
            if owner.cgroup is not None:
                inside[key] = owner.holds(pid, source.cgroup(pid), None)
            else:
                marked = None if pid == owner.pid else source.marked(pid)
                uid = source.owner(pid) if marked == owner.name else None
                inside[key] = owner.holds(pid, None, marked, uid)
        if inside[key]:
            continue
        task = parse_stat(pid, tid, text)
        if task is None:
            continue
        intruder = judge(task, source.allowed(pid, tid), owner)
        if intruder is not None:
            found.append(intruder)
    return found, tasks


@dataclass
class IntruderWatcher:
    """Scans every `interval` seconds on its own thread; `scan_once` for tests."""

    guarded: Callable[[], Iterable[Guarded]]
    source: TaskSource
    interval: float  # seconds between scans ([observe] intruder_scan_seconds)
    clock: Callable[[], float] = time.time
    last: Scan = field(default_factory=Scan)
    seen_total: int = 0  # distinct user-space intruders logged since start
    # Intruders already logged (workload, pid, tid, start time), oldest first;
    # bounded, so a storm of short-lived intruders cannot grow it for ever.
    _logged: dict[tuple[str, int, int, int], None] = field(default_factory=dict)
    _ticker: Ticker | None = None

    def scan_once(self) -> Scan:
        owners = cpu_owners(self.guarded())
        if not owners:
            self.last = Scan(finished_unix=self.clock())
            return self.last
        started = time.perf_counter()
        found, tasks = scan(self.source, owners)
        elapsed = time.perf_counter() - started
        for i in found:
            key = (i.workload, *i.key)
            if key in self._logged:
                continue
            self._logged[key] = None
            if len(self._logged) > LOGGED_CAP:
                del self._logged[next(iter(self._logged))]
            if i.kernel:
                log.debug("kernel thread on workload %s's exclusive CPU %d: pid %d (%s)",
                          i.workload, i.cpu, i.pid, i.command)
                continue
            self.seen_total += 1
            log.warning("intruder on workload %s's exclusive CPU %d: pid %d tid %d (%s)",
                        i.workload, i.cpu, i.pid, i.tid, i.command)
        self.last = Scan(tuple(found), tasks, elapsed, self.clock())
        return self.last

    def by_workload(self) -> dict[str, tuple[Intruder, ...]]:
        return by_workload(self.last.intruders)

    def start(self) -> "IntruderWatcher":
        self._ticker = Ticker("numa-agent-observe", self.interval, self.scan_once, "intruder scan").start()
        return self

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
