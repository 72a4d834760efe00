"""Memory-only NUMA nodes (GPU memory, CXL expanders): out of every booking that
does not name them, unless [memory_manager] memory_only_nodes = "ordinary"."""

import pytest

from numa_agent.admission.accounting import node_accounting
from numa_agent.admission.admit import Refusal, Request, Resources, decide
from numa_agent.admission.machine import MachineConfigError, PolicyConfig, build_machine
from numa_agent.core.cpuset import CpuSet
from numa_agent.discovery.sysfs import read_topology
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

GiB = 1 << 30
POWER9 = "power9-2s-smt4-gpu-numa-nodes"


def req(name, **kw):
    res = {k: kw.pop(k) for k in ("cpus", "memory_bytes", "hugepages") if k in kw}
    return Request(name=name, owner_uid=1000, resources=Resources(**res), **kw)


def cxl_machine(mode="explicit", policy="best-effort", **kw):
    """Two CPU nodes and a CPU-less node 2 (a CXL expander), 8 GiB and 64 2 MiB pages each."""
    topo = make_topology(sockets=2, cores_per_node=4, memory_per_node_bytes=8 * GiB,
                         hugepages_2m_per_node=64, cpuless_node_ids=(2,), **kw)
    return build_machine(topo, PolicyConfig(topology_policy=policy, memory_only_nodes=mode))


def memory_nodes(decision):
    booking = decision.workload.booking if decision.pod_created is None else decision.pod_created.booking
    return set(booking.memory) | set(booking.memory_group) | set(booking.mems)


@pytest.fixture(scope="module")
def power9(snapshot):
    root, _ = snapshot(POWER9)
    return read_topology(root)


# ------------------------------------------------------------------ POWER9 snapshot
def test_power9_gpu_nodes_are_memory_only(power9):
    assert power9.memory_only_node_ids == (250, 251, 252, 253, 254, 255)
    assert build_machine(power9, PolicyConfig()).explicit_nodes == (250, 251, 252, 253, 254, 255)


def test_power9_a_request_over_ordinary_memory_is_refused_naming_the_gpu_nodes(power9):
    m = build_machine(power9, PolicyConfig())
    with pytest.raises(Refusal) as refused:
        decide(m, AgentState(), req("big", cpus=2, memory_bytes=300 * GiB))
    assert refused.value.code == "topology_affinity_error"
    assert refused.value.message.startswith("TopologyAffinityError: ")
    assert "requested 300 GiB, more than the nodes it may use can ever hold (node 0 has" in refused.value.message
    assert refused.value.message.endswith(
        "it fits only with memory-only node(s) 250,251,252,253, which a booking uses "
        "only when it names them: add -m 0,8,250,251,252,253 to use memory-only node(s) 250,251,252,253 "
        "(membind in the API)")


def test_power9_naming_the_gpu_nodes_books_them(power9):
    m = build_machine(power9, PolicyConfig())
    d = decide(m, AgentState(), req("big", cpus=2, memory_bytes=300 * GiB, membind=(0, 8, 250, 251, 252, 253)))
    assert d.workload.booking.mems == (0, 8, 250, 251, 252, 253)
    assert sum(per["memory"] for per in d.workload.booking.memory.values()) == 300 * GiB


def test_power9_shared_workload_memory_stays_on_cpu_nodes(power9):
    d = decide(build_machine(power9, PolicyConfig()), AgentState(), req("s", shared=True))
    assert d.workload.booking.mems == (0, 8)


def test_power9_ordinary_keeps_the_kubelets_behaviour(power9):
    m = build_machine(power9, PolicyConfig(memory_only_nodes="ordinary"))
    assert m.explicit_nodes == ()
    d = decide(m, AgentState(), req("big", cpus=2, memory_bytes=300 * GiB))
    assert d.workload.booking.memory_group == (0, 8, 250, 251, 252, 253)


# ------------------------------------------------------------- a CXL-like machine
def spill_state(m):
    """Node 1 half booked by a workload bound there: its group {1} cannot be joined."""
    return decide(m, AgentState(), req("on1", memory_bytes=7 * GiB, membind=(1,))).state


def test_best_effort_spill_does_not_reach_the_memory_only_node():
    m = cxl_machine()
    with pytest.raises(Refusal) as refused:
        decide(m, spill_state(m), req("spill", cpus=2, memory_bytes=12 * GiB))
    assert refused.value.code == "topology_affinity_error"  # as under the stricter policies
    assert "memory-only node(s) 2 " in refused.value.message
    assert "add -m 0,2 to use memory-only node(s) 2" in refused.value.message


