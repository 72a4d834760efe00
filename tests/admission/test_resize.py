"""Resizing a running workload in place: grow beside what it has, shrink what was
added last, refuse what cannot be met and change nothing."""

import pytest

from numa_agent.admission.admit import Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.resize import resize
from numa_agent.state.model import AgentState, Workload
from tests.support.synthetic import make_topology

GiB = 1 << 30


def machine(policy="best-effort", threads=2):
    # 2 nodes x 4 cores x `threads`; CPU 0 reserved
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=threads, memory_per_node_bytes=8 * GiB)
    return build_machine(topo, PolicyConfig(topology_policy=policy))


def admitted(m, name="web", cpus=2, memory=0, state=None, **kw):
    d = decide(m, state or AgentState(),
               Request(name=name, owner_uid=1000, resources=Resources(cpus=cpus, memory_bytes=memory), **kw))
    return d.state, d.workload


def core_of(m, cpu):
    return next(core for core in m.cpu_topology.core_cpus.values() if cpu in core)


def test_growing_keeps_the_cpus_and_fills_their_cores_first():
    m = machine()
    state, w = admitted(m, cpus=2)  # a whole core
    one = resize(m, state, "web", cpus=1)
    (kept,) = one.workload.booking.cpus.ids()
    d = resize(m, one.state, "web", cpus=2)
    grown = d.workload.booking.cpus
    assert one.workload.booking.cpus.issubset(grown) and len(grown) == 2
    assert grown == core_of(m, kept)  # its free sibling, not another core's thread
    assert d.workload.cpus_added == tuple((grown - one.workload.booking.cpus).ids())


def test_growing_takes_whole_cores_of_its_own_node():
    m = machine()
    state, w = admitted(m, cpus=2)
    d = resize(m, state, "web", cpus=6)
    grown = d.workload.booking.cpus
    assert w.booking.cpus.issubset(grown) and len(grown) == 6
    assert m.nodes_of(grown) == m.nodes_of(w.booking.cpus)
    assert all(core_of(m, c).issubset(grown) for c in grown.ids())  # whole cores


def test_best_effort_grows_onto_another_node_when_its_own_is_full():
    m = machine()
    state, w = admitted(m, cpus=6)  # node 0 has 7 CPUs it may give (CPU 0 reserved)
    d = resize(m, state, "web", cpus=9)
    assert len(d.workload.booking.cpus) == 9 and w.booking.cpus.issubset(d.workload.booking.cpus)
    assert d.workload.booking.numa_nodes == (0, 1)


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_aligned_policies_refuse_a_growth_off_their_nodes(policy):
    m = machine(policy)
    state, _ = admitted(m, cpus=6)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=8)  # one node could hold 8: a second one is not preferred
    assert refused.value.code == "topology_affinity_error"
    assert "within NUMA node(s) 0" in refused.value.message


def test_shrinking_gives_back_what_was_added_last():
    m = machine()
    state, w = admitted(m, cpus=2)
    grown = resize(m, state, "web", cpus=4)
    later = resize(m, grown.state, "web", cpus=6)
    back = resize(m, later.state, "web", cpus=4)
    assert back.workload.booking.cpus == grown.workload.booking.cpus
    assert back.workload.cpus_added == grown.workload.cpus_added
    again = resize(m, back.state, "web", cpus=2)
    assert again.workload.booking.cpus == w.booking.cpus and again.workload.cpus_added == ()


def test_shrinking_an_odd_count_keeps_whole_cores_where_it_can():
    m = machine()
    state, w = admitted(m, cpus=4)  # two whole cores
    d = resize(m, state, "web", cpus=3)
    kept = d.workload.booking.cpus
    split = [c for c in kept.ids() if not core_of(m, c).issubset(kept)]
    assert len(kept) == 3 and len(split) == 1  # one core whole, one thread alone: no way around it
    d2 = resize(m, d.state, "web", cpus=2)
    kept2 = d2.workload.booking.cpus
    assert all(core_of(m, c).issubset(kept2) for c in kept2.ids())  # the lone thread went first


def test_the_shared_pool_follows_and_the_state_takes_the_change():
    m = machine()
    state, _ = admitted(m, cpus=2)
    d = resize(m, state, "web", cpus=4)
    assert d.state.exclusive_cpus() == d.workload.booking.cpus
    assert d.workload.request["cpus"] == 4
    assert d.state.workload("web") == d.workload


