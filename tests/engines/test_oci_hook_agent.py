"""The hook against the real agent on a simulated machine whose hierarchy holds an engine's
container cgroup beside the agent's root: the whole path from the OCI state on stdin to the
container's cpuset, the refusal naming the parent, a retried hook and poststop."""

from __future__ import annotations

import json

import pytest

from numa_agent.cli import common
from numa_agent.core.cpuset import CpuSet
from numa_agent.engines import oci_hook
from tests.service.test_engine_cgroup import Machine

CID = "c0ffee" + "0" * 58
CONTAINER = f"/libpod_parent/libpod-{CID}"


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


@pytest.fixture(autouse=True)
def no_retry(monkeypatch):
    monkeypatch.setenv("NUMA_AGENT_RETRY_SECONDS", "0")


def hook(m: Machine, stage: str, pid: int | None, annotations: dict[str, str], tmp_path):
    """The hook with a /proc where `pid` is in the container's cgroup (the engine's view)."""
    proc = tmp_path / "proc"
    if pid is not None:
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{m.top.cgroup_of(pid)}\n")
    raw = json.dumps({"ociVersion": "1.0", "id": CID, "pid": pid, "status": "created",
                      "annotations": annotations}).encode()
    return oci_hook.run(stage, raw, m.cfg.socket, proc_root=str(proc), refusal_lines=common.refusal_lines)


def test_create_enforces_on_the_container_cgroup_a_retry_replays_and_poststop_releases(machine, tmp_path):
    pid = machine.container(CONTAINER).pid
    annotations = {"numa-agent.io/cpus": "2", "numa-agent.io/memory": "64Mi"}
    assert hook(machine, "createRuntime", pid, annotations, tmp_path) == (0, [])
    (listed,) = machine.service.list_workloads()
    assert listed["name"] == f"ctr-{CID[:12]}" and listed["engine_cgroup"] == CONTAINER
    cpus = CpuSet.parse(listed["cpus"])
    assert len(cpus) == 2 and machine.top.read_effective(CONTAINER.strip("/"))[0] == cpus
    assert machine.top.read_memory_max(CONTAINER.strip("/")) == 64 << 20
    assert machine.top.cgroup_of(pid) == CONTAINER  # the engine keeps its process
    # The engine retries the hook (a lost answer): the same booking, not a second one.
    assert hook(machine, "createRuntime", pid, annotations, tmp_path) == (0, [])
    assert [w["name"] for w in machine.service.list_workloads()] == [listed["name"]]
    assert hook(machine, "poststop", None, annotations, tmp_path) == (0, [])
    assert machine.service.list_workloads() == []
    assert hook(machine, "poststop", None, annotations, tmp_path) == (0, [])  # gone already: fine


def test_a_parent_kept_on_the_housekeeping_cpus_is_named_in_the_refusal(machine, tmp_path):
    reserved = CpuSet.parse(machine.service.status()["reserved_cpus"] or "0")
    pid = machine.container(CONTAINER, parent_cpus=reserved.format()).pid
    status, lines = hook(machine, "createRuntime", pid, {"numa-agent.io/cpus": "1"}, tmp_path)
    assert status == 1
    assert lines[0].startswith(f"numa-agent: container {CID[:12]} refused: ") and "/libpod_parent" in lines[0]
    assert machine.service.list_workloads() == []


def test_a_single_numa_node_refusal_says_topology_affinity_error(machine, tmp_path):
    pid = machine.container(CONTAINER).pid
    status, lines = hook(machine, "createRuntime", pid,
                         {"numa-agent.io/cpus": "12", "numa-agent.io/policy": "single-numa-node"}, tmp_path)
    assert status == 1 and "TopologyAffinityError" in lines[0]
    assert any(line.startswith("  merged hint:") for line in lines)
