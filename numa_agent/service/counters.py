"""Counters the agent exports as metrics. Updated under the service lock."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass
class Counters:
    requests: dict[str, int] = field(default_factory=lambda: {"admitted": 0, "refused": 0, "dry_run": 0})
    errors: dict[str, int] = field(default_factory=dict)
    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))
    duration_sum: float = 0.0
    duration_count: int = 0
    checkpoint_writes_total: int = 0
    checkpoint_failures_total: int = 0
    checkpoint_snapshots_total: int = 0  # whole snapshots among the writes (the rest: journal entries)
    # Releases of exited workloads waiting for the checkpoint (set by the event loop).
    pending_releases: int = 0
    checkpoint_healthy: bool = True  # the last checkpoint write succeeded
    hotplug_events: dict[str, int] = field(default_factory=lambda: {"cpu": 0, "memory": 0, "node": 0, "pci": 0})
    aligned: dict[str, int] = field(default_factory=lambda: {"numa_node": 0, "physical_core": 0, "l3": 0})
    releases_total: int = 0
    # API connections turned away, by reason; counted by the API's I/O thread
    # (the only writer; every key exists from the start, so a snapshot copy
    # never sees the dict change size).
    api_refused_connections: dict[str, int] = field(
        default_factory=lambda: {"busy": 0, "timeout": 0, "per_uid_limit": 0})

    def _observe(self, seconds: float) -> None:
        self.duration_sum += seconds
        self.duration_count += 1
        i = bisect.bisect_left(DURATION_BUCKETS, seconds)
        if i < len(self.bucket_counts):
            self.bucket_counts[i] += 1

    def admitted(self, seconds: float, alignment: dict) -> None:
        self.requests["admitted"] += 1
        self._observe(seconds)
        for level, ok in alignment.items():
            if ok and level in self.aligned:
                self.aligned[level] += 1

    def refused(self, reason: str, seconds: float) -> None:
        self.requests["refused"] += 1
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self._observe(seconds)

    def dry_run(self, seconds: float) -> None:
        self.requests["dry_run"] += 1
        self._observe(seconds)

    def hotplug(self, kind: str) -> None:
        self.hotplug_events[kind] = self.hotplug_events.get(kind, 0) + 1

    def api_refused(self, reason: str) -> None:
        if reason in self.api_refused_connections:
            self.api_refused_connections[reason] += 1

    def snapshot(self) -> dict:
        cumulative, running = [], 0
        for bound, count in zip(DURATION_BUCKETS, self.bucket_counts, strict=True):
            running += count
            cumulative.append([bound, running])
        return {
            "admission_requests_total": dict(self.requests),
            "admission_errors_total": dict(sorted(self.errors.items())),
            "admission_duration_seconds": {"buckets": cumulative, "sum": self.duration_sum,
                                           "count": self.duration_count},
            "checkpoint_writes_total": self.checkpoint_writes_total,
            "checkpoint_failures_total": self.checkpoint_failures_total,
            "checkpoint_snapshots_total": self.checkpoint_snapshots_total,
            "pending_releases": self.pending_releases,
            "checkpoint_healthy": self.checkpoint_healthy,
            "hotplug_events_total": dict(self.hotplug_events),
            "aligned_allocations_total": dict(self.aligned),
            "releases_total": self.releases_total,
            "api_refused_connections_total": dict(self.api_refused_connections),
        }
