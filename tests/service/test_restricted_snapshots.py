"""Admission through the service on the snapshots whose agent runs in a
restricted cpuset (cpuset v1: cpus 0-6,12-15 and mems 1-4; cgroup2: cpus 0-5
and mems 0-5), and a 1-CPU dry run on every snapshot: it is admitted or
refused with an explanation, never an exception."""

from __future__ import annotations

import os

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.discovery.sysfs import read_topology
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.service.refusals import InvalidInput, NoCapacity, ServiceRefusal
from numa_agent.service.requests import AdmitRequest
from tests.conftest import FIXTURES
from tests.support.agent_process import AgentProcess, numa_run
from tests.support.simulated_service import cg_file, start

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
SNAPSHOTS = sorted(p.name[: -len(".tar.gz")] for p in (FIXTURES / "sysfs").glob("*.tar.gz"))
K8 = "amd-k8-8s-8numa-cpuset-v1"
MAGNYCOURS = "amd-magnycours-4s-8numa-cgroup2"
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def _service(snapshot, tmp_path, name, policy="best-effort"):
    root, _ = snapshot(name)
    machine = build_machine(read_topology(str(root)), PolicyConfig(topology_policy=policy))
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, machine.memory.memory_nodes.nodes())
    service, _ = start(machine, tmp_path / "state", cg_root)
    return machine, service, cg_root


@pytest.mark.parametrize("name", [K8, MAGNYCOURS])
def test_one_cpu_is_admitted_inside_the_cpuset(snapshot, tmp_path, name):
    machine, service, cg_root = _service(snapshot, tmp_path, name)
    topo = machine.topology
    out = service.admit(AdmitRequest(name="probe", cpus=1), ME, dry_run=True)
    assert CpuSet.parse(out["cpus"]).issubset(topo.allowed_cpus)
    out = service.admit(AdmitRequest(name="db", cpus=1, memory_bytes=64 << 20), ME)
    cpus = CpuSet.parse(out["cpus"])
    assert cpus.issubset(topo.allowed_cpus)
    assert set(out["mems"]) <= topo.allowed_mems
    # Local memory: the CPU's node is one whose memory the agent may use.
    assert set(machine.nodes_of(cpus)) <= set(out["mems"])
    assert set(CpuSet.parse(cg_file(cg_root, "wl-db", "cpuset.mems")).ids()) <= topo.allowed_mems


def test_cpuset_v1_snapshot_hands_out_only_cpus_whose_node_memory_is_allowed(snapshot, tmp_path):
    # cpus 0-6,12-15 (4 offline), mems 1-4: CPUs 0-1 (node 0) and 12-15 (nodes 6, 7)
    # would always run on memory of another node; node 4's CPUs 8-9 are not allowed.
    machine, service, _ = _service(snapshot, tmp_path, K8)
    assert machine.node_ids == (1, 2, 3, 4)
    assert machine.usable_cpus == CpuSet.parse("2-3,5-6")
    assert machine.reserved_cpus.issubset(machine.usable_cpus)
    free = len(machine.usable_cpus - machine.reserved_cpus)
    for i in range(free):
        service.admit(AdmitRequest(name=f"w{i}", cpus=1), ME)
    with pytest.raises(NoCapacity) as refused:
        service.admit(AdmitRequest(name="one-more", cpus=1), ME, dry_run=True)
    assert "CPU" in str(refused.value)


def test_cpuset_v1_snapshot_refuses_nodes_and_cpus_outside_the_cpuset(snapshot, tmp_path):
    _, service, _ = _service(snapshot, tmp_path, K8)
    with pytest.raises(InvalidInput, match=r"membind: .*node\(s\) 0 .*usable: 1,2,3,4"):
        service.admit(AdmitRequest(name="m", membind=[0]), ME, dry_run=True)
    with pytest.raises(InvalidInput, match=r"physcpubind: CPUs 0 are not usable"):
        service.admit(AdmitRequest(name="c", physcpubind="0"), ME, dry_run=True)
    with pytest.raises(InvalidInput, match=r"cpunodebind: .*node\(s\) 6 "):
        service.admit(AdmitRequest(name="n", cpunodebind=[6]), ME, dry_run=True)


def test_cgroup2_snapshot_uses_nodes_0_to_5_and_cpus_0_to_5(snapshot, tmp_path):
    machine, service, _ = _service(snapshot, tmp_path, MAGNYCOURS, policy="single-numa-node")
    assert machine.node_ids == (0, 1, 2, 3, 4, 5)
    assert machine.usable_cpus == CpuSet.parse("0-5")
    out = service.admit(AdmitRequest(name="two", cpus=2), ME)
    assert len(out["numa_nodes"]) == 1 and set(out["numa_nodes"]) <= {0, 1}
    # Node 0 holds CPUs 0-3 (one reserved), node 1 only 4-5 of its 4-7: four
    # more fit on no single node the agent may use.
    with pytest.raises(NoCapacity, match="TopologyAffinityError"):
        service.admit(AdmitRequest(name="four", cpus=4), ME, dry_run=True)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", SNAPSHOTS)
def test_a_one_cpu_dry_run_is_admitted_or_explained_at_every_fill_level(snapshot, tmp_path, name, policy):
    """Fill the machine one exclusive CPU at a time; before each admission a
    dry run of 1 CPU answers an admission or a refusal with a reason."""
    machine, service, _ = _service(snapshot, tmp_path, name, policy)
    allowed = machine.usable_cpus
    for i in range(len(allowed) + 1):
        try:
            out = service.admit(AdmitRequest(name="probe", cpus=1), ME, dry_run=True)
        except ServiceRefusal as exc:
            assert isinstance(exc, (NoCapacity, InvalidInput)) and str(exc), exc
            return
        assert CpuSet.parse(out["cpus"]).issubset(allowed - machine.reserved_cpus)
        assert set(out["numa_nodes"]) <= set(machine.node_ids)
        service.admit(AdmitRequest(name=f"w{i}", cpus=1), ME)
    pytest.fail("more CPUs admitted than the machine has")


def test_the_agent_says_what_its_cpuset_leaves_it_and_admits_inside_it(tmp_path):
    agent = AgentProcess(tmp_path / "agent", "--sysfs-root", str(FIXTURES / "sysfs" / f"{K8}.tar.gz")).start()
    try:
        run = numa_run(agent.socket, "--dry-run", "--cpus", "1", "-v", "--", "true")
        assert run.returncode == 0, run.stderr + agent.log()
        refused = numa_run(agent.socket, "--dry-run", "--cpus", "8", "--", "true")
        assert refused.returncode == 125 and "not enough CPUs" in refused.stderr, refused.stderr
    finally:
        assert agent.stop() == 0
    assert ("agent cpuset: cpus 0-6,12-15, mems 1-4; usable cpus 2-3,5-6 on NUMA nodes 1-4; "
            "allowed CPUs 0-1,12-15 not used: the memory of their node(s) 0,6-7 is outside the allowed mems"
            ) in agent.log()
    assert "Traceback" not in agent.log()
