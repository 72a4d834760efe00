"""Prometheus metrics: a read-only view of the service's state, built at scrape time.

`AgentCollector` calls the service's `metrics_snapshot()` once per scrape, so every family
in one scrape comes from the same consistent snapshot, and turns it into metric families
(prefix `numa_agent_`, base units, `_total` counters). It lives on the agent's own
`CollectorRegistry` (never the global default one, which any imported library may fill),
beside the process's own series (`process_*`, views/process_metrics.py) and
prometheus_client's platform and GC collectors (`python_*`).

`start_metrics_server("HOST:PORT", registry)` serves `/metrics` over plain HTTP on TCP,
by default on 127.0.0.1:9464 (loopback only: the figures describe the node's tenants).
Snapshot shape: see the service contract (`{"status": status(), "counters": {...}}`, and
optionally `"info": {"version": ..., "enforcement": ...}`).
Histogram buckets in the snapshot are cumulative `[upper_bound, count]` pairs, as
Prometheus defines them; the `+Inf` bucket is added from `count` when absent.
"""

from __future__ import annotations

import gzip
import logging
import math
import selectors
import socket
import struct
import threading
import time
from collections import deque
from importlib import metadata
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.utils import floatToGoString

from numa_agent.admission.quota import limited
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.printable import printable
from numa_agent.views.bounded import BoundedListener
from numa_agent.views.process_metrics import ProcessMetrics

log = logging.getLogger("numa_agent.metrics")

DEFAULT_METRICS_ADDRESS = "127.0.0.1:9464"
PREFIX = "numa_agent_"

# Fixed label-value orders, so output never depends on dict order in the snapshot and
# dashboards see every series (at 0) from the first scrape on.
# States partition a resource: their sum is the `_capacity` family's value.
RESOURCE_STATES = ("reserved", "allocated", "free")
ADMISSION_RESULTS = ("admitted", "refused", "dry_run")
ALIGNMENT_LEVELS = ("numa_node", "physical_core", "l3")
HOTPLUG_KINDS = ("cpu", "memory", "node", "pci")
API_REFUSAL_REASONS = ("busy", "timeout", "per_uid_limit")

Snapshot = Mapping[str, Any]


