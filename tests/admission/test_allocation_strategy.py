"""numa-allocation-strategy (KEP-6007): equally good NUMA node sets are ranked by
how allocated they are: least-allocated spreads, most-allocated packs, none keeps
the lowest mask."""

import pytest

from numa_agent.admission.admit import InvalidRequest, Refusal, Request, Resources, decide
from numa_agent.admission.allocation_score import provider_score, set_score, tie_rank
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.topology_manager import TopologyConfigError, TopologyManagerOptions
from numa_agent.core.policy import AllocationStrategy
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

GiB = 1 << 30


def machine(strategy=None, policy="single-numa-node", nodes=4, **options):
    topo = make_topology(sockets=nodes, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=8 * GiB)
    opts = dict(options)
    if strategy is not None:
        opts["numa-allocation-strategy"] = strategy
    return build_machine(topo, PolicyConfig(topology_policy=policy, topology_options=opts,
                                            reserved_cpu_count=0, reserved_cpus="0"))


def req(name, cpus=1, memory=0, **kw):
    return Request(name=name, owner_uid=1000, resources=Resources(cpus=cpus, memory_bytes=memory), **kw)


def nodes_of(m, d):
    return m.nodes_of(d.workload.booking.cpus)


def run(m, *requests):
    state, placed = AgentState(), []
    for r in requests:
        d = decide(m, state, r)
        state = d.state
        placed.append(nodes_of(m, d))
    return state, placed


# ---- the score, as the KEP defines it -----------------------------------------------

def test_a_providers_score_is_the_percentage_assigned_over_the_set_at_least_one():
    figures = [{0: (2, 4), 1: (0, 4)}]
    assert provider_score(figures, 0b01) == 50
    assert provider_score(figures, 0b11) == 25
    assert provider_score(figures, 0b10) == 1  # nothing assigned still scores 1
    assert provider_score([{0: (0, 0)}], 0b01) == 100  # nothing allocatable: full


def test_the_sets_score_averages_the_providers_with_equal_weight():
    cpu = [{0: (3, 4), 1: (0, 4)}]
    memory = [{0: (1, 8), 1: (8, 8)}]
    assert set_score([cpu, memory], 0b01) == (75 + 12) // 2
    assert set_score([cpu, memory], 0b10) == (1 + 100) // 2


def test_none_ranks_nothing_and_most_allocated_ranks_the_busiest_first():
    cpu = [[{0: (3, 4), 1: (1, 4)}]]
    assert tie_rank(AllocationStrategy.NONE, cpu) is None
    most = tie_rank(AllocationStrategy.MOST_ALLOCATED, cpu)
    least = tie_rank(AllocationStrategy.LEAST_ALLOCATED, cpu)
    assert most(0b01) < most(0b10) and least(0b10) < least(0b01)


def test_a_device_on_no_known_node_counts_in_no_set():
    assert provider_score([{-1: (1, 1), 0: (0, 2)}], 0b01) == 1


# ---- placement --------------------------------------------------------------------

def test_none_piles_onto_the_lowest_node():
    m = machine()
    _, placed = run(m, req("a"), req("b"), req("c"))
    assert placed == [(0,), (0,), (0,)]


def test_least_allocated_spreads_over_the_nodes():
    m = machine("least-allocated")
    _, placed = run(m, req("a"), req("b"), req("c"), req("d"), req("e"))
    assert placed[:4] == [(0,), (1,), (2,), (3,)]
    # node 0 gives one of 3 CPUs (CPU 0 is reserved): 33%, the others 25%
    assert placed[4] == (1,)


def test_most_allocated_packs_the_busiest_node_until_it_is_full():
    m = machine("most-allocated")
    state, placed = run(m, req("a", cpus=2), req("b", cpus=1))
    assert placed == [(0,), (0,)]  # node 0's three CPUs (CPU 0 is reserved) are now all given
    d = decide(m, state, req("c", cpus=2))
    assert nodes_of(m, d) == (1,)  # the others are all empty: the lowest
    d = decide(m, d.state, req("d", cpus=1))
    assert nodes_of(m, d) == (1,)  # node 1 half given: busier than 2 and 3


