"""Memory manager, static policy: capacity, hints with the kubelet's group
rules, allocation and release."""

from __future__ import annotations

import dataclasses
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.admission.memory_manager import (
    MEMORY,
    MemoryAllocation,
    MemoryAllocationError,
    MemoryCapacity,
    MemoryConfigError,
    MemoryRequest,
    MemoryUsage,
    allocate_memory,
    free_bytes,
    hugepages_resource,
    memory_hints,
    memory_refusal_reason,
    usage_from,
    usage_from_booked,
    usage_with,
    usage_without,
)
from numa_agent.core.hints import NumaMask, TopologyHint
from numa_agent.core.topology import HugePages
from tests.support.synthetic import make_topology

GiB = 1 << 30
MiB = 1 << 20
HP2M = hugepages_resource(2048)
HP1G = hugepages_resource(1024 * 1024)

EMPTY_USAGE = MemoryUsage()


def machine(mem_gib, hp2m=None, hp1g=None, reserved=None):
    """A machine with one node per entry of mem_gib (GiB of memory each; 0
    makes a CPU-only node) and per-node hugepage pool sizes in pages."""
    topo = make_topology(sockets=len(mem_gib), cores_per_node=2)
    hp2m = hp2m or [0] * len(mem_gib)
    hp1g = hp1g or [0] * len(mem_gib)
    nodes = tuple(
        dataclasses.replace(
            n,
            memory_total_bytes=mem_gib[i] * GiB,
            hugepages=(HugePages(2048, hp2m[i], hp2m[i]), HugePages(1048576, hp1g[i], hp1g[i])),
        )
        for i, n in enumerate(topo.numa_nodes)
    )
    topo = dataclasses.replace(topo, numa_nodes=nodes)
    return topo, MemoryCapacity.from_topology(topo, reserved or {})


def listed(hintset):
    return [(h.mask.nodes() if h.mask else None, h.preferred) for h in hintset.hints()]


# ---------------------------------------------------------------- capacity


def test_capacity_counts_hugepage_pools_and_subtracts_them_from_memory():
    _, cap = machine([16, 16], hp2m=[512, 0], hp1g=[2, 0])
    assert cap.get(0, HP2M).total == 512 * 2 * MiB
    assert cap.get(0, HP1G).total == 2 * GiB
    # The kernel counts the pools inside the node's memory total.
    assert cap.get(0, MEMORY).total == 16 * GiB - GiB - 2 * GiB
    assert cap.get(1, MEMORY).total == 16 * GiB
    assert cap.node_ids == (0, 1)
    assert cap.resources == (HP1G, HP2M, MEMORY)


def test_reserved_memory_lowers_allocatable():
    _, cap = machine([16, 16], hp2m=[512, 512], reserved={0: {MEMORY: GiB, HP2M: 4 * MiB}})
    assert cap.get(0, MEMORY).reserved == GiB
    assert cap.allocatable(0, MEMORY) == 15 * GiB - GiB
    assert cap.allocatable(0, HP2M) == GiB - 4 * MiB
    assert cap.allocatable(1, MEMORY) == 15 * GiB


def test_nodes_without_memory_or_outside_the_agents_mems_do_not_count():
    topo, cap = machine([16, 0, 16])
    assert cap.node_ids == (0, 2)
    restricted = dataclasses.replace(topo, allowed_mems=frozenset({2}))
    assert MemoryCapacity.from_topology(restricted).node_ids == (2,)


@pytest.mark.parametrize("reserved, message", [
    ({5: {MEMORY: GiB}}, "NUMA node 5, which has no usable memory"),
    ({1: {MEMORY: GiB}}, "NUMA node 1, which has no usable memory"),
    ({0: {"hugepages-4kB": 1}}, "resource 'hugepages-4kB' on NUMA node 0, which it does not have"),
    ({0: {MEMORY: 17 * GiB}}, "reserved memory on NUMA node 0 is 17 GiB, more than its total of 16 GiB"),
    ({0: {MEMORY: -1}}, "reserved memory on NUMA node 0 must be a byte count >= 0"),
])
def test_reserved_memory_errors_name_the_culprit(reserved, message):
    topo, _ = machine([16, 0])
    with pytest.raises(MemoryConfigError, match=message):
        MemoryCapacity.from_topology(topo, reserved)


