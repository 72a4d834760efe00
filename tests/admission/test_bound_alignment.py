"""-N, -C and -m under the aligned policies: the node(s) a request names are part
of the merge, so its CPUs and its memory land together (issue 37 follow-up: a
`-N 1` admission under single-numa-node booked its memory on node 0)."""

import pytest

from numa_agent.admission.admit import Refusal, decide
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState
from tests.admission.test_admit import machine, req

GiB = 1 << 30


def _nodes(m, booking):
    return set(m.nodes_of(booking.cpus)) | set(booking.memory) | set(booking.mems)


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort"])
def test_cpunodebind_brings_the_memory_to_the_named_node(policy):
    m = machine(policy)
    b = decide(m, AgentState(), req("x", cpus=2, memory_bytes=GiB, cpunodebind=(1,))).workload.booking
    assert _nodes(m, b) == {1}
    assert b.numa_nodes == (1,)


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort"])
def test_physcpubind_brings_the_memory_to_the_pinned_cpus_node(policy):
    m = machine(policy)
    one = CpuSet([m.cpus_of_nodes((1,)).min()])
    b = decide(m, AgentState(), req("x", physcpubind=one, memory_bytes=GiB)).workload.booking
    assert _nodes(m, b) == {1}


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort"])
def test_membind_brings_the_cpus_to_the_named_node(policy):
    m = machine(policy)
    for memory in (GiB, 0):
        b = decide(m, AgentState(), req("x", cpus=2, memory_bytes=memory, membind=(1,))).workload.booking
        assert _nodes(m, b) == {1}, memory


def test_single_numa_node_refuses_what_names_two_nodes_it_must_span():
    m = machine("single-numa-node")
    across = CpuSet([m.cpus_of_nodes((0,)).min(), m.cpus_of_nodes((1,)).min()])
    with pytest.raises(Refusal) as err:
        decide(m, AgentState(), req("c", physcpubind=across, memory_bytes=GiB))
    assert err.value.code == "topology_affinity_error"
    with pytest.raises(Refusal) as err:
        decide(m, AgentState(), req("m", cpus=2, memory_bytes=GiB, membind=(0, 1)))
    assert err.value.code == "topology_affinity_error"


def test_cpunodebind_of_two_nodes_still_lands_on_one_under_single_numa_node():
    m = machine("single-numa-node")
    state = decide(m, AgentState(), req("a", cpus=6, cpunodebind=(0,))).state  # node 0 has 2 CPUs left
    b = decide(m, state, req("x", cpus=4, memory_bytes=GiB, cpunodebind=(0, 1))).workload.booking
    assert _nodes(m, b) == {1}


def test_policy_none_places_the_memory_as_before():
    """No merge under none: the memory manager takes its default (the narrowest fit)."""
    m = machine("none")
    b = decide(m, AgentState(), req("x", cpus=2, memory_bytes=GiB, cpunodebind=(1,))).workload.booking
    assert m.nodes_of(b.cpus) == (1,)
    assert set(b.memory) == {0}


@pytest.mark.parametrize("policy", ["none", "best-effort", "single-numa-node"])
def test_membind_memory_never_spills_off_the_named_nodes(policy):
    """-m 0 is cpuset.mems 0: memory booked on another node would be memory the
    kernel never gives it, and that node's free memory told wrong."""
    m = machine(policy)  # 8 GiB a node
    with pytest.raises(Refusal) as err:
        decide(m, AgentState(), req("x", cpus=2, memory_bytes=10 * GiB, membind=(0,)))
    assert err.value.code == "insufficient_memory"