def test_ordinary_spills_onto_the_memory_only_node_as_before():
    m = cxl_machine("ordinary")
    d = decide(m, spill_state(m), req("spill", cpus=2, memory_bytes=12 * GiB))
    assert d.workload.booking.memory_group == (0, 2)


def test_naming_the_memory_only_node_admits_the_spill():
    m = cxl_machine()
    d = decide(m, spill_state(m), req("spill", cpus=2, memory_bytes=12 * GiB, membind=(0, 2)))
    assert d.workload.booking.memory_group == (0, 2)
    assert d.workload.booking.memory[2]["memory"] > 0


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_the_merge_refusal_says_how_to_name_the_node(policy):
    m = cxl_machine(policy=policy)
    with pytest.raises(Refusal) as refused:
        decide(m, spill_state(m), req("spill", cpus=2, memory_bytes=12 * GiB))
    assert refused.value.code == "topology_affinity_error"
    assert "fits only with memory-only node(s) 2" in refused.value.message


def test_hugepages_stay_off_the_memory_only_node():
    m = cxl_machine()
    d = decide(m, AgentState(), req("hp", hugepages={2048: 100}))  # two nodes' pools
    assert memory_nodes(d) <= {0, 1}
    with pytest.raises(Refusal) as refused:  # three nodes' pools
        decide(m, AgentState(), req("more", hugepages={2048: 150}))
    assert "add -m 0,1,2 to use memory-only node(s) 2" in refused.value.message
    named = decide(m, AgentState(), req("more", hugepages={2048: 150}, membind=(0, 1, 2)))
    assert named.workload.booking.memory[2]["hugepages-2048kB"] > 0


def test_a_pod_budget_stays_off_the_memory_only_node():
    m = cxl_machine()
    d = decide(m, AgentState(), req("a", pod="p", pod_budget=Resources(cpus=2, memory_bytes=12 * GiB)))
    assert memory_nodes(d) <= {0, 1}
    with pytest.raises(Refusal) as refused:
        decide(m, AgentState(), req("a", pod="p", pod_budget=Resources(cpus=2, memory_bytes=20 * GiB)))
    assert "a pod's budget cannot name nodes" in refused.value.message
    ordinary = cxl_machine("ordinary")
    d = decide(ordinary, AgentState(), req("a", pod="p", pod_budget=Resources(cpus=2, memory_bytes=20 * GiB)))
    assert 2 in memory_nodes(d)


def test_a_workload_without_memory_gets_no_memory_only_mems():
    d = decide(cxl_machine(), AgentState(), req("s", shared=True))
    assert d.workload.booking.mems == (0, 1)
    assert decide(cxl_machine("ordinary"), AgentState(), req("s", shared=True)).workload.booking.mems == (0, 1, 2)


def test_a_node_whose_cpus_are_all_outside_the_agents_cpuset_is_memory_only():
    topo = make_topology(sockets=2, cores_per_node=2, memory_per_node_bytes=8 * GiB,
                         allowed_cpus=CpuSet.parse("0-1,4-5"))
    assert topo.memory_only_node_ids == (1,)
    m = build_machine(topo, PolicyConfig())
    state = decide(m, AgentState(), req("a", memory_bytes=4 * GiB)).state
    assert memory_nodes(decide(m, state, req("b", memory_bytes=2 * GiB))) == {0}
    with pytest.raises(Refusal, match="add -m 0,1 to use memory-only node"):  # node 0 has 4 GiB left
        decide(m, state, req("c", memory_bytes=6 * GiB))


def test_a_bad_mode_is_a_configuration_error():
    with pytest.raises(MachineConfigError, match="memory_manager.memory_only_nodes: 'kubelet' is not one of "
                                                 "explicit, ordinary"):
        cxl_machine("kubelet")


def test_the_accounting_gives_each_nodes_kind_and_distances():
    nodes = {n["id"]: n for n in node_accounting(cxl_machine(), AgentState())}
    assert [nodes[n]["kind"] for n in (0, 1, 2)] == ["cpu", "cpu", "memory-only"]
    assert nodes[2]["distances"] == {"0": 40, "1": 40, "2": 10}