# ----------------------------------------------------------------- request


def test_request_amounts_per_resource_in_bytes():
    req = MemoryRequest(GiB, {2048: 4, 1048576: 0})
    assert req.amounts() == ((HP2M, 8 * MiB), (MEMORY, GiB))
    assert req == MemoryRequest(GiB, ((2048, 4),))
    assert not MemoryRequest()


@pytest.mark.parametrize("kwargs, message", [
    ({"memory_bytes": -1}, "memory_bytes must be an integer >= 0"),
    ({"hugepages": {0: 1}}, "hugepage size must be a positive number of kB"),
    ({"hugepages": {2048: -2}}, "hugepage count for 2048kB must be an integer >= 0"),
    ({"hugepages": ((2048, 1), (2048, 2))}, "hugepage size 2048kB given twice"),
])
def test_request_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MemoryRequest(**kwargs)


# ------------------------------------------------------------------- hints


def test_single_node_preferred_when_one_node_holds_the_request():
    _, cap = machine([16, 16])
    hints = memory_hints(cap, EMPTY_USAGE, MemoryRequest(4 * GiB), NumaMask([0, 1]))
    assert list(hints) == [MEMORY]
    assert listed(hints[MEMORY]) == [((0,), True), ((1,), True), ((0, 1), False)]


def test_request_larger_than_any_node_prefers_two_nodes():
    _, cap = machine([8, 8, 8])
    hints = memory_hints(cap, EMPTY_USAGE, MemoryRequest(10 * GiB), [0, 1, 2])
    assert listed(hints[MEMORY]) == [
        ((0, 1), True), ((0, 2), True), ((1, 2), True), ((0, 1, 2), False)]


def test_zero_requests_are_absent_and_hugepages_get_the_same_masks():
    _, cap = machine([16, 16], hp2m=[0, 512])
    hints = memory_hints(cap, EMPTY_USAGE, MemoryRequest(GiB, {2048: 10, 1048576: 0}), [0, 1])
    assert sorted(hints) == [HP2M, MEMORY]
    assert listed(hints[HP2M]) == listed(hints[MEMORY]) == [((1,), True), ((0, 1), False)]


def test_preferred_size_counts_allocatable_not_free():
    _, cap = machine([8, 8])
    used = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(6 * GiB), NumaMask([0]))
    usage = usage_from([used])
    hints = memory_hints(cap, usage, MemoryRequest(4 * GiB), [0, 1])
    # Node 0 could hold 4 GiB if it were empty, so single nodes stay the preferred size;
    # {0,1} is not offered: node 0 is used alone.
    assert listed(hints[MEMORY]) == [((1,), True)]


def test_reserved_memory_changes_the_preferred_size():
    _, cap = machine([8, 8], reserved={0: {MEMORY: 4 * GiB}, 1: {MEMORY: 4 * GiB}})
    hints = memory_hints(cap, EMPTY_USAGE, MemoryRequest(6 * GiB), [0, 1])
    assert listed(hints[MEMORY]) == [((0, 1), True)]


def test_node_in_a_two_node_group_is_not_offered_alone_nor_in_another_group():
    _, cap = machine([8, 8, 8, 8])
    group = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(10 * GiB), NumaMask([0, 1]))
    assert group.group == NumaMask([0, 1])
    usage = usage_from([group])
    hints = memory_hints(cap, usage, MemoryRequest(GiB), [0, 1, 2, 3])
    masks = [m for m, _ in listed(hints[MEMORY])]
    assert (0,) not in masks and (1,) not in masks
    assert (0, 1) in masks
    assert (1, 2) not in masks and (0, 1, 2) not in masks
    assert listed(hints[MEMORY]) == [((2,), True), ((3,), True), ((0, 1), False), ((2, 3), False)]


