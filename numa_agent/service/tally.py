"""Workload figures the metrics give, kept in the state's memo and followed
through every update (FollowsWorkloads), so a scrape costs the figures, not
the number of workloads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from numa_agent.state.model import AgentState, FollowsWorkloads, Workload


@dataclass(frozen=True)
class WorkloadTally(FollowsWorkloads):
    held: int = 0  # workloads held, quarantined ones not counted
    lost: int = 0  # of those, the ones that lost a CPU or device to hotplug

    def after_workloads(self, removed: Sequence[Workload], added: Sequence[Workload]) -> "WorkloadTally":
        held, lost = self.held, self.lost
        for workloads, sign in ((removed, -1), (added, 1)):
            for w in workloads:
                if not w.quarantined:
                    held += sign
                    lost += sign if w.lost else 0
        return WorkloadTally(held, lost)


def workload_tally(state: AgentState) -> WorkloadTally:
    kept = state.memo.get("workload_tally")
    if not isinstance(kept, WorkloadTally):
        kept = state.memo["workload_tally"] = WorkloadTally().after_workloads((), state.workloads)
    return kept
