import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numa_agent.views.metrics import (
    DEFAULT_METRICS_ADDRESS,
    AgentCollector,
    build_registry,
    parse_address,
    start_metrics_server,
)

GiB = 1 << 30

SNAPSHOT = {
    "status": {
        "enforcement": "cgroup",
        "policy": {"topology": "best-effort", "scope": "container", "cpu": "static", "memory": "static"},
        "shared_pool": "0-1,4",
        "nodes": [
            {
                "id": 1,
                "cpus": {"capacity": 8, "reserved": 0, "allocated": 6, "free": 2},
                "memory_bytes": {"capacity": 32 * GiB, "reserved": 0, "allocated": 4 * GiB, "free": 28 * GiB},
                "hugepages": {"1048576kB": {"capacity": 4, "reserved": 0, "allocated": 2, "free": 2},
                              "2048kB": {"capacity": 512, "reserved": 0, "allocated": 0, "free": 512}},
                "devices": {"gpu": {"capacity": 2, "allocated": 1, "free": 1},
                            "nic": {"capacity": 1, "allocated": 0, "free": 1}},
            },
            {
                "id": 0,
                "cpus": {"capacity": 8, "reserved": 1, "allocated": 2, "free": 5},
                "memory_bytes": {"capacity": 32 * GiB, "reserved": GiB, "allocated": 512 << 20,
                                 "free": 32 * GiB - GiB - (512 << 20)},
                "hugepages": {"2048kB": {"capacity": 512, "reserved": 0, "allocated": 128, "free": 384}},
                "devices": {"gpu": {"capacity": 1, "allocated": 0, "free": 1}},
            },
        ],
        "workloads": [
            {"name": "web-1", "lost": []},
            {"name": "db", "lost": ["cpu 9"]},
            {"name": "batch", "lost": []},
        ],
        "pods": [{"name": "p1"}],
    },
    "counters": {
        "admission_requests_total": {"admitted": 3, "refused": 1, "dry_run": 2},
        "admission_errors_total": {"topology_affinity_error": 1, "insufficient_cpus": 0},
        "admission_duration_seconds": {"buckets": [[0.001, 3], [0.0005, 2], [0.01, 4]], "sum": 0.0125, "count": 6},
        "checkpoint_writes_total": 5,
        "checkpoint_failures_total": 1,
        "hotplug_events_total": {"cpu": 1, "pci": 2},
        "aligned_allocations_total": {"numa_node": 3, "physical_core": 3, "l3": 2},
        "releases_total": 2,
    },
}


@pytest.fixture
def serve():
    servers = []

    def start(snapshot_fn, address="127.0.0.1:0"):
        server = start_metrics_server(address, build_registry(snapshot_fn, version="9.9.9"))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def samples_by_family(text):
    return {f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
            for f in text_string_to_metric_families(text)}


