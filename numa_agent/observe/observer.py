"""What observation adds to `status` and to the metrics: each workload's
intruders and its memory per NUMA node. The service calls `annotate` on the
views it built from one state snapshot, and `annotate_scrape` on what a
metrics scrape reads; nothing here changes the state.

Memory: in cgroup mode from the workload cgroup's memory.numa_stat (one small
read per workload, on every status); without a cgroup from the workload
process's /proc/PID/numa_maps, only when asked (`memory=True`): the kernel
walks the process's page tables for it.

A scrape reads no file: `sample_memory` reads every workload's
memory.numa_stat off the scrape path (`MemorySampler`, on its own timer) and
keeps the figures as one immutable `MemorySample`, replaced whole; the scrape
reports that sample (at most one sampling interval old) for the workloads its
state still holds, and lists only the workloads that have a series.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from numa_agent.core.layered import Layered
from numa_agent.enforcement.plan import workload_relpath
from numa_agent.observe.model import Intruder, locality
from numa_agent.observe.procfs import TaskSource
from numa_agent.observe.ticker import Ticker
from numa_agent.observe.watcher import IntruderWatcher
from numa_agent.state.model import AgentState, FollowsWorkloads, Workload

log = logging.getLogger("numa_agent.observe")

MEMORY_SAMPLE_SECONDS = 2.0  # between memory samples when the intruder scan is off


@dataclass(frozen=True)
class MemorySample:
    """Every workload's memory per node from its cgroup's memory.numa_stat, read
    at one time: workload name -> (its created_unix, its `locality`). The
    creation time tells a workload from a later one of the same name."""

    figures: Mapping[str, tuple[float, Mapping[str, Any]]] = field(default_factory=lambda: MappingProxyType({}))
    finished_unix: float | None = None


@dataclass(frozen=True)
class ExclusiveWorkloads(FollowsWorkloads):
    """The names of the held (not quarantined) workloads with exclusive CPUs:
    those with an intruder series. Kept in the state's memo and followed
    through every update, so a scrape costs them, not every workload."""

    names: Layered[str, bool] = field(default_factory=Layered)

    def after_workloads(self, removed: Sequence[Workload], added: Sequence[Workload]) -> "ExclusiveWorkloads":
        gone = [w.name for w in removed if _exclusive(w)]
        came = {w.name: True for w in added if _exclusive(w)}
        if not gone and not came:
            return self
        return ExclusiveWorkloads(self.names.updated(came, removed=gone))


def _exclusive(w: Workload) -> bool:
    return not w.shared and not w.quarantined


def exclusive_workloads(state: AgentState) -> Layered[str, bool]:
    kept = state.memo.get("exclusive_workloads")
    if not isinstance(kept, ExclusiveWorkloads):
        kept = state.memo["exclusive_workloads"] = ExclusiveWorkloads().after_workloads((), state.workloads)
    return kept.names


@dataclass
class Observer:
    source: TaskSource
    path_of: Callable[[str], str | None]  # the enforcer's: a workload's cgroup directory
    watcher: IntruderWatcher | None = None  # None: the intruder scan is off
    clock: Callable[[], float] = time.time
    # The last memory sample (replaced whole, never changed): what a scrape reports.
    sample: MemorySample = field(default_factory=MemorySample)

    def sample_memory(self, state: AgentState) -> MemorySample:
        """Read every held workload's memory.numa_stat (cgroup mode; nothing
        without cgroups) and keep the figures as the new sample."""
        figures: dict[str, tuple[float, Mapping[str, Any]]] = {}
        if self.path_of("") is not None:  # affinity mode: no cgroup, nothing to read
            for w in state.workloads:
                numa = None if w.quarantined else self.memory(w, requested=False)
                if numa is not None:
                    figures[w.name] = (w.created_unix, numa)
        self.sample = MemorySample(MappingProxyType(figures), self.clock())
        return self.sample

    def memory(self, w: Workload, requested: bool) -> dict | None:
        booked = w.booking.mems or w.booking.numa_nodes
        directory = self.path_of(workload_relpath(w))
        if directory is not None:
            per_node = self.source.numa_stat(directory)
            return None if per_node is None else locality(per_node, booked, "memory.numa_stat")
        if requested and w.pid is not None:
            per_node = self.source.numa_maps(w.pid)
            return None if per_node is None else locality(per_node, booked, "numa_maps")
        return None

    def annotate(self, state: AgentState, status: dict[str, Any], *, memory: bool = False) -> None:
        """Add `intruders`, `kernel_threads` and `memory_numa` to each workload of `status`,
        and the scan's own figures as `observe`."""
        watcher = self.watcher
        found = watcher.by_workload() if watcher is not None else {}
        for view in status.get("workloads", ()):
            w = state.workload(view["name"])
            if w is None:
                continue
            view.update(_intruder_views(found.get(w.name, ())))
            view["memory_numa"] = self.memory(w, memory)
        status["observe"] = self._scan_figures()

    def annotate_scrape(self, state: AgentState, status: dict[str, Any]) -> None:
        """What a metrics scrape needs, without reading a file: `workloads`, only
        those with a series (each held exclusive workload with its intruders, each
        workload of the last memory sample still held, with its memory), and the
        scan's figures as `observe`."""
        watcher = self.watcher
        found = watcher.by_workload() if watcher is not None else {}
        views: dict[str, dict[str, Any]] = {}
        for name in exclusive_workloads(state):
            views[name] = {"name": name, "exclusive": True, **_intruder_views(found.get(name, ()))}
        for name, (created, numa) in self.sample.figures.items():
            w = state.workload(name)
            if w is None or w.quarantined or w.created_unix != created:
                continue  # released (or another workload by that name) since the sample
            views.setdefault(name, {"name": name, "exclusive": not w.shared})["memory_numa"] = numa
        status["workloads"] = list(views.values())
        status["observe"] = self._scan_figures()

    def _scan_figures(self) -> dict[str, Any]:
        watcher = self.watcher
        last = watcher.last if watcher is not None else None
        return {
            "intruder_scan_seconds": watcher.interval if watcher is not None else 0,
            "intruders_seen_total": watcher.seen_total if watcher is not None else 0,
            "last_scan": None if last is None or last.finished_unix is None else {
                "finished_unix": last.finished_unix, "tasks": last.tasks,
                "milliseconds": round(last.seconds * 1000, 3)},
        }


def _intruder_views(found: Sequence[Intruder]) -> dict[str, list[dict[str, Any]]]:
    """A workload's `intruders` (user space) and `kernel_threads`, as status and metrics show them."""
    return {"intruders": [i.to_json() for i in found if not i.kernel],
            "kernel_threads": [i.to_json() for i in found if i.kernel]}


@dataclass
class MemorySampler:
    """Calls `observer.sample_memory(state())` every `interval` seconds on its
    own thread (never on a scrape, the API's or the admission path)."""

    observer: Observer
    state: Callable[[], AgentState]
    interval: float = MEMORY_SAMPLE_SECONDS
    _ticker: Ticker | None = None

    def sample_once(self) -> MemorySample:
        return self.observer.sample_memory(self.state())

    def start(self) -> "MemorySampler":
        self._ticker = Ticker("numa-agent-memory", self.interval, self.sample_once, "memory sample",
                              at_start=True).start()
        return self

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