def test_node_used_alone_is_not_offered_in_a_group():
    _, cap = machine([8, 8, 8])
    alone = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(GiB), NumaMask([1]))
    hints = memory_hints(cap, usage_from([alone]), MemoryRequest(GiB), [0, 1, 2])
    assert listed(hints[MEMORY]) == [((0,), True), ((1,), True), ((2,), True), ((0, 2), False)]


def test_group_stays_whole_even_on_a_node_that_got_no_bytes():
    _, cap = machine([8, 8, 8])
    # 2 GiB fit on node 0 alone, but the affinity chosen was {0,1}: node 1 joins the group.
    alloc = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(2 * GiB), NumaMask([0, 1]))
    assert alloc.amounts == ((0, MEMORY, 2 * GiB),)
    hints = memory_hints(cap, usage_from([alloc]), MemoryRequest(GiB), [0, 1, 2])
    assert listed(hints[MEMORY]) == [((2,), True), ((0, 1), False)]


def test_impossible_when_no_mask_could_ever_hold_it():
    _, cap = machine([8, 8])
    hints = memory_hints(cap, EMPTY_USAGE, MemoryRequest(GiB, {2048: 1}), [0, 1])
    assert hints[MEMORY].kind == hints[HP2M].kind == "impossible"
    reason = memory_refusal_reason(cap, EMPTY_USAGE, MemoryRequest(GiB, {2048: 1}))
    assert reason == ("hugepages-2048kB: requested 2 MiB, more than the machine can ever hold "
                      "(node 0 has 0 B allocatable, node 1 has 0 B allocatable); "
                      "node 0 has 0 B free, node 1 has 0 B free")


def test_refusal_reason_for_a_full_machine_and_for_the_group_rule():
    _, cap = machine([8, 8])
    big = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(6 * GiB), NumaMask([0]))
    usage = usage_from([big])
    assert memory_refusal_reason(cap, usage, MemoryRequest(7 * GiB)) is None  # node 1 holds it
    assert memory_refusal_reason(cap, usage, MemoryRequest(11 * GiB)) == (
        "memory: requested 11 GiB, node 0 has 2 GiB free, node 1 has 8 GiB free")
    # 9 GiB would fit in free bytes across both nodes, but node 0 is used alone.
    assert memory_refusal_reason(cap, usage, MemoryRequest(9 * GiB)).startswith(
        "no NUMA node set can hold the request under the group rule (groups in use: {0})")


def test_cpu_only_nodes_are_transparent_in_masks():
    _, cap = machine([8, 0, 8])
    hints = memory_hints(cap, EMPTY_USAGE, MemoryRequest(GiB), [0, 1, 2])
    masks = listed(hints[MEMORY])
    assert ((0,), True) in masks and ((0, 1), False) in masks and ((1,), False) not in masks
    alloc = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(GiB), NumaMask([0, 1]))
    assert alloc.group == NumaMask([0])  # the CPU-only node never joins a group


def test_generated_hints_handle_64_nodes_without_enumerating():
    _, cap = machine([2] * 64)
    usage = usage_from([allocate_memory(cap, EMPTY_USAGE, MemoryRequest(3 * GiB), NumaMask([10, 11]))])
    hs = memory_hints(cap, usage, MemoryRequest(5 * GiB), range(64))[MEMORY]
    assert hs.kind == "generated" and hs.min_size == 3
    assert hs.fits(NumaMask([0, 1, 2])) and not hs.fits(NumaMask([0, 1]))
    assert not hs.fits(NumaMask([10, 11, 12]))
    assert hs.fits(NumaMask(range(20, 64)))
    assert allocate_memory(cap, usage, MemoryRequest(5 * GiB), None).group == NumaMask([0, 1, 2])
    # Extending {12}: {10,11} is a group, so the narrowest is {0,1,12}.
    assert allocate_memory(cap, usage, MemoryRequest(5 * GiB), NumaMask([12])).group == NumaMask([0, 1, 12])