def test_every_family_matches_the_snapshot_over_http(serve):
    calls = []

    def snapshot_fn():
        calls.append(1)
        return SNAPSHOT

    server = serve(snapshot_fn)
    families = samples_by_family(scrape(server.url))
    assert len(calls) == 1  # one consistent snapshot per scrape

    def fam(name, kind):
        assert families[name][0] == kind, name
        return families[name][1]

    req = fam("numa_agent_admission_requests", "counter")
    assert req == {("numa_agent_admission_requests_total", (("result", r),)): v
                   for r, v in [("admitted", 3), ("refused", 1), ("dry_run", 2)]}
    err = fam("numa_agent_admission_errors", "counter")
    assert err == {("numa_agent_admission_errors_total", (("reason", "insufficient_cpus"),)): 0,
                   ("numa_agent_admission_errors_total", (("reason", "topology_affinity_error"),)): 1}

    hist = fam("numa_agent_admission_duration_seconds", "histogram")
    bucket = {dict(labels)["le"]: v for (name, labels), v in hist.items() if name.endswith("_bucket")}
    assert bucket == {"0.0005": 2, "0.001": 3, "0.01": 4, "+Inf": 6}
    assert hist[("numa_agent_admission_duration_seconds_count", ())] == 6
    assert hist[("numa_agent_admission_duration_seconds_sum", ())] == 0.0125

    cpus = fam("numa_agent_cpus", "gauge")
    memory = fam("numa_agent_memory_bytes", "gauge")
    pages = fam("numa_agent_hugepages", "gauge")
    devices = fam("numa_agent_devices", "gauge")
    expected_cpus, expected_mem, expected_pages, expected_dev = {}, {}, {}, {}
    for node in SNAPSHOT["status"]["nodes"]:
        n = str(node["id"])
        for state in ("reserved", "allocated", "free"):
            expected_cpus[("numa_agent_cpus", (("numa_node", n), ("state", state)))] = node["cpus"][state]
            expected_mem[("numa_agent_memory_bytes", (("numa_node", n), ("state", state)))] = node["memory_bytes"][state]
            for size, counts in node["hugepages"].items():
                expected_pages[("numa_agent_hugepages", (("numa_node", n), ("size", size), ("state", state)))] = counts[state]
        for resource, counts in node["devices"].items():
            for state in ("allocated", "free"):
                expected_dev[("numa_agent_devices", (("numa_node", n), ("resource", resource), ("state", state)))] = counts[state]
    assert cpus == expected_cpus
    assert memory == expected_mem
    assert pages == expected_pages
    assert devices == expected_dev

    # Capacity is a family of its own, and the states sum to it: sum by (...) (x) == x_capacity.
    for family, capacity_family, labels in [
            ("numa_agent_cpus", "numa_agent_cpus_capacity", ("numa_node",)),
            ("numa_agent_memory_bytes", "numa_agent_memory_capacity_bytes", ("numa_node",)),
            ("numa_agent_hugepages", "numa_agent_hugepages_capacity", ("numa_node", "size")),
            ("numa_agent_devices", "numa_agent_devices_capacity", ("numa_node", "resource"))]:
        capacity = fam(capacity_family, "gauge")
        summed = {}
        for (_, labelset), value in families[family][1].items():
            key = tuple((k, v) for k, v in labelset if k in labels)
            summed[key] = summed.get(key, 0) + value
        assert {labelset: value for (_, labelset), value in capacity.items()} == summed
        assert len(capacity) == {"numa_agent_cpus_capacity": 2, "numa_agent_memory_capacity_bytes": 2,
                                 "numa_agent_hugepages_capacity": 3, "numa_agent_devices_capacity": 3}[capacity_family]

    assert fam("numa_agent_workloads", "gauge") == {("numa_agent_workloads", ()): 3}
    assert fam("numa_agent_pods", "gauge") == {("numa_agent_pods", ()): 1}
    assert fam("numa_agent_workloads_lost_resources", "gauge") == {("numa_agent_workloads_lost_resources", ()): 1}
    assert fam("numa_agent_aligned_allocations", "counter") == {
        ("numa_agent_aligned_allocations_total", (("level", "l3"),)): 2,
        ("numa_agent_aligned_allocations_total", (("level", "numa_node"),)): 3,
        ("numa_agent_aligned_allocations_total", (("level", "physical_core"),)): 3,
    }
    assert fam("numa_agent_checkpoint_writes", "counter") == {("numa_agent_checkpoint_writes_total", ()): 5}
    assert fam("numa_agent_checkpoint_failures", "counter") == {("numa_agent_checkpoint_failures_total", ()): 1}
    assert fam("numa_agent_releases", "counter") == {("numa_agent_releases_total", ()): 2}
    assert fam("numa_agent_hotplug_events", "counter") == {
        ("numa_agent_hotplug_events_total", (("kind", k),)): v
        for k, v in [("cpu", 1), ("memory", 0), ("node", 0), ("pci", 2)]
    }
    assert fam("numa_agent_info", "gauge") == {
        ("numa_agent_info", (("enforcement", "cgroup"), ("version", "9.9.9"))): 1
    }
    # own registry: the agent's families and the process, platform and GC collectors, nothing else
    assert all(name.startswith(("numa_agent_", "process_", "python_")) for name in families)
    assert fam("process_cpu_seconds", "counter")[("process_cpu_seconds_total", ())] > 0
    assert fam("process_start_time_seconds", "gauge")[("process_start_time_seconds", ())] > 0
    assert fam("process_open_fds", "gauge")[("process_open_fds", ())] > 0
    assert families["python_info"][0] == "gauge"
    assert families["python_gc_objects_collected"][0] == "counter"


def test_each_scrape_takes_a_fresh_snapshot(serve):
    state = {"n": 0}

    def snapshot_fn():
        state["n"] += 1
        snap = {"status": {"enforcement": "affinity", "workloads": [{"lost": []}] * state["n"]}, "counters": {}}
        return snap

    server = serve(snapshot_fn)
    first = samples_by_family(scrape(server.url))["numa_agent_workloads"][1]
    second = samples_by_family(scrape(server.url))["numa_agent_workloads"][1]
    assert first == {("numa_agent_workloads", ()): 1}
    assert second == {("numa_agent_workloads", ()): 2}


def test_empty_snapshot_exports_zeroes():
    families = {f.name: f for f in AgentCollector(lambda: {"status": {}, "counters": {}}, version="x").collect()}
    hist = families["numa_agent_admission_duration_seconds"]
    assert [(s.name, s.labels.get("le"), s.value) for s in hist.samples if s.name.endswith("_bucket")] == [
        ("numa_agent_admission_duration_seconds_bucket", "+Inf", 0.0)
    ]
    assert families["numa_agent_cpus"].samples == []
    assert [s.value for s in families["numa_agent_admission_requests"].samples] == [0.0, 0.0, 0.0]