def test_a_growth_that_cannot_be_met_is_refused_and_changes_nothing():
    m = machine()
    state, _ = admitted(m, cpus=2)
    before = state.to_json() if hasattr(state, "to_json") else state
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=16)  # 15 may be given, one must stay shared
    assert refused.value.code in ("insufficient_cpus", "shared_pool_empty")
    assert (state.to_json() if hasattr(state, "to_json") else state) == before


def test_memory_grows_and_shrinks_on_its_nodes():
    m = machine()
    state, w = admitted(m, cpus=2, memory=1 * GiB)
    node = w.booking.memory_group or tuple(w.booking.memory)
    d = resize(m, state, "web", memory_bytes=3 * GiB)
    assert d.workload.booking.memory_total("memory") == 3 * GiB
    assert set(d.workload.booking.memory) <= set(node)
    assert d.workload.request["memory_bytes"] == 3 * GiB
    d2 = resize(m, d.state, "web", memory_bytes=512 << 20)
    assert d2.workload.booking.memory_total("memory") == 512 << 20


def test_memory_beyond_its_nodes_free_memory_is_refused():
    m = machine()
    state, _ = admitted(m, cpus=2, memory=1 * GiB)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", memory_bytes=64 * GiB)
    assert refused.value.code == "insufficient_memory" and "free" in refused.value.message


@pytest.mark.parametrize("kw,code", [
    ({}, "bad_request"), ({"cpus": 0}, "bad_request"),
])
def test_bad_resizes_are_refused(kw, code):
    m = machine()
    state, _ = admitted(m, cpus=2)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", **kw)
    assert refused.value.code == code


def test_a_shared_workload_or_an_unknown_one_is_not_resized():
    m = machine()
    state, _ = admitted(m, cpus=0, shared=True)
    with pytest.raises(Refusal, match="shared pool"):
        resize(m, state, "web", cpus=2)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "nobody", cpus=2)
    assert refused.value.code == "not_found"


def test_cpus_added_survive_the_checkpoint_and_old_ones_read_back():
    m = machine()
    state, _ = admitted(m, cpus=2)
    w = resize(m, state, "web", cpus=4).workload
    assert Workload.from_json(w.to_json()).cpus_added == w.cpus_added
    plain = w.to_json()
    plain.pop("cpus_added")
    assert Workload.from_json(plain).cpus_added == ()
    assert "cpus_added" not in state.workload("web").to_json()


def pod_state(m):
    from numa_agent.admission.request import Resources as R
    state, _ = admitted(m, name="main", cpus=2, pod="pd", pod_budget=R(cpus=6, memory_bytes=4 * GiB))
    state, _ = admitted(m, name="side", cpus=0, pod="pd", state=state)
    return state


def test_a_pod_member_grows_and_shrinks_inside_its_budget():
    m = machine()
    state = pod_state(m)
    pod_cpus = state.pod("pd").booking.cpus
    d = resize(m, state, "main", cpus=4)
    assert len(d.workload.booking.cpus) == 4 and d.workload.booking.cpus.issubset(pod_cpus)
    assert d.state.exclusive_cpus() == state.exclusive_cpus()  # the machine's pool does not change
    back = resize(m, d.state, "main", cpus=2)
    assert back.workload.booking.cpus == state.workload("main").booking.cpus


def test_a_pod_member_keeps_a_cpu_for_the_members_that_share():
    m = machine()
    with pytest.raises(Refusal) as refused:
        resize(m, pod_state(m), "main", cpus=6)
    assert refused.value.code == "pod_shared_part_empty" and "side" in refused.value.message


def test_a_pod_members_memory_stays_within_the_budget():
    m = machine()
    state = pod_state(m)
    assert resize(m, state, "main", memory_bytes=3 * GiB).workload.request["memory_bytes"] == 3 * GiB
    with pytest.raises(Refusal) as refused:
        resize(m, state, "main", memory_bytes=5 * GiB)
    assert refused.value.code == "insufficient_memory" and "budget" in refused.value.message


def test_a_refusal_carries_what_was_asked_and_what_is_free_per_node():
    m = machine()
    state, _ = admitted(m, cpus=6)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=20)
    assert "requested=" not in refused.value.message
    explanation = refused.value.explanation
    assert explanation["resize"]["asked"] == {"cpus": 20}
    assert explanation["resize"]["from"]["cpus"] == state.workload("web").booking.cpus.format()
    assert {node: free["cpus"] for node, free in explanation["free"].items()} == {"0": 1, "1": 8}