# -------------------------------------------------------------- allocation


def test_fills_lowest_node_first_per_resource():
    _, cap = machine([8, 8], hp2m=[4, 4])
    alloc = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(10 * GiB, {2048: 6}), NumaMask([0, 1]))
    assert alloc.group == NumaMask([0, 1])
    assert alloc.amounts == (
        (0, HP2M, 8 * MiB), (0, MEMORY, 8 * GiB - 8 * MiB),
        (1, HP2M, 4 * MiB), (1, MEMORY, 10 * GiB - (8 * GiB - 8 * MiB)))
    assert alloc.total(MEMORY) == 10 * GiB and alloc.bytes_on(1, HP2M) == 4 * MiB


def test_without_affinity_takes_the_narrowest_fitting_mask():
    _, cap = machine([4, 8, 8])
    assert allocate_memory(cap, EMPTY_USAGE, MemoryRequest(6 * GiB), None).group == NumaMask([1])
    assert allocate_memory(cap, EMPTY_USAGE, MemoryRequest(10 * GiB), None).group == NumaMask([0, 1])
    assert allocate_memory(cap, EMPTY_USAGE, MemoryRequest(13 * GiB), None).group == NumaMask([1, 2])


def test_without_affinity_reuses_a_group_when_it_is_narrowest():
    _, cap = machine([4, 4, 4])
    group = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(6 * GiB), None)
    assert group.group == NumaMask([0, 1])
    # 4 GiB: node 2 alone is narrower than the group.
    usage = usage_from([group])
    assert allocate_memory(cap, usage, MemoryRequest(4 * GiB), None).group == NumaMask([2])
    usage = usage_with(usage, allocate_memory(cap, usage, MemoryRequest(3 * GiB), None))
    # Node 2 now holds 1 GiB free; the {0,1} group holds 2 GiB free.
    assert allocate_memory(cap, usage, MemoryRequest(2 * GiB), None).group == NumaMask([0, 1])


def test_affinity_that_cannot_hold_the_request_is_extended():
    _, cap = machine([8, 8, 8])
    alloc = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(12 * GiB), NumaMask([1]))
    assert alloc.group == NumaMask([0, 1])  # narrowest mask containing {1}, lowest ids
    group = usage_from([allocate_memory(cap, EMPTY_USAGE, MemoryRequest(GiB), NumaMask([1, 2]))])
    # Node 2 is in group {1,2}: an affinity of {2} extends to the group.
    assert allocate_memory(cap, group, MemoryRequest(GiB), NumaMask([2])).group == NumaMask([1, 2])


def test_affinity_on_a_node_used_alone_cannot_be_extended():
    _, cap = machine([8, 8, 8])
    usage = usage_from([allocate_memory(cap, EMPTY_USAGE, MemoryRequest(6 * GiB), NumaMask([0]))])
    with pytest.raises(MemoryAllocationError) as err:
        allocate_memory(cap, usage, MemoryRequest(4 * GiB), NumaMask([0]))
    assert str(err.value) == (
        "cannot extend NUMA affinity {0} to hold the memory request: no NUMA node set containing "
        "{0} can hold the request under the group rule (groups in use: {0}); memory: requested "
        "4 GiB, node 0 has 2 GiB free, node 1 has 8 GiB free, node 2 has 8 GiB free")


def test_extension_to_a_non_preferred_size_is_refused_when_the_hint_was_preferred():
    _, cap = machine([8, 8, 8])
    usage = usage_from([allocate_memory(cap, EMPTY_USAGE, MemoryRequest(GiB), NumaMask([1, 2]))])
    req = MemoryRequest(4 * GiB)
    assert allocate_memory(cap, usage, req, NumaMask([1])).group == NumaMask([1, 2])
    with pytest.raises(MemoryAllocationError, match=(
            r"NUMA affinity \{1\} cannot hold the memory request and the narrowest mask "
            r"containing it, \{1,2\}, has 2 nodes where a preferred one has 1")):
        allocate_memory(cap, usage, req, NumaMask([1]), require_preferred=True)
    # An extension that keeps the preferred size is fine.
    assert allocate_memory(cap, EMPTY_USAGE, MemoryRequest(9 * GiB), NumaMask([1]),
                           require_preferred=True).group == NumaMask([0, 1])