def _agent_version() -> str:
    try:
        return metadata.version("numa-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


def _label(value: Any) -> str:
    """A label value from the snapshot (a user's name, a workload's, a resource's) as
    text a person reading a dashboard or the exposition can take: controls and bidi
    controls escaped (core.printable); prometheus_client then escapes the backslash, the
    quote and the newline as the exposition format requires."""
    return printable(str(value))


def _kubernetes_family(containers: list[Mapping[str, Any]]) -> Metric:
    """One series per container a runtime enforces (NRI), naming it as Kubernetes does:
    joined on `workload` to the series that carry only the agent's name."""
    info = GaugeMetricFamily(
        PREFIX + "kubernetes_container_info", "A container its runtime enforces (NRI): the agent's workload "
        "name and the container's Kubernetes namespace, pod and name. Always 1.",
        labels=["workload", "namespace", "pod", "container"])
    for c in containers:
        info.add_metric([_label(c.get(key, "")) for key in ("workload", "namespace", "pod", "container")], 1.0)
    return info


def _labelled_counts(values: Mapping[str, Any] | None, always: tuple[str, ...] = ()) -> list[tuple[str, float]]:
    """(label, value) pairs: the `always` labels first in that order, then the rest sorted."""
    values = values or {}
    out = [(key, float(values.get(key, 0))) for key in always]
    out += [(_label(key), float(values[key])) for key in sorted(values, key=str) if key not in always]
    return out


def _states(values: Mapping[str, Any] | None) -> list[tuple[str, float]]:
    values = values or {}
    return [(state, float(values[state])) for state in RESOURCE_STATES if state in values]


def _histogram(name: str, doc: str, snapshot: Mapping[str, Any] | None) -> HistogramMetricFamily:
    """A histogram family from a snapshot's cumulative [upper_bound, count] buckets."""
    buckets, total = _buckets(snapshot)
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def _buckets(snapshot: Mapping[str, Any] | None) -> tuple[list[tuple[str, float]], float]:
    """A snapshot's cumulative buckets as the exposition's (le, count) pairs, `+Inf` last; its sum."""
    snapshot = snapshot or {}
    count = float(snapshot.get("count", 0))
    buckets = sorted((float(le), float(n)) for le, n in snapshot.get("buckets", []))
    pairs = [(floatToGoString(le), n) for le, n in buckets if not math.isinf(le)]
    pairs.append(("+Inf", count))
    return pairs, float(snapshot.get("sum", 0.0))


class AgentCollector:
    """A prometheus-client collector over `snapshot_fn()` (the service's metrics_snapshot)."""

    def __init__(self, snapshot_fn: Callable[[], Snapshot], version: str | None = None) -> None:
        self._snapshot_fn = snapshot_fn
        self._version = version if version is not None else _agent_version()

    def describe(self) -> Iterator[Metric]:
        # Lets the registry check names at registration without taking a snapshot.
        return iter(self._families({"status": {}, "counters": {}}))

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = self._snapshot_fn()
        except Exception:
            log.exception("metrics scrape failed: the service snapshot raised")
            raise
        return iter(self._families(snapshot))

    @staticmethod
    def _isolation_families(status: Mapping[str, Any], knobs: Mapping[tuple[str, str], int]) -> list[Metric]:
        held = GaugeMetricFamily(
            PREFIX + "isolation_knobs", "Interrupt, idle and frequency settings changed for isolated "
            "workloads, by kind (irqs, idle, freq) and state (held, restore_failed).", labels=["kind", "state"])
        for kind in ("irqs", "idle", "freq"):
            for state in ("held", "restore_failed"):
                held.add_metric([kind, state], float(knobs.get((kind, state), 0)))
        failures = GaugeMetricFamily(
            PREFIX + "isolation_restore_failures", "Isolation settings whose restore to their original "
            "value failed (retried with backoff; listed in status).",
            value=float(len(status.get("restore_failures") or ())))
        return [held, failures]

    def _families(self, snapshot: Snapshot) -> list[Metric]:
        status = snapshot.get("status") or {}
        counters = snapshot.get("counters") or {}
        families: list[Metric] = []
        families += self._admission_families(counters)
        families += self._kubelet_families(counters, status)
        families += self._node_families(status.get("nodes") or [])
        families.append(_memory_short_family(status.get("nodes") or []))

        workloads = status.get("workloads") or []
        # The service's metrics status gives the counts kept in its state's memo
        # (constant per scrape); a full status view is counted here.
        tally = status.get("workload_tally") or {
            "held": len(workloads), "lost": sum(1 for w in workloads if w.get("lost"))}
        pod_count = status.get("pod_count", len(status.get("pods") or []))
        families.append(GaugeMetricFamily(
            PREFIX + "workloads", "Admitted workloads currently held.", value=tally["held"]))
        families.append(GaugeMetricFamily(
            PREFIX + "pods", "Pods (groups of workloads sharing a budget) currently held.",
            value=pod_count))
        families.append(GaugeMetricFamily(
            PREFIX + "workloads_lost_resources",
            "Workloads that lost a CPU or device to hotplug since admission.",
            value=tally["lost"]))

        families += self._observe_families(workloads, status.get("observe") or {})
        families.append(_kubernetes_family(status.get("kubernetes_containers") or []))
        families += _quota_families(status.get("quotas") or [])

        aligned = CounterMetricFamily(
            PREFIX + "aligned_allocations", "Admissions whose allocation was aligned, by level.",
            labels=["level"])
        for level, value in _labelled_counts(counters.get("aligned_allocations_total"), ALIGNMENT_LEVELS):
            aligned.add_metric([level], value)
        families.append(aligned)

        families.append(CounterMetricFamily(
            PREFIX + "releases", "Workloads released.",
            value=float(counters.get("releases_total", 0))))
        families.append(CounterMetricFamily(
            PREFIX + "checkpoint_writes", "Checkpoints written.",
            value=float(counters.get("checkpoint_writes_total", 0))))
        families.append(CounterMetricFamily(
            PREFIX + "checkpoint_failures", "Checkpoint writes that failed.",
            value=float(counters.get("checkpoint_failures_total", 0))))

        families.append(CounterMetricFamily(
            PREFIX + "checkpoint_snapshots", "Checkpoint writes that were whole snapshots "
            "(the others appended one change to the journal).",
            value=float(counters.get("checkpoint_snapshots_total", 0))))
        families.append(GaugeMetricFamily(
            PREFIX + "checkpoint_healthy", "1 while the last checkpoint write succeeded, 0 while "
            "writes fail (admissions and releases are refused meanwhile).",
            value=1.0 if counters.get("checkpoint_healthy", True) else 0.0))
        families.append(GaugeMetricFamily(
            PREFIX + "pending_releases", "Releases of exited workloads waiting to be checkpointed "
            "(retried with backoff).", value=float(counters.get("pending_releases", 0))))
        families += self._isolation_families(status.get("isolation") or {}, snapshot.get("isolation_knobs") or {})

        hotplug = CounterMetricFamily(
            PREFIX + "hotplug_events", "Hotplug events handled, by kind.", labels=["kind"])
        for kind, value in _labelled_counts(counters.get("hotplug_events_total"), HOTPLUG_KINDS):
            hotplug.add_metric([kind], value)
        families.append(hotplug)

        refused = CounterMetricFamily(
            PREFIX + "api_refused_connections",
            "API connections turned away: busy (connection cap), timeout (request not sent or "
            "response not read in time), per_uid_limit (a user's unfinished connections).",
            labels=["reason"])
        for reason, value in _labelled_counts(counters.get("api_refused_connections_total"),
                                              API_REFUSAL_REASONS):
            refused.add_metric([reason], value)
        families.append(refused)

        # The snapshot's own "info" (when the service supplies it) wins over our defaults.
        info_doc = snapshot.get("info") or {}
        version = _label(info_doc.get("version") or self._version)
        enforcement = _label(info_doc.get("enforcement") or status.get("enforcement") or "unknown")
        info = GaugeMetricFamily(
            PREFIX + "info", "Agent version and enforcement mode (cgroup, simulated or affinity).",
            labels=["version", "enforcement"])
        info.add_metric([version, enforcement], 1)
        families.append(info)
        return families

    def _admission_families(self, counters: Mapping[str, Any]) -> list[Metric]:
        requests = CounterMetricFamily(
            PREFIX + "admission_requests", "Admission requests, by result.", labels=["result"])
        for result, value in _labelled_counts(counters.get("admission_requests_total"), ADMISSION_RESULTS):
            requests.add_metric([result], value)
        errors = CounterMetricFamily(
            PREFIX + "admission_errors", "Refused or failed admissions, by reason.", labels=["reason"])
        for reason, value in _labelled_counts(counters.get("admission_errors_total")):
            errors.add_metric([reason], value)

        histogram = _histogram(PREFIX + "admission_duration_seconds", "Time to answer one admission "
                               "(decision, checkpoint and enforcement).", counters.get("admission_duration_seconds"))
        return [requests, errors, histogram]

    @staticmethod
    def _kubelet_families(counters: Mapping[str, Any], status: Mapping[str, Any]) -> list[Metric]:
        """The kubelet's resource-manager families, by its names and meaning (docs/contracts.md
        says which kubelet family each mirrors and where they differ)."""
        families: list[Metric] = []
        for manager, what in (("cpu", "exclusive CPUs"), ("memory", "memory or hugepages on NUMA nodes")):
            for kind, doc in (("requests", f"Admissions that asked the {manager} manager for {what}."),
                              ("errors", f"Admissions the {manager} manager could not give {what}.")):
                families.append(CounterMetricFamily(
                    f"{PREFIX}{manager}_manager_pinning_{kind}", doc,
                    value=float((counters.get(f"pinning_{kind}_total") or {}).get(manager, 0))))
        nodes = status.get("nodes") or []
        families.append(GaugeMetricFamily(
            PREFIX + "cpu_manager_shared_pool_size_millicores", "The size of the shared CPU pool (every "
            "usable CPU no workload holds exclusively), millicores.",
            value=1000.0 * len(CpuSet.parse(str(status.get("shared_pool") or "")))))
        families.append(GaugeMetricFamily(
            PREFIX + "cpu_manager_exclusive_cpus", "CPUs held exclusively by workloads.",
            value=float(sum((n.get("cpus") or {}).get("allocated", 0) for n in nodes))))
        families.append(CounterMetricFamily(
            PREFIX + "topology_manager_admission_requests", "Admissions the topology manager decided "
            "(not dry runs, not malformed requests).",
            value=float(counters.get("topology_manager_admission_requests_total", 0))))
        families.append(CounterMetricFamily(
            PREFIX + "topology_manager_admission_errors", "Admissions refused by the topology merge or by "
            "a manager's allocation.", value=float(counters.get("topology_manager_admission_errors_total", 0))))
        families.append(_histogram(
            PREFIX + "topology_manager_admission_duration_seconds", "Time the topology manager took to decide "
            "one admission (hints, merge, allocation).", counters.get("topology_manager_admission_duration_seconds")))
        for key, doc in (("aligned_compute_resources", "Admissions whose resources were aligned where the "
                          "policy guarantees it: numa_node under single-numa-node, physical_cpu under "
                          "full-pcpus-only."),
                         ("aligned_compute_resources_failures", "Admissions refused where the policy "
                          "guarantees alignment (single-numa-node merge, full-pcpus-only CPUs).")):
            family = CounterMetricFamily(PREFIX + key, doc, labels=["scope", "boundary"])
            for scope, boundary, value in counters.get(key + "_total") or ():
                family.add_metric([_label(scope), _label(boundary)], float(value))
            families.append(family)
        return families

    def _observe_families(self, workloads: list[Mapping[str, Any]],
                          observe: Mapping[str, Any]) -> list[Metric]:
        """Intruders on exclusive CPUs and memory per node, where status has them."""
        intruders = GaugeMetricFamily(
            PREFIX + "exclusive_cpu_intruders", "Tasks outside the workload allowed on and last run on "
            "one of its exclusive CPUs, at the last scan.", labels=["workload"])
        kernel = GaugeMetricFamily(
            PREFIX + "exclusive_cpu_kernel_threads", "Kernel threads not bound to that CPU alone (unbound "
            "kworkers, kswapd) allowed on and last run on one of the workload's exclusive CPUs.",
            labels=["workload"])
        seen = CounterMetricFamily(
            PREFIX + "exclusive_cpu_intruders_seen", "Distinct intruders found since the agent started.",
            value=float(observe.get("intruders_seen_total", 0)))
        memory = GaugeMetricFamily(
            PREFIX + "workload_memory_bytes", "A workload's memory per NUMA node (cgroup memory.numa_stat "
            "anon + file).", labels=["workload", "numa_node"])
        outside = GaugeMetricFamily(
            PREFIX + "workload_memory_outside_bytes", "A workload's memory outside its booked NUMA nodes.",
            labels=["workload"])
        ratio = GaugeMetricFamily(
            PREFIX + "workload_memory_outside_ratio", "The share of a workload's memory outside its "
            "booked NUMA nodes (0-1).", labels=["workload"])
        for w in sorted(workloads, key=lambda w: str(w.get("name"))):
            name = _label(w.get("name"))
            if w.get("exclusive") and "intruders" in w:
                intruders.add_metric([name], float(len(w["intruders"])))
                kernel.add_metric([name], float(len(w.get("kernel_threads") or ())))
            numa = w.get("memory_numa")
            if not numa:
                continue
            for node, value in sorted((numa.get("bytes") or {}).items(), key=lambda kv: int(kv[0])):
                memory.add_metric([name, str(node)], float(value))
            if numa.get("outside_bytes") is not None:
                outside.add_metric([name], float(numa["outside_bytes"]))
                ratio.add_metric([name], float(numa["outside_ratio"]))
        return [intruders, kernel, seen, memory, outside, ratio]

    def _node_families(self, nodes: list[Mapping[str, Any]]) -> list[Metric]:
        """Per resource a `state` family (reserved, allocated, free) and a `_capacity` family
        they sum to, so that sum() over the states is the capacity."""
        kinds = (("cpus", "CPUs per NUMA node", ["numa_node"]),
                 ("memory_bytes", "Memory per NUMA node", ["numa_node"]),
                 ("hugepages", "Huge pages per NUMA node and page size (e.g. 2048kB)", ["numa_node", "size"]),
                 ("devices", "Devices per resource and NUMA node", ["resource", "numa_node"]))
        by_state = {key: GaugeMetricFamily(PREFIX + key, f"{doc}, by state (reserved, allocated, free).",
                                           labels=[*labels, "state"]) for key, doc, labels in kinds}
        capacity = {key: GaugeMetricFamily(PREFIX + _capacity_name(key), f"{doc}: capacity, the sum of the states.",
                                           labels=labels) for key, doc, labels in kinds}

        def add(key: str, labels: list[str], values: Mapping[str, Any] | None) -> None:
            if values and "capacity" in values:
                capacity[key].add_metric(labels, float(values["capacity"]))
            for state, value in _states(values):
                by_state[key].add_metric([*labels, state], value)

        for node in sorted(nodes, key=lambda n: int(n["id"])):
            node_id = str(node["id"])
            add("cpus", [node_id], node.get("cpus"))
            add("memory_bytes", [node_id], node.get("memory_bytes"))
            pages = node.get("hugepages") or {}
            for size in sorted(pages, key=_page_size_key):
                add("hugepages", [node_id, _label(size)], pages[size])
            resources = node.get("devices") or {}
            for resource in sorted(resources):
                add("devices", [_label(resource), node_id], resources[resource])
        return [family for key, _, _ in kinds for family in (by_state[key], capacity[key])]


def _capacity_name(key: str) -> str:
    """cpus -> cpus_capacity, memory_bytes -> memory_capacity_bytes (the unit stays last)."""
    return key[:-len("_bytes")] + "_capacity_bytes" if key.endswith("_bytes") else key + "_capacity"


def _memory_short_family(nodes: list[Mapping[str, Any]]) -> Metric:
    """Every node's regular memory (0 while it fits, so alerts see the
    series from the first scrape), and any other resource that is short."""
    short = GaugeMetricFamily(
        PREFIX + "memory_short_bytes", "Memory booked on a NUMA node beyond what it has now (it "
        "shrank under its bookings: memory offlined or unplugged, a balloon, a hugepage pool "
        "resized); above 0 the node takes no new admission.", labels=["numa_node", "resource"])
    for node in sorted(nodes, key=lambda n: int(n["id"])):
        missing = {_label(s["resource"]): int(s["booked_bytes"]) - int(s["allocatable_bytes"])
                   for s in node.get("memory_short") or ()}
        for resource in sorted({"memory", *missing}):
            short.add_metric([str(node["id"]), resource], float(missing.get(resource, 0)))
    return short


def _quota_families(owners: list[Mapping[str, Any]]) -> list[Metric]:
    """What each owner holds and may hold, for the resources a [quotas] entry limits it
    in: `resource` is cpus (exclusive CPUs), memory_bytes or a device resource's name
    (devices); `owner` the user name, else the uid."""
    labels = ["owner", "resource"]
    used = GaugeMetricFamily(PREFIX + "quota_used", "What an owner with a quota holds, by resource: "
                             "exclusive CPUs (cpus), booked memory and hugepages in bytes (memory_bytes), "
                             "devices (by resource name).", labels=labels)
    limit = GaugeMetricFamily(PREFIX + "quota_limit", "An owner's limit from [quotas], by resource "
                              "(units as numa_agent_quota_used).", labels=labels)
    for owner in owners:
        name = _label(owner["owner"] if owner.get("owner") is not None else owner["owner_uid"])
        for resource, part in limited(owner):
            used.add_metric([name, _label(resource)], float(part["used"]))
            limit.add_metric([name, _label(resource)], float(part["limit"]))
    return [used, limit]


def _page_size_key(size: str) -> tuple[int, str]:
    digits = "".join(ch for ch in str(size) if ch.isdigit())
    return (int(digits) if digits else 0, str(size))


class NriCollector:
    """The NRI plugin's families (`numa_agent_nri_*`) from `stats_fn()`: nri/adapter.py's
    `NriAdapter.stats`, whose `call` keys are the fixed set of NRI methods the handler answers."""

    def __init__(self, stats_fn: Callable[[], Mapping[str, Any]]) -> None:
        self._stats_fn = stats_fn

    def collect(self) -> Iterator[Metric]:
        stats = self._stats_fn()
        yield GaugeMetricFamily(PREFIX + "nri_connected", "1 while the NRI plugin is registered with the "
                                "container runtime, 0 while it waits for or reconnects to it.",
                                value=1.0 if stats["connected"] else 0.0)
        yield CounterMetricFamily(PREFIX + "nri_connections", "Registrations with the container runtime "
                                  "(each reconnection adds one).", value=float(stats["connections_total"]))
        requests = CounterMetricFamily(PREFIX + "nri_requests", "The runtime's NRI calls answered by the agent's "
                                       "handler, by NRI method.", labels=["call"])
        durations = HistogramMetricFamily(PREFIX + "nri_request_duration_seconds", "Time the agent's handler took "
                                          "to answer the runtime's NRI calls, by NRI method.", labels=["call"])
        for call, count in stats["requests_total"].items():
            requests.add_metric([call], float(count))
            buckets, total = _buckets(stats["request_duration_seconds"][call])
            durations.add_metric([call], buckets, sum_value=total)
        yield requests
        yield durations
        yield CounterMetricFamily(PREFIX + "nri_refusals", "Containers whose creation or update the agent refused "
                                  "over NRI (the runtime fails them with the reason).",
                                  value=float(stats["refusals_total"]))


def build_registry(snapshot_fn: Callable[[], Snapshot], version: str | None = None) -> CollectorRegistry:
    """A fresh registry: the agent's collector, the process's (`process_*`, from /proc/self),
    and prometheus_client's platform (`python_info`) and garbage-collector (`python_gc_*`) collectors."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(AgentCollector(snapshot_fn, version))
    registry.register(ProcessMetrics())
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def parse_address(address: str) -> tuple[str, int]:
    """"HOST:PORT" or "[IPV6]:PORT" -> (host, port); ValueError says what is wrong."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"metrics address must be HOST:PORT (e.g. {DEFAULT_METRICS_ADDRESS}); got {address!r}")
    text = address.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"metrics address {address!r}: expected [IPV6]:PORT, e.g. [::1]:9464")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"metrics address {address!r} has no port; expected HOST:PORT, e.g. {DEFAULT_METRICS_ADDRESS}")
        if ":" in host:
            raise ValueError(f"metrics address {address!r}: put an IPv6 address in brackets, e.g. [::1]:9464")
    if not host:
        raise ValueError(f"metrics address {address!r} has no host; use 0.0.0.0 or [::] to listen on all addresses")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"metrics address {address!r}: port must be a number from 0 to 65535")
    return host, int(port_text)


