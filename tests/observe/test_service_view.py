"""Observation through the real service (simulated cgroup tree, written /proc):
status lists intruders and memory per node, the metrics export them."""

from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.cli.status_cmd import format_status
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.observe.observer import Observer
from numa_agent.observe.procfs import ProcReader
from numa_agent.observe.watcher import IntruderWatcher, guarded_of
from numa_agent.service.requests import AdmitRequest
from numa_agent.views.metrics import build_registry
from tests.observe.proc_tree import add_task
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _closing():
    """Each service's enforcer holds an inotify instance: a per-user resource, shared."""
    services = []
    yield services
    for service in services:
        service.enforcer.close()


@pytest.fixture
def make(_closing, tmp_path):
    def build(observer_of=None):
        service, root, out = _service(tmp_path, observer_of)
        _closing.append(service)
        return service, root, out
    return build


def _service(tmp_path, observer_of=None):
    """`observer_of(enforcer, state, root)`: the observer given to the service."""
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig())
    root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    service, _ = start(machine, tmp_path / "state", root, observer_of=None if observer_of is None else
                       lambda enforcer, state: observer_of(enforcer, state, root))
    out = service.admit(AdmitRequest(name="web", cpus=2), Caller(pid=os.getpid(), uid=1000, gid=1000))
    return service, root, out


def _scrape(service) -> dict:
    values = {}
    for family in text_string_to_metric_families(generate_latest(build_registry(service.metrics_snapshot)).decode()):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def test_status_and_metrics_show_intruders_and_memory_per_node(tmp_path, make):
    proc = tmp_path / "proc"
    source = ProcReader(str(proc))
    watchers = []

    def observer_of(enforcer, state, root):
        watchers.append(IntruderWatcher(lambda: guarded_of(state(), enforcer.path_of, str(root)), source, 2.0))
        return Observer(source, enforcer.path_of, watchers[0])

    service, root, out = make(observer_of)
    (watcher,) = watchers
    (node,) = out["numa_nodes"]
    other = 1 - node
    cpu = CpuSet.parse(out["cpus"]).ids()[0]
    add_task(proc, 500, 500, "spinner", cpu, "0-7", cgroup="/user.slice")
    add_task(proc, 600, 600, "web", cpu, out["cpus"], cgroup="/wl-web")
    add_task(proc, 700, 700, "kworker/u16:2", cpu, "0-7", kernel=True)
    (root / "wl-web" / "memory.numa_stat").write_text(
        f"anon N{node}={64 * MIB} N{other}={16 * MIB}\nfile N{node}=0 N{other}=0\n")
    watcher.scan_once()

    status = service.status()
    (web,) = status["workloads"]
    assert web["intruders"] == [{"pid": 500, "tid": 500, "command": "spinner", "cpu": cpu}]
    assert web["kernel_threads"] == [{"pid": 700, "tid": 700, "command": "kworker/u16:2", "cpu": cpu}]
    assert web["memory_numa"]["bytes"] == {str(min(node, other)): (64 if node < other else 16) * MIB,
                                           str(max(node, other)): (16 if node < other else 64) * MIB}
    assert web["memory_numa"]["outside_bytes"] == 16 * MIB and web["memory_numa"]["outside_ratio"] == 0.2
    assert status["observe"]["intruders_seen_total"] == 1
    assert status["observe"]["last_scan"]["tasks"] == 3

    service.observer.sample_memory(service.state)  # the metrics report the last sample
    values = _scrape(service)
    assert values[("numa_agent_exclusive_cpu_intruders", (("workload", "web"),))] == 1
    assert values[("numa_agent_exclusive_cpu_kernel_threads", (("workload", "web"),))] == 1
    assert values[("numa_agent_exclusive_cpu_intruders_seen_total", ())] == 1
    assert values[("numa_agent_workload_memory_bytes", (("numa_node", str(node)), ("workload", "web")))] == 64 * MIB
    assert values[("numa_agent_workload_memory_outside_bytes", (("workload", "web"),))] == 16 * MIB
    assert values[("numa_agent_workload_memory_outside_ratio", (("workload", "web"),))] == 0.2

    text = "\n".join(format_status(status, now=0, intruders=True))
    assert f"INTRUDER on web's CPU {cpu}: pid 500 tid 500 (spinner)" in text
    assert f"kernel threads on web's CPUs: kworker/u16:2 (pid 700, CPU {cpu})" in text
    assert f"memory web: node {min(node, other)} " in text and "outside booked nodes 16 MiB (20.0%)" in text


def test_a_workload_is_guarded_with_its_owner_whose_mark_alone_counts(tmp_path, make):
    service, root, out = make()
    (web,) = guarded_of(service.state, service.enforcer.path_of, str(root))
    assert (web.name, web.cpus, web.owner_uid) == ("web", CpuSet.parse(out["cpus"]), 1000)


def test_without_observation_data_status_says_not_available(tmp_path, make):
    source = ProcReader(str(tmp_path / "no-proc"))
    service, _, _ = make(lambda enforcer, state, root: Observer(source, enforcer.path_of, None))
    status = service.status()
    (web,) = status["workloads"]
    assert web["intruders"] == [] == web["kernel_threads"] and web["memory_numa"] is None  # the simulated tree has no numa_stat
    assert status["observe"] == {"intruder_scan_seconds": 0, "intruders_seen_total": 0, "last_scan": None}
    assert ("numa_agent_exclusive_cpu_intruders", (("workload", "web"),)) in _scrape(service)


def test_without_a_cgroup_numa_maps_is_read_only_on_request(tmp_path, make):
    proc = tmp_path / "proc"
    # no cgroup: affinity mode
    service, _, out = make(lambda enforcer, state, root: Observer(ProcReader(str(proc)), lambda rel: None, None))
    (node,) = out["numa_nodes"]
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "numa_maps").write_text(
        f"7f0000000000 default anon=16384 dirty=16384 N{node}=16384 kernelpagesize_kB=4\n")
    assert service.status()["workloads"][0]["memory_numa"] is None
    numa = service.status(memory=True)["workloads"][0]["memory_numa"]
    assert numa["source"] == "numa_maps" and numa["bytes"] == {str(node): 64 * MIB}
    assert numa["outside_bytes"] == 0


def test_a_scrape_reads_the_observations_outside_the_admission_lock(make):
    import threading

    free = []

    class Probe:
        def annotate_scrape(self, state, status):
            def other():  # an admission arriving meanwhile would take the lock
                got = service._lock.acquire(timeout=0)
                free.append(got)
                if got:
                    service._lock.release()
            t = threading.Thread(target=other)
            t.start()
            t.join()

    service, _, _ = make(lambda enforcer, state, root: Probe())  # the lock read when it is called
    service.metrics_snapshot()
    assert free == [True]