def test_refusal_without_affinity_names_resource_requested_and_free_per_node():
    _, cap = machine([8, 8], hp2m=[2, 0])
    with pytest.raises(MemoryAllocationError) as err:
        allocate_memory(cap, EMPTY_USAGE, MemoryRequest(GiB, {2048: 3}), None)
    assert str(err.value) == (
        "no NUMA node set can hold the memory request: hugepages-2048kB: requested 6 MiB, "
        "more than the machine can ever hold (node 0 has 4 MiB allocatable, node 1 has 0 B "
        "allocatable); node 0 has 4 MiB free, node 1 has 0 B free")


def test_empty_request_allocates_nothing_and_leaves_no_group():
    _, cap = machine([8])
    alloc = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(), NumaMask([0]))
    assert not alloc.group and alloc.amounts == ()
    assert usage_from([alloc]) == EMPTY_USAGE
    assert memory_hints(cap, EMPTY_USAGE, MemoryRequest(), [0]) == {}


# ------------------------------------------------------------------- usage


def test_release_restores_and_frees_the_group():
    _, cap = machine([8, 8, 8])
    a = allocate_memory(cap, EMPTY_USAGE, MemoryRequest(10 * GiB), None)
    u1 = usage_from([a])
    b = allocate_memory(cap, u1, MemoryRequest(GiB), a.group)
    u2 = usage_with(u1, b)
    assert u2.groups == ((NumaMask([0, 1]), 2),)
    assert usage_without(u2, b) == u1
    assert usage_without(usage_without(u2, b), a) == EMPTY_USAGE
    # Once released, node 0 is offered alone again.
    hints = memory_hints(cap, usage_without(u1, a), MemoryRequest(GiB), [0, 1, 2])
    assert ((0,), True) in listed(hints[MEMORY])


def test_usage_errors():
    g01 = MemoryAllocation(NumaMask([0, 1]), ((0, MEMORY, GiB),))
    g12 = MemoryAllocation(NumaMask([1, 2]), ((1, MEMORY, GiB),))
    with pytest.raises(MemoryAllocationError, match=r"memory group \{1,2\} overlaps group \{0,1\} in use on NUMA node 1"):
        usage_from([g01, g12])
    with pytest.raises(MemoryAllocationError, match=r"cannot release memory on group \{1,2\}: no allocation uses it"):
        usage_without(usage_from([g01]), g12)
    bigger = MemoryAllocation(NumaMask([0, 1]), ((0, MEMORY, 2 * GiB),))
    with pytest.raises(MemoryAllocationError, match="cannot release 2 GiB of memory on NUMA node 0: only 1 GiB are allocated"):
        usage_without(usage_from([g01]), bigger)


def test_usage_from_booked_is_usage_from_of_the_bookings_allocations():
    booked = [((0, 1), {0: {MEMORY: GiB, HP2M: 0}, 1: {HP2M: 2 * MiB}}),
              ((0, 1), {1: {MEMORY: 3 * GiB}}),
              ({2: {}}.keys(), {2: {MEMORY: GiB}}),
              ((3,), {})]
    allocations = [MemoryAllocation(NumaMask(nodes), tuple((n, r, b) for n, per in mem.items() for r, b in per.items()))
                   for nodes, mem in booked]
    assert usage_from_booked(booked) == usage_from(allocations)
    assert usage_from_booked([]) == EMPTY_USAGE
    with pytest.raises(ValueError, match=r"allocation takes memory from node 2, outside its group '0,1'"):
        usage_from_booked([((0, 1), {2: {MEMORY: GiB}})])
    with pytest.raises(ValueError, match="allocation of memory on node 0 is negative"):
        usage_from_booked([((0,), {0: {MEMORY: -1}})])
    with pytest.raises(MemoryAllocationError, match=r"memory group \{1,2\} overlaps group \{0,1\}"):
        usage_from_booked([((0, 1), {0: {MEMORY: GiB}}), ((1, 2), {1: {MEMORY: GiB}})])