def test_most_allocated_follows_memory_too():
    m = machine("most-allocated")
    state = decide(m, AgentState(), req("big", cpus=0, memory=6 * GiB, membind=(2,))).state
    d = decide(m, state, req("next", cpus=1, memory=1 * GiB))
    assert nodes_of(m, d) == (2,)  # node 2's memory is the busiest


def test_the_strategy_never_widens_a_hint_or_makes_it_preferred():
    m = machine("least-allocated", policy="best-effort", nodes=2)
    state, placed = run(m, req("a", cpus=3))
    assert placed == [(0,)]
    d = decide(m, state, req("b", cpus=4))  # fits only on node 1: width first
    assert nodes_of(m, d) == (1,)
    assert d.explanation["merged"]["preferred"] is True


def test_prefer_closest_ranks_distance_before_allocation():
    # Four nodes at distances 10/11 within a pair and 30 across: a two-node request under
    # least-allocated still takes a close pair, the emptier one.
    topo = make_topology(sockets=2, nodes_per_socket=2, cores_per_node=2, threads_per_core=1,
                         memory_per_node_bytes=8 * GiB)
    m = build_machine(topo, PolicyConfig(topology_policy="restricted", reserved_cpu_count=0, reserved_cpus="0",
                                         topology_options={"prefer-closest-numa-nodes": "true",
                                                           "numa-allocation-strategy": "least-allocated"}))
    state = decide(m, AgentState(), req("one", cpus=1, cpunodebind=(0,))).state
    d = decide(m, state, req("wide", cpus=3))
    nodes = nodes_of(m, d)
    assert len(nodes) == 2 and m.distances[nodes[0]][nodes[1]] == min(
        m.distances[a][b] for a in m.node_ids for b in m.node_ids if a != b)
    assert 0 not in nodes


def test_the_request_overrides_the_configured_strategy():
    m = machine("least-allocated")
    state, _ = run(m, req("a"))
    d = decide(m, state, req("b", numa_allocation_strategy="none"))
    assert nodes_of(m, d) == (0,)
    assert d.workload.request["numa_allocation_strategy"] == "none"
    d = decide(machine(), state, req("c", numa_allocation_strategy="least-allocated"))
    assert nodes_of(m, d) == (1,)


def test_the_explanation_says_when_the_strategy_broke_a_tie():
    m = machine("least-allocated")
    state, _ = run(m, req("a"))
    d = decide(m, state, req("b"))
    assert d.explanation["tie_break"] == {"strategy": "least-allocated", "nodes": [1], "score": 1,
                                          "instead_of": [0], "instead_of_score": 33}
    assert "tie_break" not in decide(machine(), state, req("c")).explanation


def test_an_unknown_strategy_is_an_invalid_request():
    with pytest.raises(InvalidRequest, match="least-allocated, most-allocated"):
        decide(machine(), AgentState(), req("a", numa_allocation_strategy="spread"))


def test_the_option_is_parsed_with_the_kubelets_spelling():
    opts = TopologyManagerOptions.from_mapping({"numa-allocation-strategy": "most-allocated"})
    assert opts.numa_allocation_strategy is AllocationStrategy.MOST_ALLOCATED
    assert opts.to_mapping()["numa-allocation-strategy"] == "most-allocated"
    assert TopologyManagerOptions.from_mapping({}).numa_allocation_strategy is AllocationStrategy.NONE
    with pytest.raises(TopologyConfigError, match="numa-allocation-strategy: unknown value 'spread'"):
        TopologyManagerOptions.from_mapping({"numa-allocation-strategy": "spread"})


def test_a_refusal_is_unchanged_by_the_strategy():
    m = machine("most-allocated")
    with pytest.raises(Refusal) as refused:
        decide(m, AgentState(), req("huge", cpus=5))
    assert refused.value.code == "topology_affinity_error"
