"""A real AgentService on a simulated cgroup tree, and its registry's scrape: what the
metrics tests and the monitoring cross-check read."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.views.metrics import build_registry
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology


def metrics_service(tmp_path, **policy):
    """Two NUMA nodes of 4 cores x 2 threads and 8 GiB each, single-numa-node unless `policy` says."""
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig(**{"topology_policy": "single-numa-node", **policy}))
    service, _ = start(machine, tmp_path / "state", make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1]))
    return service


def scrape_text(service) -> str:
    return generate_latest(build_registry(service.metrics_snapshot)).decode()


def scrape(service) -> dict:
    """(sample name, sorted label pairs) -> value."""
    values = {}
    for family in text_string_to_metric_families(scrape_text(service)):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values