def test_allocation_value_checks_and_json_round_trip():
    a = MemoryAllocation(NumaMask([0, 1]), ((1, MEMORY, GiB), (0, HP2M, 2 * MiB), (1, HP2M, 0)))
    assert a.amounts == ((0, HP2M, 2 * MiB), (1, MEMORY, GiB))
    assert MemoryAllocation.from_json(a.to_json()) == a
    with pytest.raises(ValueError, match=r"allocation takes memory from node 2, outside its group '0,1'"):
        MemoryAllocation(NumaMask([0, 1]), ((2, MEMORY, GiB),))
    with pytest.raises(ValueError, match="allocation of memory on node 0 is negative"):
        MemoryAllocation(NumaMask([0]), ((0, MEMORY, -1),))
    with pytest.raises(ValueError, match="not a memory allocation"):
        MemoryAllocation.from_json({"group": [0]})


# -------------------------------------------------------------- properties


def reference_hints(cap, usage, request, nodes):
    """The kubelet's rules written the slow, obvious way: every mask, dicts."""
    amounts = dict(request.amounts())
    group_of = {n: m for m, _ in usage.groups for n in m.nodes()}
    mem = set(cap.node_ids)
    min_size = None
    out = []
    for k in range(1, len(nodes) + 1):
        for combo in combinations(sorted(nodes), k):
            memnodes = [n for n in combo if n in mem]
            if all(sum(cap.allocatable(n, r) for n in memnodes) >= b for r, b in amounts.items()):
                min_size = k if min_size is None else min_size
            if any(n in group_of and group_of[n].nodes() != tuple(memnodes) for n in memnodes):
                continue
            if all(sum(free_bytes(cap, usage, n, r) for n in memnodes) >= b for r, b in amounts.items()):
                out.append(combo)
    if min_size is None:
        return []
    return [TopologyHint(NumaMask(c), len(c) == min_size) for c in out]


node_gib = st.lists(st.sampled_from([0, 2, 4, 8]), min_size=1, max_size=5).filter(any)
pages = st.lists(st.integers(0, 4), min_size=5, max_size=5)


