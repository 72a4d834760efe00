"""The agent on the POWER9 snapshot, whose GPUs' memory shows as CPU-less NUMA nodes
250-255: plain bookings, `-i all` and `-w all` stay on nodes 0 and 8; a request
over their memory is refused saying how to name the GPU nodes; /v1/allocatable
gives each node's kind and distances."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES
from tests.support.agent_process import AgentProcess, numa_run

ARCHIVE = FIXTURES / "sysfs" / "power9-2s-smt4-gpu-numa-nodes.tar.gz"
GPU_NODES = [250, 251, 252, 253, 254, 255]


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    agent = AgentProcess(tmp_path_factory.mktemp("power9") / "agent", "--sysfs-root", str(ARCHIVE)).start()
    yield agent
    assert agent.stop() == 0


def test_a_request_over_ordinary_memory_is_refused_naming_the_gpu_nodes(agent):
    run = numa_run(agent.socket, "--cpus", "2", "--memory", "300Gi", "--", "true")
    assert run.returncode == 125, run.stderr
    assert "TopologyAffinityError" in run.stderr and "Traceback" not in run.stderr
    assert "add -m 0,8,250,251,252,253 to use memory-only node(s) 250,251,252,253" in run.stderr


@pytest.mark.parametrize("option", ["-i", "-w"])
def test_all_interleaves_over_the_cpu_nodes_only(agent, option):
    run = numa_run(agent.socket, "--dry-run", "--json", option, "all", "--cpus", "2", "--", "true")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["mems"] == [0, 8]


def test_naming_a_gpu_node_books_it(agent):
    run = numa_run(agent.socket, "--dry-run", "--json", "-m", "0,250", "--cpus", "2", "--memory", "130Gi",
                   "--", "true")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["mems"] == [0, 250]


def test_allocatable_gives_each_nodes_kind_and_distances(agent):
    code, doc = agent.call("GET", "/v1/allocatable")
    assert code == 200
    nodes = {n["id"]: n for n in doc["nodes"]}
    assert [nodes[n]["kind"] for n in [0, 8, *GPU_NODES]] == ["cpu", "cpu"] + ["memory-only"] * 6
    assert nodes[250]["distances"] == {"0": 80, "8": 80, "250": 10, "251": 80, "252": 80, "253": 80,
                                       "254": 80, "255": 80}
