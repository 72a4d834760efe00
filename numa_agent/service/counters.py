"""Counters the agent exports as metrics. Updated under the service lock."""

from __future__ import annotations

from dataclasses import dataclass, field

from numa_agent.core.histogram import Histogram

DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# The kubelet's topology_manager_admission_duration_ms buckets (0.05 ms doubling, 15 of
# them), in seconds: Prometheus' base unit.
TOPOLOGY_DURATION_BUCKETS = tuple(0.05 * 2 ** i / 1000 for i in range(15))
# The managers that have the kubelet's pinning families, by provider name.
PINNING_MANAGERS = ("cpu", "memory")
# (scope, boundary) label pairs of the alignment families, as the kubelet initialises them.
ALIGNMENT_LABELS = (("container", "numa_node"), ("pod", "numa_node"), ("container", "physical_cpu"))


@dataclass(frozen=True)
class ManagerOutcome:
    """One admission as the kubelet's resource managers see it.

    `pinned`: providers that allocated a part ("cpu", "memory", "devices"); `failed`: the
    provider whose allocation refused it; `merge_refused`: the topology merge refused it;
    `guaranteed`: merged under single-numa-node (the kubelet's IsAlignmentGuaranteed);
    `scope`: "pod" for a pod member, else "container"; `full_pcpus_only`: the CPU option."""

    pinned: frozenset[str] = frozenset()
    failed: str | None = None
    merge_refused: bool = False
    guaranteed: bool = False
    scope: str = "container"
    full_pcpus_only: bool = False


@dataclass
class Counters:
    requests: dict[str, int] = field(default_factory=lambda: {"admitted": 0, "refused": 0, "dry_run": 0})
    errors: dict[str, int] = field(default_factory=dict)
    duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    # The kubelet's families (see docs/contracts.md, Metrics): admissions that reached the
    # topology manager, per-manager pinning, and guaranteed alignment.
    topology_requests: int = 0
    topology_errors: int = 0
    topology_duration: Histogram = field(default_factory=lambda: Histogram(TOPOLOGY_DURATION_BUCKETS))
    pinning_requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PINNING_MANAGERS, 0))
    pinning_errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PINNING_MANAGERS, 0))
    aligned_guaranteed: dict[tuple[str, str], int] = field(
        default_factory=lambda: dict.fromkeys(ALIGNMENT_LABELS, 0))
    aligned_guaranteed_failures: dict[tuple[str, str], int] = field(
        default_factory=lambda: dict.fromkeys(ALIGNMENT_LABELS, 0))
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
        self.duration.observe(seconds)

    def decided(self, outcome: ManagerOutcome, seconds: float) -> None:
        """An admission the topology manager decided, counted where the kubelet counts it:
        every such admission is a request; a merge or allocation refusal an error; a
        manager that allocated, or refused, a pinning request; alignment only where it
        was guaranteed (single-numa-node for NUMA, full-pcpus-only for physical CPUs)."""
        self.topology_requests += 1
        self.topology_duration.observe(seconds)
        refused = outcome.merge_refused or outcome.failed is not None
        if refused:
            self.topology_errors += 1
        for manager in PINNING_MANAGERS:
            if manager in outcome.pinned or outcome.failed == manager:
                self.pinning_requests[manager] += 1
                self.pinning_errors[manager] += outcome.failed == manager
        numa = (outcome.scope, "numa_node")
        if outcome.guaranteed and outcome.merge_refused:
            self.aligned_guaranteed_failures[numa] += 1
        elif outcome.guaranteed and not refused:
            self.aligned_guaranteed[numa] += 1
        if outcome.full_pcpus_only and ("cpu" in outcome.pinned or outcome.failed == "cpu"):
            core = ("container", "physical_cpu")
            if outcome.failed == "cpu":
                self.aligned_guaranteed_failures[core] += 1
            else:
                self.aligned_guaranteed[core] += 1

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
        return {
            "admission_requests_total": dict(self.requests),
            "admission_errors_total": dict(sorted(self.errors.items())),
            "admission_duration_seconds": self.duration.snapshot(),
            "topology_manager_admission_requests_total": self.topology_requests,
            "topology_manager_admission_errors_total": self.topology_errors,
            "topology_manager_admission_duration_seconds": self.topology_duration.snapshot(),
            "pinning_requests_total": dict(self.pinning_requests),
            "pinning_errors_total": dict(self.pinning_errors),
            "aligned_compute_resources_total": [[*k, v] for k, v in self.aligned_guaranteed.items()],
            "aligned_compute_resources_failures_total": [
                [*k, v] for k, v in self.aligned_guaranteed_failures.items()],
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
