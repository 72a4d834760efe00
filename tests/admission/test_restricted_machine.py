"""A machine seen through the agent's cpuset: the NUMA nodes it may use, the
CPUs it may hand out and the CPU manager's view agree, so no hint names a
node the merge does not know. (2 sockets x 2 cores x 2 threads, split
numbering: node 0 holds cores {0,4} and {1,5}, node 1 {2,6} and {3,7}.)"""

from dataclasses import replace

import pytest

from numa_agent.admission.admit import InvalidRequest, Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology


def topology(**kw):
    return make_topology(sockets=2, cores_per_node=2, threads_per_core=2, memory_per_node_bytes=4 << 30, **kw)


def one_cpu(name, **kw):
    return Request(name=name, owner_uid=1000, pid=4242, resources=Resources(cpus=1), **kw)


def fill(machine, policy):
    """Admit 1 CPU at a time until refused; the decisions made."""
    state, out = AgentState(), []
    for i in range(len(machine.usable_cpus)):
        try:
            d = decide(machine, state, one_cpu(f"w{i}", policy=policy))
        except Refusal:
            break
        state = d.state
        out.append(d)
    return out


@pytest.mark.parametrize("policy", ["best-effort", "single-numa-node"])
def test_cpus_of_a_node_whose_memory_the_cpuset_excludes_are_not_handed_out(policy):
    m = build_machine(topology(allowed_mems=[1]), PolicyConfig(topology_policy=policy))
    assert m.node_ids == (1,)
    assert m.usable_cpus == CpuSet.parse("2-3,6-7")
    assert set(m.cpu_topology.numa_ids) == {1}
    decisions = fill(m, policy)
    assert len(decisions) == 3  # one of the four is reserved
    for d in decisions:
        assert d.workload.booking.numa_nodes == (1,) and d.workload.booking.mems == (1,)


def test_a_memory_less_node_stays_usable_under_a_mems_restriction():
    # The kernel never lists a node without memory in a cpuset's mems.
    topo = topology(allowed_mems=[0])
    bare = replace(topo.numa_nodes[1], memory_total_bytes=0, memory_free_bytes=0, hugepages=())
    topo = replace(topo, numa_nodes=(topo.numa_nodes[0], bare))
    m = build_machine(topo, PolicyConfig(topology_policy="single-numa-node"))
    assert m.node_ids == (0, 1) and m.usable_cpus == CpuSet.parse("0-7")
    decisions = fill(m, "single-numa-node")
    assert len(decisions) == 7
    on_node_1 = [d.workload.booking for d in decisions if m.nodes_of(d.workload.booking.cpus) == (1,)]
    assert on_node_1 and all(b.mems == (0,) for b in on_node_1)  # the nearest memory
    with pytest.raises(InvalidRequest, match=r"membind: NUMA node\(s\) 1 have no memory \(nodes with memory: 0\)"):
        decide(m, AgentState(), Request(name="m", owner_uid=0, membind=(1,)))


def test_reserved_cpus_are_taken_from_the_cpus_the_agent_may_use():
    m = build_machine(topology(allowed_cpus=CpuSet.parse("1-3,5-7")), PolicyConfig())
    assert m.reserved_cpus == CpuSet.parse("1")


def test_a_core_whose_sibling_is_outside_the_cpuset_is_not_a_whole_core():
    m = build_machine(topology(allowed_cpus=CpuSet.parse("0-3,5-7")),
                      PolicyConfig(cpu_options={"full-pcpus-only": "true"}, reserved_cpus="1,5",
                                   reserved_cpu_count=0))
    state, held = AgentState(), CpuSet()
    for i in range(2):
        d = decide(m, state, Request(name=f"w{i}", owner_uid=0, resources=Resources(cpus=2)))
        state, held = d.state, held | d.workload.booking.cpus
    assert held == CpuSet.parse("2-3,6-7")
    with pytest.raises(Refusal, match="requested 2, 1 free"):  # CPU 0, without its sibling
        decide(m, state, Request(name="x", owner_uid=0, resources=Resources(cpus=2)))