@st.composite
def scenario(draw):
    mem = draw(node_gib)
    hp = draw(pages)[: len(mem)]
    hp = [h if m else 0 for h, m in zip(hp, mem, strict=True)]
    _, cap = machine(mem, hp2m=hp)
    ops = draw(st.lists(st.tuples(
        st.integers(0, 24).map(lambda half_gib: half_gib * GiB // 2) | st.integers(0, 12 * GiB),
        st.integers(0, 5),
        st.none() | st.sets(st.integers(0, len(mem) - 1), min_size=1),
        st.booleans()), max_size=8))
    return mem, cap, ops


def _release_oldest(usage, live):
    """Release the oldest live allocation; the fold and its inverse agree."""
    victim = live.pop(0)
    before = usage
    usage = usage_without(usage, victim)
    assert usage == usage_from(live)
    assert usage_with(usage, victim) == before
    return usage


def _check_hints_against_reference(hints, expected, nodes):
    for resource, hs in hints.items():
        assert hs.hints() == expected, resource
        if hs.contains_fit is not None:  # the merge's shortcut agrees with enumeration
            for k in range(1, len(nodes) + 1):
                for combo in combinations(nodes, k):
                    x = NumaMask(combo)
                    assert hs.contains_fit(x) == any(x.issubset(h.mask) for h in expected), x


def _kubelet_choice(expected, mask):
    """The kubelet's group: the affinity if it is a hint, else the narrowest
    hint containing it (no affinity: containing nothing); None if none does."""
    around = mask or NumaMask()
    fitting = sorted((h.mask for h in expected if around.issubset(h.mask)), key=NumaMask.sort_key)
    return (mask if mask in fitting else fitting[0]) if fitting else None


def _check_allocation(cap, usage, req, mask, alloc, expected, want):
    if req:
        assert alloc.group == want & cap.memory_nodes
    if mask is None and req:
        assert memory_refusal_reason(cap, usage, req) is None
        # Without affinity the group is the narrowest hint.
        best = min((h.mask for h in expected), key=NumaMask.sort_key)
        assert alloc.group == NumaMask(n for n in best.nodes() if n in cap.memory_nodes)
    for resource, need in req.amounts():
        assert alloc.total(resource) == need
    for n, r, b in alloc.amounts:
        assert b <= free_bytes(cap, usage, n, r)  # never more than free


@settings(max_examples=60, deadline=None)
@given(scenario())
def test_property_hints_match_reference_and_allocations_stay_within_free(case):
    mem, cap, ops = case
    nodes = list(range(len(mem)))
    live = []
    usage = EMPTY_USAGE
    for mem_bytes, hp_count, affinity, release_first in ops:
        if release_first and live:
            usage = _release_oldest(usage, live)
        req = MemoryRequest(mem_bytes, {2048: hp_count})
        hints = memory_hints(cap, usage, req, nodes)
        expected = reference_hints(cap, usage, req, nodes) if req else None
        _check_hints_against_reference(hints, expected, nodes)
        mask = None if affinity is None else NumaMask(affinity)
        want = _kubelet_choice(expected, mask) if req else None
        try:
            alloc = allocate_memory(cap, usage, req, mask)
        except MemoryAllocationError:
            assert want is None
            if mask is None:
                assert memory_refusal_reason(cap, usage, req) is not None
            continue
        _check_allocation(cap, usage, req, mask, alloc, expected, want)
        usage = usage_with(usage, alloc)
        live.append(alloc)
        for n in cap.node_ids:
            for r in cap.resources:
                assert usage.allocated_bytes(n, r) <= cap.allocatable(n, r)
    for alloc in reversed(list(live)):
        usage = usage_without(usage, alloc)
    assert usage == EMPTY_USAGE


def test_search_budget_degrades_to_a_wider_mask_never_to_one_that_does_not_fit(monkeypatch):
    import numa_agent.admission.memory_manager as mm

    _, cap = machine([3, 5, 7, 2, 6, 4], hp2m=[0, 512, 0, 512, 0, 512])
    req = MemoryRequest(14 * GiB, {2048: 700})
    exact = allocate_memory(cap, EMPTY_USAGE, req, None)
    exact_size = memory_hints(cap, EMPTY_USAGE, req, range(6))[MEMORY].min_size
    monkeypatch.setattr(mm._Pool, "STEP_BUDGET", 3)
    rough = allocate_memory(cap, EMPTY_USAGE, req, None)
    rough_hints = memory_hints(cap, EMPTY_USAGE, req, range(6))[MEMORY]
    assert exact_size <= rough_hints.min_size < 6
    assert any(h.preferred for h in rough_hints.hints())
    assert rough.group.count() >= exact.group.count()
    for resource, need in req.amounts():
        assert rough.total(resource) == need
    for n, r, b in rough.amounts:
        assert b <= free_bytes(cap, EMPTY_USAGE, n, r)


def test_hugepage_size_kb_is_the_inverse_of_hugepages_resource():
    from numa_agent.admission.memory_manager import hugepage_size_kb

    for size_kb in (64, 2048, 1048576):
        assert hugepage_size_kb(hugepages_resource(size_kb)) == size_kb
    for other in ("memory", "hugepages-", "hugepages-kB", "hugepages-2Mi", "hugepages-20x8kB", "hugepages-2048KB"):
        assert hugepage_size_kb(other) is None
