"""End to end on machines this box is not: the real agent serving a written
sysfs tree of a 4-node, 2-socket machine (simulated cgroup tree, nothing is
pinned for real) and the real numa-run: concurrency, devices, pods,
topology refusals, status and metrics."""

import concurrent.futures
import json
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import DEVICES_CONFIG, AgentProcess, NumaRuns, machine_with_devices, numa_run

CONFIG = """
[topology_manager]
policy = "best-effort"
""" + DEVICES_CONFIG


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    work = tmp_path_factory.mktemp("synthetic-agent")
    root = machine_with_devices(work / "machine")
    a = AgentProcess(work, "--sysfs-root", str(root), config=CONFIG).start()
    yield a
    a.stop()


def status(agent):
    code, body = agent.call("GET", "/v1/status")
    assert code == 200
    return body


def release_all(agent):
    for w in status(agent)["workloads"]:
        agent.call("DELETE", f"/v1/workloads/{w['name']}")


@pytest.fixture
def launch(agent):
    runs = NumaRuns(agent)
    yield runs
    runs.stop()
    release_all(agent)


def test_concurrent_numa_runs_never_share_a_cpu(agent, launch):
    release_all(agent)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        procs = list(pool.map(lambda i: launch("--cpus", "2", "--name", f"c{i}"), range(8)))
    assert [p.poll() for p in procs] == [None] * 8  # all admitted and running
    seen = CpuSet()
    listed = status(agent)["workloads"]
    assert len(listed) == 8
    for w in listed:
        cpus = CpuSet.parse(w["cpus"])
        assert len(cpus) == 2 and cpus.isdisjoint(seen)
        assert w["aligned"]["physical_core"] and w["aligned"]["numa_node"]
        seen = seen | cpus
    assert len(seen) == 16


def test_gpu_request_lands_on_the_gpus_node_with_its_environment(agent, launch):
    release_all(agent)
    code = "import os;print(os.environ['NUMA_AGENT_DEVICES']);print(os.environ['NUMA_AGENT_MEMS']);" \
           "print(os.environ.get('CUDA_VISIBLE_DEVICES'))"
    r = numa_run(agent.socket, "--cpus", "4", "--memory", "2Gi", "--device", "gpu=1",
                 "--policy", "single-numa-node", "--name", "infer", "-v", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    devices, mems, cuda = r.stdout.split("\n")[:3]
    assert devices == "0000:01:00.0" and mems == "1" and cuda
    assert "numa-run: infer cpus" in r.stderr  # -v prints the binding
    release_all(agent)
    launch("--cpus", "4", "--memory", "2Gi", "--device", "gpu=1", "--policy", "single-numa-node",
           "--name", "infer2")
    w = status(agent)["workloads"][0]
    assert w["numa_nodes"] == [1] and w["devices"][0]["numa_node"] == 1
    assert w["memory_bytes"] == {"1": 2 << 30}


def test_single_numa_node_refusal_names_topology_affinity_error(agent, launch):
    release_all(agent)
    r = numa_run(agent.socket, "--cpus", "10", "--policy", "single-numa-node", "--", "true")
    assert r.returncode == 125
    assert "TopologyAffinityError" in r.stderr and "at most 8 on one NUMA node" in r.stderr
    assert status(agent)["workloads"] == []
    launch("--cpus", "10", "--policy", "best-effort", "--name", "wide")
    assert len(status(agent)["workloads"][0]["numa_nodes"]) == 2


def test_pod_main_exclusive_and_sidecar_shared(agent, launch):
    release_all(agent)
    launch("--pod", "trade", "--pod-cpus", "6", "--cpus", "4", "--name", "engine")
    launch("--pod", "trade", "--name", "logger")
    s = status(agent)
    pod = s["pods"][0]
    by_name = {w["name"]: w for w in s["workloads"]}
    pod_cpus = CpuSet.parse(pod["cpus"])
    engine, logger = CpuSet.parse(by_name["engine"]["cpus"]), CpuSet.parse(by_name["logger"]["cpus"])
    assert len(pod_cpus) == 6 and len(pod["numa_nodes"]) == 1
    assert engine | logger == pod_cpus and engine.isdisjoint(logger) and len(engine) == 4
    r = numa_run(agent.socket, "--pod", "trade", "--cpus", "2", "--", "true")
    assert r.returncode == 125 and "leave nothing" in r.stderr
    r = numa_run(agent.socket, "--pod", "trade", "--pod-cpus", "8", "--pod-memory", "1Gi", "--", "true")
    assert r.returncode == 125 and r.stderr == (
        "numa-run: error: pod 'trade' already exists with a budget of 6 CPUs, not 8 CPUs, 1 GiB of "
        "memory: a later member cannot change it (leave out the --pod-* options)\n")
    release_all(agent)
    assert status(agent)["pods"] == []


def test_metrics_per_numa_match_status(agent, launch):
    release_all(agent)
    launch("--cpus", "4", "--device", "nic=1")
    s = status(agent)
    text = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    for node in s["nodes"]:
        for state, value in node["cpus"].items():
            if state == "capacity":  # a family of its own, which the states sum to
                key = ("numa_agent_cpus_capacity", (("numa_node", str(node["id"])),))
            else:
                key = ("numa_agent_cpus", (("numa_node", str(node["id"])), ("state", state)))
            assert samples[key] == value
    assert samples[("numa_agent_workloads", ())] == 1
    key = ("numa_agent_devices", (("numa_node", "2"), ("resource", "nic"), ("state", "allocated")))
    assert samples[key] == 1


def test_status_command_json_and_table(agent, launch):
    release_all(agent)
    launch("--cpus", "2", "--name", "tbl")
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--socket", agent.socket,
                          "--json"], capture_output=True, text=True)
    assert out.returncode == 0 and "tbl" in [w["name"] for w in json.loads(out.stdout)["workloads"]]
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--socket", agent.socket],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "tbl" in out.stdout and "ALLOCATED" in out.stdout
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "release", "tbl", "--socket",
                          agent.socket], capture_output=True, text=True)
    assert out.returncode == 0
    assert "tbl" not in [w["name"] for w in status(agent)["workloads"]]
