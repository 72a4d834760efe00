"""A resize of a workload whose node is short of memory (booked more than it has
now: `memory_manager.shortfalls`, `view.fenced_nodes`): giving back is always
allowed, adding on the fenced node is refused as an admission there would be."""

import pytest

from numa_agent.admission.admit import Refusal, decide, release
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.resize import resize
from numa_agent.admission.view import allocatable_cpus, fenced_nodes
from numa_agent.hotplug.rebase import rebase_state
from numa_agent.state.model import AgentState
from tests.hotplug.test_memory_capacity import GiB, machine, req, topology
from tests.support.synthetic import make_topology, with_node_memory

POLICIES = ["best-effort", "restricted", "single-numa-node", "none"]


def fenced_scene(policy, **web):
    """`big` (6 GiB) and `web` (4 CPUs, 1 GiB) on node 1, whose memory then drops
    to 4 GiB: node 1 stays fenced without `web` too (big alone is over)."""
    m = machine(topology(), topology_policy=policy)
    state = decide(m, AgentState(), req("big", cpus=4, memory_bytes=6 * GiB, cpunodebind=(1,), membind=(1,))).state
    if not web:  # placed on node 1 by filling node 0 first, then freeing it
        free_on_0 = allocatable_cpus(m, state) & m.cpus_of_nodes((0,))
        state = decide(m, state, req("fill", physcpubind=free_on_0)).state
        state = decide(m, state, req("web", cpus=4, memory_bytes=GiB)).state
        state = release(state, "fill")[0]
    else:
        state = decide(m, state, req("web", cpus=4, memory_bytes=GiB, **web)).state
    assert set(state.workload("web").booking.memory) == {1} or policy == "none"
    shrunk = machine(topology(4 * GiB), topology_policy=policy)
    state, _ = rebase_state(shrunk, state)
    assert fenced_nodes(shrunk, state) == (1,)
    return shrunk, state


@pytest.mark.parametrize("web", [{"cpunodebind": (1,)}, {"cpunodebind": (1,), "membind": (1,)}, {}])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_shrink_on_a_fenced_node_is_admitted(policy, web):
    m, state = fenced_scene(policy, **web)
    w = state.workload("web")
    d = resize(m, state, "web", cpus=2)
    got = d.workload.booking
    assert len(got.cpus) == 2 and got.cpus.issubset(w.booking.cpus)
    assert got.memory == w.booking.memory  # its memory stays where it is
    d = resize(m, state, "web", memory_bytes=GiB // 2)
    assert d.workload.booking.memory_total("memory") == GiB // 2
    assert set(d.workload.booking.memory) == set(w.booking.memory)
    assert d.workload.booking.cpus == w.booking.cpus
    d = resize(m, state, "web", cpus=1, memory_bytes=GiB // 4)
    assert len(d.workload.booking.cpus) == 1 and d.workload.booking.memory_total("memory") == GiB // 4


@pytest.mark.parametrize("web", [{"cpunodebind": (1,)}, {}])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_growth_on_a_fenced_node_is_refused_as_an_admission_there(policy, web):
    m, state = fenced_scene(policy, **web)
    if policy == "none" and not web:
        pytest.skip("policy none placed web's memory on node 0: nothing of it is fenced")
    asks = [{"memory_bytes": 2 * GiB}, {"cpus": 2, "memory_bytes": 2 * GiB}]
    if web:
        asks.append({"cpus": 6})  # -N 1 names the fenced node, as an admission would
    for ask in asks:
        with pytest.raises(Refusal) as err:
            resize(m, state, "web", **ask)
        assert err.value.code == "numa_node_memory_short", ask
        assert "NUMA node(s) 1 take no new admission" in err.value.message


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cpu_growth_adds_only_off_the_fenced_node(policy):
    """Without -N its new CPUs may come from another node where the policy allows
    it; under the aligned policies they cannot, and the refusal names the fence."""
    m, state = fenced_scene(policy)
    w = state.workload("web")
    if policy in ("best-effort", "none"):
        got = resize(m, state, "web", cpus=6).workload.booking
        assert w.booking.cpus.issubset(got.cpus) and len(got.cpus) == 6
        assert m.nodes_of(got.cpus - w.booking.cpus) == (0,)
        return
    with pytest.raises(Refusal) as err:
        resize(m, state, "web", cpus=6)
    assert "NUMA node(s) 1 take no new admission" in err.value.message


def test_a_resize_off_the_fence_is_decided_as_before():
    """web's memory on node 0 (policy none placed it there): it may grow there."""
    m, state = fenced_scene("none")
    w = state.workload("web")
    assert set(w.booking.memory) == {0}
    assert resize(m, state, "web", memory_bytes=2 * GiB).workload.booking.memory == {0: {"memory": 2 * GiB}}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_workload_alone_over_its_node_is_fenced_for_its_own_growth(policy):
    """The resize is decided on the state without it, but the fence counts what it
    keeps: a node short of memory because of it alone takes no more of it."""
    m = machine(topology(), topology_policy=policy)
    state = decide(m, AgentState(), req("web", cpus=2, memory_bytes=6 * GiB, cpunodebind=(1,), membind=(1,))).state
    shrunk = machine(topology(4 * GiB), topology_policy=policy)
    state, _ = rebase_state(shrunk, state)
    assert fenced_nodes(shrunk, state) == (1,)
    for ask in ({"cpus": 4}, {"memory_bytes": 7 * GiB}):
        with pytest.raises(Refusal) as err:
            resize(shrunk, state, "web", **ask)
        assert err.value.code == "numa_node_memory_short", ask
        assert "node 1 memory: 6 GiB booked, 4 GiB allocatable" in err.value.message
    assert resize(shrunk, state, "web", cpus=1, memory_bytes=5 * GiB).workload.booking.memory == \
        {1: {"memory": 5 * GiB}}


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_giving_back_on_a_node_shrunk_below_what_it_keeps_is_admitted(policy):
    """No node can hold what it keeps any more: its one node is still as narrow as
    a mask gets, so the aligned policies prefer it (found by the resize property)."""
    topo = make_topology(sockets=1, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=8 * GiB)
    m = build_machine(topo, PolicyConfig(topology_policy=policy))
    state = decide(m, AgentState(), req("web", cpus=2, memory_bytes=2 * GiB)).state
    shrunk = build_machine(with_node_memory(topo, 0, GiB), PolicyConfig(topology_policy=policy))
    state, _ = rebase_state(shrunk, state)
    assert fenced_nodes(shrunk, state) == (0,)
    got = resize(shrunk, state, "web", cpus=1, memory_bytes=3 * GiB // 2).workload.booking
    assert len(got.cpus) == 1 and got.memory == {0: {"memory": 3 * GiB // 2}}
