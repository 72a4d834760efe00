"""Property tests: the fast merge equals the kubelet's literal cross product
on random small machines, for every policy and option; and admission's use of
it places requests that name nodes or CPUs (-N, -m, -C) as the policy says."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from numa_agent.admission.admit import InvalidRequest, Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.topology_manager import (
    POLICIES,
    TopologyManagerOptions,
    _merge,
)
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint
from numa_agent.state.model import AgentState
from tests.support.reference_merge import kubelet_lists, reference_merge
from tests.support.synthetic import make_topology


def _subsets(nodes):
    nodes = list(nodes)
    return [NumaMask([n for i, n in enumerate(nodes) if k >> i & 1]) for k in range(1, 1 << len(nodes))]


@st.composite
def machines(draw):
    nodes = sorted(draw(st.sets(st.integers(0, 9), min_size=1, max_size=6)))
    # Asymmetric distances happen (the kubelet's eight-node vector has one).
    dist = {a: {b: 10 if a == b else draw(st.sampled_from([11, 12, 20, 21, 30])) for b in nodes}
            for a in nodes}
    return nodes, dist


def _explicit(draw, nodes):
    masks = _subsets(nodes)
    # Mostly real masks: nil hints are rarer in practice and make merges trivial.
    mask = st.sampled_from([None] + masks * 4)
    hints = draw(st.lists(st.tuples(mask, st.booleans()), max_size=5))
    return HintSet.explicit([TopologyHint(m, p) for m, p in hints])


def _generated(draw, nodes):
    span = draw(st.sets(st.sampled_from(nodes), min_size=1))
    masks = _subsets(sorted(span))
    monotone = draw(st.booleans())
    if monotone:
        seeds = draw(st.lists(st.sampled_from(masks), max_size=3))
        fitting = frozenset(m.bits for m in masks if any(s.bits & ~m.bits == 0 for s in seeds))
    else:
        fitting = frozenset(m.bits for m in draw(st.sets(st.sampled_from(masks), max_size=8)))
    # Contract of generated sets: nothing narrower than min_size fits.
    narrowest = min((b.bit_count() for b in fitting), default=len(span))
    min_size = draw(st.integers(1, narrowest))
    also = None
    if draw(st.booleans()):
        extra = frozenset(m.bits for m in draw(st.sets(st.sampled_from(masks), max_size=4)))
        also = lambda m, extra=extra: m.bits in extra  # noqa: E731
    return HintSet.generated(NumaMask(sorted(span)), lambda m, f=fitting: m.bits in f, min_size,
                             also_preferred=also, monotone=monotone)


@st.composite
def provider_lists(draw, nodes, generated_weight=1):
    providers = []
    for _ in range(draw(st.integers(0, 4))):
        shape = draw(st.sampled_from(["none", "empty"] + ["resources"] * 6))
        if shape == "none":
            providers.append(None)
        elif shape == "empty":
            providers.append({})
        else:
            res = {}
            for i in range(draw(st.integers(1, 2))):
                kind = draw(st.sampled_from(["nopref", "impossible"] + ["explicit"] * 3
                                            + ["generated"] * 3 * generated_weight))
                if kind == "nopref":
                    res[f"r{i}"] = None
                elif kind == "impossible":
                    res[f"r{i}"] = HintSet.impossible()
                elif kind == "explicit":
                    res[f"r{i}"] = _explicit(draw, nodes)
                else:
                    res[f"r{i}"] = _generated(draw, nodes)
            providers.append(res)
    return providers


def _check(data, weight):
    nodes, dist = data.draw(machines())
    providers = data.draw(provider_lists(nodes, weight))
    assume(math.prod(len(h) for h in kubelet_lists(providers)) <= 4000)
    policy = data.draw(st.sampled_from(POLICIES))
    options = TopologyManagerOptions(prefer_closest_numa_nodes=data.draw(st.booleans()))
    want = reference_merge(providers, nodes, policy, options, dist)
    got, exact = _merge(providers, nodes, policy, options, dist)
    assert exact
    assert got == want, (policy, options, providers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.data())
def test_fast_merge_equals_kubelet_cross_product(data):
    _check(data, 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.data())
def test_fast_merge_equals_cross_product_with_mostly_generated_sets(data):
    _check(data, 4)


@st.composite
def monotone_only(draw, nodes):
    providers = []
    for _ in range(draw(st.integers(2, 3))):
        span = sorted(nodes)
        masks = _subsets(span)
        seeds = draw(st.lists(st.sampled_from([m for m in masks if m.count() >= 2] or masks),
                              min_size=1, max_size=3))
        fitting = frozenset(m.bits for m in masks if any(s.bits & ~m.bits == 0 for s in seeds))
        narrowest = min(b.bit_count() for b in fitting)
        min_size = draw(st.integers(1, narrowest))
        providers.append({"r": HintSet.generated(NumaMask(span), lambda m, f=fitting: m.bits in f,
                                                 min_size, monotone=True)})
    return providers


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.data())
def test_fast_merge_equals_cross_product_when_monotone_sets_must_cut_together(data):
    # Merged masks that no single provider offers (the intersection of two
    # wider fitting masks) are where a shortcut would go wrong.
    nodes = sorted(data.draw(st.sets(st.integers(0, 7), min_size=3, max_size=5)))
    providers = data.draw(monotone_only(nodes))
    assume(math.prod(len(h) for h in kubelet_lists(providers)) <= 30000)
    policy = data.draw(st.sampled_from(["best-effort", "restricted"]))
    want = reference_merge(providers, nodes, policy)
    got, exact = _merge(providers, nodes, policy, None, None)
    assert exact and got == want


# ---------------------------------------------------------------------------
# The merge as admission drives it: requests that name nodes or CPUs (-N, -m, -C)
# land where the policy says, like those that do not.

GiB = 1 << 30


@st.composite
def bound_requests(draw):
    topo = make_topology(sockets=draw(st.integers(1, 2)), nodes_per_socket=draw(st.integers(1, 2)),
                         cores_per_node=draw(st.integers(2, 4)), threads_per_core=draw(st.sampled_from([1, 2])),
                         memory_per_node_bytes=4 * GiB)
    m = build_machine(topo, PolicyConfig(topology_policy=draw(st.sampled_from(["single-numa-node", "restricted"]))))
    state = AgentState()
    for i in range(draw(st.integers(0, 2))):  # neighbours, some of which may not fit
        try:
            state = decide(m, state, Request(f"n{i}", 1001, Resources(
                cpus=draw(st.integers(1, 3)), memory_bytes=draw(st.sampled_from([0, GiB]))))).state
        except Refusal:  # a neighbour that does not fit is left out
            pass
    node_sets = st.sets(st.sampled_from(m.node_ids), min_size=1).map(lambda s: tuple(sorted(s)))
    memory = draw(st.sampled_from([0, GiB // 2, GiB, 3 * GiB, 6 * GiB]))
    membind = draw(st.none() | node_sets)
    if draw(st.booleans()):
        pinned = CpuSet(draw(st.sets(st.sampled_from(m.usable_cpus.ids()), min_size=1, max_size=4)))
        request = Request("x", 1000, Resources(memory_bytes=memory), physcpubind=pinned, membind=membind)
    else:
        request = Request("x", 1000, Resources(cpus=draw(st.integers(1, 6)), memory_bytes=memory),
                          cpunodebind=draw(st.none() | node_sets), membind=membind)
    return m, state, request


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bound_requests())
def test_named_nodes_and_cpus_land_as_the_aligned_policies_say(scene):
    m, state, request = scene
    try:
        b = decide(m, state, request).workload.booking
    except (Refusal, InvalidRequest):
        return
    cpu_nodes = set(m.nodes_of(b.cpus))
    if request.cpunodebind is not None:
        assert cpu_nodes <= set(request.cpunodebind)
    if request.membind is not None:
        assert set(b.mems) == set(request.membind) and set(b.memory) <= set(request.membind)
    if m.policy.topology_policy == "single-numa-node":
        assert len(cpu_nodes | set(b.memory) | set(b.mems)) == 1
        assert b.numa_nodes == tuple(sorted(cpu_nodes | set(b.mems)))
    else:  # restricted: the CPUs span no more nodes than their count needs
        assert len(cpu_nodes) <= m.cpu_topology.min_nodes_for(len(b.cpus))