def test_ipv6_loopback(serve):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python build")
    try:
        server = serve(lambda: SNAPSHOT, "[::1]:0")
    except OSError as exc:
        pytest.skip(f"IPv6 loopback not available here: {exc}")
    assert server.host == "::1"
    assert server.url.startswith("http://[::1]:")
    assert "numa_agent_cpus" in samples_by_family(scrape(server.url))


def test_stop_closes_the_port(serve):
    server = serve(lambda: SNAPSHOT)
    url = server.url
    server.stop()
    with pytest.raises(urllib.error.URLError):
        scrape(url)


def test_snapshot_failure_is_logged_and_scrape_fails(serve, caplog):
    def broken():
        raise RuntimeError("state lock poisoned")

    server = serve(broken)
    with caplog.at_level("ERROR", logger="numa_agent.metrics"):
        with pytest.raises(urllib.error.HTTPError) as info:
            scrape(server.url)
    assert info.value.code == 500
    assert "metrics scrape failed: the service snapshot raised" in caplog.text


def test_port_in_use_says_which_address():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"metrics: cannot listen on 127.0.0.1:{port}: Address already in use"):
            start_metrics_server(f"127.0.0.1:{port}", build_registry(lambda: SNAPSHOT, version="x"))


def test_parse_address_forms():
    assert DEFAULT_METRICS_ADDRESS == "127.0.0.1:9464"
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:9464") == ("::1", 9464)
    assert parse_address("localhost:0") == ("localhost", 0)
    assert parse_address(" 0.0.0.0:80 ") == ("0.0.0.0", 80)


@pytest.mark.parametrize(
    "address, message",
    [
        ("", "must be HOST:PORT"),
        ("127.0.0.1", "has no port"),
        (":9464", "has no host"),
        ("::1:9464", "put an IPv6 address in brackets"),
        ("[::1]9464", r"expected \[IPV6\]:PORT"),
        ("[::1", r"expected \[IPV6\]:PORT"),
        ("127.0.0.1:http", "port must be a number from 0 to 65535"),
        ("127.0.0.1:70000", "port must be a number from 0 to 65535"),
        ("127.0.0.1:-1", "port must be a number from 0 to 65535"),
    ],
)
def test_bad_addresses(address, message):
    with pytest.raises(ValueError, match=message):
        parse_address(address)


def test_info_from_the_snapshot_wins():
    snap = {"status": {"enforcement": "cgroup"}, "counters": {},
            "info": {"version": "0.1.0", "enforcement": "affinity"}}
    families = {f.name: f for f in AgentCollector(lambda: snap, version="ignored").collect()}
    (sample,) = families["numa_agent_info"].samples
    assert sample.labels == {"version": "0.1.0", "enforcement": "affinity"}
    assert sample.value == 1


HOSTILE = "ev\x1b]0;owned\x07il\\ \"q\"\r\n# TYPE forged gauge\u202e\x85"


def _hostile_snapshot() -> dict:
    owner_part = {"used": 1, "limit": 4, "entry": "user"}
    return {"status": {
        "enforcement": "affinity", "nodes": [],
        "workloads": [{"name": HOSTILE, "exclusive": True, "intruders": [{"command": HOSTILE}],
                       "memory_numa": {"bytes": {"0": 4096}, "outside_bytes": 0, "outside_ratio": 0.0}}],
        "quotas": [{"owner": HOSTILE, "owner_uid": 1000, "cpus": owner_part,
                    "memory_bytes": {"used": 0, "limit": None, "entry": None}, "devices": {}}],
    }, "counters": {"admission_errors_total": {HOSTILE: 1}}, "info": {"version": HOSTILE}}


def test_hostile_label_values_keep_the_exposition_parseable():
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

    from numa_agent.core.printable import printable

    registry = build_registry(lambda: _hostile_snapshot(), version="1.0")
    text = generate_latest(registry)
    # no control byte but the line ends: nothing a terminal acts on, no forged line
    assert not any(b < 0x20 and b != 0x0A or b == 0x7F for b in text)
    shown = printable(HOSTILE)
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert "forged" not in families
    assert [s.labels["owner"] for s in families["numa_agent_quota_used"].samples] == [shown]
    assert [s.labels["workload"] for s in families["numa_agent_exclusive_cpu_intruders"].samples] == [shown]
    assert {s.labels["reason"] for s in families["numa_agent_admission_errors"].samples} == {shown}
    assert families["numa_agent_info"].samples[0].labels["version"] == shown
    # the stricter OpenMetrics parser reads the OpenMetrics exposition too
    strict = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert [s.labels["owner"] for s in strict["numa_agent_quota_used"].samples] == [shown]