# ---------------------------------------------------------------- the listener
# A connection must send its whole request head within this of its accept (a
# deadline for the head, not for each recv: a client trickling a byte at a time
# is dropped as one that sends nothing), and read the whole answer within it of
# the answer's start.
METRICS_REQUEST_DEADLINE_SECONDS = 5.0
MAX_METRICS_HEAD_BYTES = 8 * 1024
METRICS_CONNECTIONS_FLOOR = 4
METRICS_CONNECTIONS_CEILING = 64
# Connections are turned away past the bound (503 busy), past a peer's share of
# it (503 per_peer_limit: a uid, or a remote host's address on TCP), or dropped
# at the deadline (timeout).
METRICS_REFUSAL_REASONS = ("busy", "per_peer_limit", "timeout")


def metrics_connection_cap(nofile: int) -> int:
    """Connections /metrics holds at once for an open-file limit: a sixteenth of
    it, from 4 to 64. Each costs one descriptor and no thread; the API's bound
    (api/server.py, `connection_cap`) is taken from what is left, so idle
    scrapers can never take the descriptors an admission needs."""
    return max(METRICS_CONNECTIONS_FLOOR, min(METRICS_CONNECTIONS_CEILING, nofile // 16))


def metrics_per_peer_cap(max_connections: int) -> int:
    """A quarter of the bound per peer: one user (or host) cannot hold it all."""
    return max(1, max_connections // 4)


def nofile_limit() -> int:
    """The soft RLIMIT_NOFILE now in force (a large figure for unlimited)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _peer_of(sock: socket.socket, address: Any) -> tuple[str, Any]:
    """Whom a connection counts against: its uid on a Unix socket (SO_PEERCRED); on TCP
    the uid too when the peer is a socket of this host (any of 127.0.0.0/8, or one of
    the host's own addresses: one user binding each connection to another address is
    still one peer), else its remote address."""
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return ("uid", struct.unpack("3i", creds)[1])
    uid = _local_tcp_peer_uid(sock)
    if uid is not None:
        return ("uid", uid)
    return ("address", address[0] if isinstance(address, tuple) else address)


# sock_diag(7): one exact lookup of a TCP socket by its four-tuple.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_HEADER = struct.Struct("=IHHII")
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF


def _local_tcp_peer_uid(sock: socket.socket) -> int | None:
    """The uid owning the other end of TCP connection `sock` when that end is a socket
    of this host (sock_diag finds it by its four-tuple), else None."""
    try:
        local, remote = sock.getsockname(), sock.getpeername()
        family = sock.family

        def raw(host: str) -> bytes:
            return socket.inet_pton(family, host).ljust(16, b"\0")

        # The peer's socket, seen from its side: our remote end is its source.
        sockid = (struct.pack("!HH", remote[1], local[1]) + raw(remote[0]) + raw(local[0])
                  + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE))
        request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        header = _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                    _NLM_F_REQUEST, 1, 0)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            diag.send(header + request)
            answer = diag.recv(8192)
        _, kind, _, _, _ = _NLMSG_HEADER.unpack_from(answer)
        if kind != _SOCK_DIAG_BY_FAMILY:
            return None  # NLMSG_ERROR: no such socket here, the peer is another host
        # inet_diag_msg: family, state, timer, retrans; the 48-byte sockid; expires,
        # rqueue, wqueue, uid, inode.
        return int(struct.unpack_from("=IIIII", answer, _NLMSG_HEADER.size + 4 + 48)[3])
    except (OSError, ValueError, struct.error):
        return None


_STATUS_TEXT = {200: "OK", 400: "Bad Request", 405: "Method Not Allowed", 408: "Request Timeout",
                431: "Request Header Fields Too Large", 500: "Internal Server Error",
                503: "Service Unavailable"}


def _http_response(status: int, body: bytes, headers: tuple[tuple[str, str], ...] = (),
                   *, head_only: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Unknown')}",
             *(f"{name}: {value}" for name, value in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else body)


def _text_response(status: int, text: str, *extra: tuple[str, str]) -> bytes:
    return _http_response(status, text.encode() + b"\n", (("Content-Type", "text/plain; charset=utf-8"), *extra))


def render_scrape(registry: CollectorRegistry, head: bytes) -> bytes:
    """The whole HTTP answer to one request head (pure but for the collection):
    GET or HEAD of any path, `name[]=` to restrict, OpenMetrics and gzip by the
    Accept headers, as prometheus_client's own handler answers."""
    try:
        text = head.decode("latin-1")
        request_line, *header_lines = text.split("\r\n")
        method, target, version = request_line.split(" ")
        if not version.startswith("HTTP/") or not target.startswith("/"):
            raise ValueError(request_line)
        headers = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(line)
            headers[name.strip().lower()] = value.strip()
    except ValueError:
        return _text_response(400, "malformed request")
    if method not in ("GET", "HEAD"):
        return _text_response(405, "only GET and HEAD", ("Allow", "GET, HEAD"))
    try:
        params = parse_qs(urlsplit(target).query)
        encoder, content_type = choose_encoder(headers.get("accept") or "")
        source: Any = registry.restricted_registry(params["name[]"]) if "name[]" in params else registry
        output = encoder(source)
    except Exception:
        log.exception("metrics scrape failed")
        return _text_response(500, "error generating metric output")
    out_headers: tuple[tuple[str, str], ...] = (("Content-Type", content_type),)
    if gzip_accepted(headers.get("accept-encoding") or ""):
        output = gzip.compress(output)
        out_headers += (("Content-Encoding", "gzip"),)
    return _http_response(200, output, out_headers, head_only=method == "HEAD")


class _Client:
    """One connection: what it sent so far, or what is left to send it."""

    __slots__ = ("sock", "peer", "buf", "deadline", "out")

    def __init__(self, sock: socket.socket, peer: tuple[str, Any], deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.buf = bytearray()
        self.deadline = deadline
        self.out: memoryview | None = None  # set once the answer is under way


class MetricsListener(BoundedListener):
    """/metrics on one listening socket (TCP or Unix), from one thread.

    The thread multiplexes every connection with `selectors`: a connection
    costs one descriptor and a buffer, never a thread. At most
    `max_connections` are held at once (by default `metrics_connection_cap`
    of the open-file limit) and at most `max_per_peer` of them by one peer;
    one beyond either is answered 503 and closed at once. A connection
    whose request head has not arrived within `deadline` seconds of its
    accept, or which has not read the answer within `deadline` of its start,
    is dropped. What is turned away is counted by reason (`stats()`, and the
    `numa_agent_metrics_refused_connections` family) and logged at most once
    a second. The loop, the bounds and the refusal bookkeeping are
    `BoundedListener`'s (views/bounded.py); the HTTP is this class's.
    """

    what = "metrics"
    log = log

    def __init__(self, listener: socket.socket, registry: CollectorRegistry, *,
                 max_connections: int | None = None, max_per_peer: int | None = None,
                 deadline: float = METRICS_REQUEST_DEADLINE_SECONDS,
                 peer_of: Callable[[socket.socket, Any], tuple[str, Any]] = _peer_of) -> None:
        cap = max_connections or metrics_connection_cap(nofile_limit())
        self.registry = registry
        self.deadline = deadline
        self._clients: dict[int, _Client] = {}
        self._deadlines: deque[tuple[float, _Client]] = deque()
        super().__init__(listener, max_connections=cap, max_per_peer=max_per_peer or metrics_per_peer_cap(cap),
                         reasons=METRICS_REFUSAL_REASONS, peer_of=peer_of)

    # -- what BoundedListener asks of it ------------------------------------------
    def _open_count(self) -> int:
        return len(self._clients)

    def _open(self, sock: socket.socket, peer: tuple[str, Any]) -> None:
        client = _Client(sock, peer, time.monotonic() + self.deadline)
        self._clients[sock.fileno()] = client
        self._hold(peer)
        self._sel.register(sock, selectors.EVENT_READ, client)
        self._deadlines.append((client.deadline, client))

    def _on_event(self, client: _Client, mask: int) -> None:
        self._on_read(client) if client.out is None else self._on_write(client)

    def _drop(self, client: _Client) -> None:
        self._close(client)

    def _close_all(self) -> None:
        for client in list(self._clients.values()):
            self._close(client)

    def _next_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def _refuse(self, sock: socket.socket, reason: str, text: str = "") -> None:
        self._count(reason)
        try:
            sock.send(_text_response(503, f"{text}; retry", ("Retry-After", "1")))
        except OSError:
            pass
        sock.close()

    # -- the HTTP --------------------------------------------------------------------
    def _on_read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(client)
            return
        client.buf += chunk
        end = client.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(client.buf) > MAX_METRICS_HEAD_BYTES:
                self._answer(client, _text_response(431, f"request head exceeds {MAX_METRICS_HEAD_BYTES} bytes"))
            return
        self._answer(client, render_scrape(self.registry, bytes(client.buf[:end])))

    def _answer(self, client: _Client, data: bytes) -> None:
        client.buf = bytearray()
        client.out = memoryview(data)
        client.deadline = time.monotonic() + self.deadline
        self._deadlines.append((client.deadline, client))
        self._sel.modify(client.sock, selectors.EVENT_WRITE, client)
        self._on_write(client)

    def _on_write(self, client: _Client) -> None:
        assert client.out is not None
        try:
            sent = client.sock.send(client.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(client)
            return
        client.out = client.out[sent:]
        if not client.out:
            try:
                client.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._close(client)

    def _expire_connections(self, now: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, client = deadlines.popleft()
            if client.deadline != deadline or self._clients.get(client.sock.fileno()) is not client:
                continue  # answered (a later deadline is queued) or closed already
            self._count("timeout")
            if client.out is None:
                try:
                    client.sock.send(_text_response(408, f"request not received within {self.deadline:g} s"))
                except OSError:
                    pass
            self._close(client)

    def _close(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if fd < 0 or self._clients.get(fd) is not client:
            return
        del self._clients[fd]
        self._release(client.peer)
        self._forget(client.sock)


class _ListenerCollector:
    """The endpoint's own refusals, as `numa_agent_metrics_refused_connections`."""

    def __init__(self, listener: MetricsListener) -> None:
        self._listener = listener

    def collect(self) -> Iterator[Metric]:
        stats = self._listener.stats()
        refused = CounterMetricFamily(
            PREFIX + "metrics_refused_connections",
            "Metrics connections turned away: busy (connection bound), per_peer_limit (one uid "
            "or address at its share), timeout (request not sent or answer not read in time).",
            labels=["reason"])
        for reason in METRICS_REFUSAL_REASONS:
            refused.add_metric([reason], float(stats["refused_connections_total"][reason]))
        yield refused
        yield GaugeMetricFamily(PREFIX + "metrics_open_connections",
                                "Metrics connections open now (a scrape counts itself).",
                                value=float(stats["open_connections"]))
        yield GaugeMetricFamily(PREFIX + "metrics_max_connections",
                                "Metrics connections held at most at once.",
                                value=float(stats["max_connections"]))


class MetricsServer:
    """A running /metrics endpoint; `stop()` closes the socket and joins its thread."""

    def __init__(self, httpd, thread, url: str | None = None,
                 on_stop: Callable[[], None] | None = None) -> None:
        self._httpd = httpd
        self._thread = thread
        self._on_stop = on_stop
        sockaddr = httpd.server_address
        tcp = isinstance(sockaddr, tuple)
        self.host: str = sockaddr[0] if tcp else ""
        self.port: int = sockaddr[1] if tcp else 0
        self._url = url

    @property
    def url(self) -> str:
        if self._url is not None:
            return self._url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stats(self) -> dict[str, Any]:
        """Connections open and turned away, by reason (MetricsListener.stats)."""
        return self._httpd.stats()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        if self._on_stop is not None:
            self._on_stop()


UNIX_PREFIX = "unix:"


def socket_path_of(address: str) -> str | None:
    """The path of a "unix:PATH" address (ValueError unless absolute), None for HOST:PORT."""
    if not address.startswith(UNIX_PREFIX):
        return None
    path = address[len(UNIX_PREFIX):]
    if not path.startswith("/"):
        raise ValueError(f"metrics address {address!r}: expected unix:/ABSOLUTE/PATH, e.g. "
                         "unix:/run/numa-agent/metrics.sock")
    return path


def check_address_form(address: str) -> None:
    """ValueError unless `address` is HOST:PORT, [IPV6]:PORT or unix:/PATH."""
    if socket_path_of(address) is None:
        parse_address(address)


def check_metrics_address(address: str) -> None:
    """Fail now, before anything is written, if `address` cannot be listened
    on (bad form, port taken, another server on the socket path); OSError or
    ValueError naming it."""
    import socket

    from numa_agent.state.socket_file import SocketInUse, check_socket_path

    path = socket_path_of(address)
    if path is not None:
        try:
            check_socket_path(path, "agent.metrics_address")
        except SocketInUse as exc:
            raise OSError(f"metrics: cannot listen on {address}: {exc}") from None
        return
    host, port = parse_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        probe.bind((host, port))
    except OSError as exc:
        raise OSError(exc.errno, f"metrics: cannot listen on {address}: {exc.strerror or exc}") from exc
    finally:
        probe.close()


def start_metrics_server(address: str, registry: CollectorRegistry, *, socket_mode: int = 0o660,
                         socket_group: str | None = None, max_connections: int | None = None,
                         deadline: float = METRICS_REQUEST_DEADLINE_SECONDS) -> MetricsServer:
    """Serve `registry` on `address` in a thread: "HOST:PORT" (port 0 picks a free
    one), or "unix:PATH", a Unix socket placed with `socket_mode` and
    `socket_group` as the API's is, so only that group can read the workloads' names.
    Bounded as `MetricsListener` says; its refusals join `registry`."""
    path = socket_path_of(address)
    if path is not None:
        listener, on_stop, url = _listen_unix(path, socket_mode, socket_group)
    else:
        listener, on_stop, url = _listen_tcp(address), None, None
    httpd = MetricsListener(listener, registry, max_connections=max_connections, deadline=deadline)
    registry.register(_ListenerCollector(httpd))
    thread = threading.Thread(target=httpd.serve_forever, name="numa-agent-metrics", daemon=True)
    thread.start()
    server = MetricsServer(httpd, thread, url=url, on_stop=on_stop)
    log.info("serving metrics on %s (at most %d connections, %d per peer)", server.url,
             httpd.max_connections, httpd.max_per_peer)
    return server


def _listen_tcp(address: str) -> socket.socket:
    host, port = parse_address(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise OSError(exc.errno, f"metrics: cannot listen on {address}: {exc.strerror or exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"metrics: cannot listen on {address}: {exc.strerror or exc}") from exc
    return sock


def _listen_unix(path: str, mode: int, group: str | None) -> tuple[socket.socket, Callable[[], None], str]:
    from numa_agent.state.socket_file import SocketInUse, place_socket, remove_socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        inode = place_socket(path, mode, group, sock.bind, option="agent.metrics_address")
        sock.listen(128)
    except (OSError, ValueError, SocketInUse) as exc:
        sock.close()
        raise OSError(f"metrics: cannot listen on {UNIX_PREFIX}{path}: {exc}") from None
    return sock, lambda: remove_socket(path, inode), f"{UNIX_PREFIX}{path}"
