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


def hook(m: Machine, stage: str, pid: int | None, annotations: dict[str, str], tmp_path, cid: str = CID):
    """The hook with a /proc where `pid` is in the container's cgroup (the engine's view)."""
    proc = tmp_path / "proc"
    if pid is not None:
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{m.top.cgroup_of(pid)}\n")
    raw = json.dumps({"ociVersion": "1.0", "id": cid, "pid": pid, "status": "created",
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


def test_poststop_of_a_container_sharing_the_first_12_digits_leaves_the_other_booked(machine, tmp_path):
    """Both would be named ctr-<12 digits>; the whole id says whose booking it is."""
    twin = CID[:12] + "f" * 52
    annotations = {"numa-agent.io/cpus": "1"}
    pid = machine.container(CONTAINER).pid
    assert hook(machine, "createRuntime", pid, annotations, tmp_path) == (0, [])
    twin_pid = machine.container(f"/libpod_parent/libpod-{twin}").pid
    status, lines = hook(machine, "createRuntime", twin_pid, annotations, tmp_path, cid=twin)
    assert status == 1 and f"ctr-{CID[:12]}" in lines[0]  # the name is taken: the twin fails closed
    assert hook(machine, "poststop", None, annotations, tmp_path, cid=twin) == (0, [])  # not its booking
    (listed,) = machine.service.list_workloads()
    assert listed["engine_cgroup"] == CONTAINER
    assert hook(machine, "poststop", None, annotations, tmp_path) == (0, [])
    assert machine.service.list_workloads() == []


@pytest.mark.parametrize("request_id", [CID, None], ids=["as-the-previous-hook-asked", "recorded-without-id"])
def test_poststop_after_an_upgrade_releases_what_the_previous_version_admitted(machine, tmp_path, request_id):
    """The previous hook admitted ctr-<12 digits> with the container id as request id and
    released by name; the name is unchanged, so the checkpoint's booking is found, and one
    recorded without a request id is released by its name alone."""
    from numa_agent.service.requests import AdmitRequest
    from tests.service.test_engine_cgroup import root_caller

    pid = machine.container(CONTAINER).pid
    machine.service.admit(AdmitRequest(name=f"ctr-{CID[:12]}", cpus=1, cgroup=CONTAINER, request_id=request_id),
                          root_caller(pid))
    machine.restart()  # the upgraded agent, from the previous one's checkpoint
    assert [w["name"] for w in machine.service.list_workloads()] == [f"ctr-{CID[:12]}"]
    assert hook(machine, "poststop", None, {"numa-agent.io/cpus": "1"}, tmp_path) == (0, [])
    assert machine.service.list_workloads() == []


SANDBOX_A, SANDBOX_B = "a" * 64, "b" * 64


def test_a_container_joins_only_a_pod_of_its_own_sandbox(machine, tmp_path):
    """The hook asks with root's authority, which passes the pod's owner check: the pod it
    joins comes from the engine's sandbox id, not from the annotation alone. A container of
    sandbox A naming sandbox B's pod is not joined to it (and books nothing of its budget)."""
    from numa_agent.service.requests import AdmitRequest, PodBudget
    from tests.service.test_engine_cgroup import root_caller
    b_pod = f"sbx-{SANDBOX_B[:12]}-db"  # the pod of sandbox B, its budget made by root
    machine.service.admit(AdmitRequest(name="b-first", cpus=1, pod=b_pod, pod_budget=PodBudget(cpus=2)),
                          root_caller())
    tenant = "d0d0" + "0" * 60
    pid = machine.container(f"/libpod_parent/libpod-{tenant}").pid
    for names in ("db", b_pod):  # B's pod by the annotation's own name, or by the agent's
        status, lines = hook(machine, "createRuntime", pid, {"numa-agent.io/pod": names, "numa-agent.io/cpus": "1",
                                                             "io.kubernetes.cri-o.SandboxID": SANDBOX_A},
                             tmp_path, cid=tenant)
        assert status == 1 and f"sbx-{SANDBOX_A[:12]}-" in lines[0] and "does not exist" in lines[0]
    assert machine.service.state.pod(b_pod).members == ("b-first",)
    # A container of sandbox B is joined to it.
    cid = "e0e0" + "0" * 60
    pid = machine.container(f"/libpod_parent/libpod-{cid}").pid
    assert hook(machine, "createRuntime", pid, {"numa-agent.io/pod": "db", "numa-agent.io/cpus": "1",
                                                "io.kubernetes.cri-o.SandboxID": SANDBOX_B},
                tmp_path, cid=cid) == (0, [])
    assert machine.service.state.pod(b_pod).members == ("b-first", f"ctr-{cid[:12]}")


def test_a_pod_annotation_without_a_sandbox_fails_closed(machine, tmp_path):
    pid = machine.container().pid
    status, lines = hook(machine, "createRuntime", pid, {"numa-agent.io/pod": "db"}, tmp_path)
    assert status == 1 and "names no sandbox" in lines[0]
    assert machine.service.list_workloads() == []
