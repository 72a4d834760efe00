"""What observation adds to `status`: each workload's intruders and its memory
per NUMA node. The service calls `annotate` on the views it built from one
state snapshot; nothing here changes the state.

Memory: in cgroup mode from the workload cgroup's memory.numa_stat (one small
read per workload, on every status); without a cgroup from the workload
process's /proc/PID/numa_maps, only when asked (`memory=True`): the kernel
walks the process's page tables for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from numa_agent.enforcement.plan import workload_relpath
from numa_agent.observe.model import locality
from numa_agent.observe.procfs import TaskSource
from numa_agent.observe.watcher import IntruderWatcher
from numa_agent.state.model import AgentState, Workload


@dataclass
class Observer:
    source: TaskSource
    path_of: Callable[[str], str | None]  # the enforcer's: a workload's cgroup directory
    watcher: IntruderWatcher | None = None  # None: the intruder scan is off

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
            view["intruders"] = [i.to_json() for i in found.get(w.name, ()) if not i.kernel]
            view["kernel_threads"] = [i.to_json() for i in found.get(w.name, ()) if i.kernel]
            view["memory_numa"] = self.memory(w, memory)
        last = watcher.last if watcher is not None else None
        status["observe"] = {
            "intruder_scan_seconds": watcher.interval if watcher is not None else 0,
            "intruders_seen_total": watcher.seen_total if watcher is not None else 0,
            "last_scan": None if last is None or last.finished_unix is None else {
                "finished_unix": last.finished_unix, "tasks": last.tasks,
                "milliseconds": round(last.seconds * 1000, 3)},
        }
