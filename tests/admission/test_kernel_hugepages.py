"""Free hugepages at admission: the kernel's counters (free_hugepages,
resv_hugepages) cut what the bookings leave free, steer the memory hints to
nodes that have the pages, and a request refused only because of them is
refused naming the node, the page size and the shortfall."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.admission.admit import Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.memory_manager import (
    HugepagesShort,
    KernelHugepages,
    MemoryRequest,
    MemoryUsage,
    allocate_memory,
    hugepages_resource,
    hugepages_short,
    kernel_available,
    memory_hints,
    usage_from_booked,
)
from numa_agent.admission.view import AdmissionView
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

MiB = 1 << 20
HP2M = hugepages_resource(2048)
PAGE = 2 * MiB


def machine(policy="best-effort", pages=64, nodes=2):
    topo = make_topology(sockets=nodes, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30,
                         hugepages_2m_per_node=pages)
    return build_machine(topo, PolicyConfig(topology_policy=policy))


def req(name, **kw):
    res = {k: kw.pop(k) for k in ("cpus", "memory_bytes", "hugepages") if k in kw}
    return Request(name=name, owner_uid=1000, pid=4242, resources=Resources(**res), **kw)


def kernel(free, reserved=0, in_use=None):
    """Free 2 MiB pages per node ({node: pages})."""
    return KernelHugepages(free=tuple((n, 2048, p) for n, p in free.items()),
                           reserved=((2048, reserved),) if reserved else (),
                           in_use=None if in_use is None else tuple((n, 2048, b) for n, b in in_use.items()))


# ---- the rule, with figures


def test_available_is_free_less_reserved_less_booked_pages_not_known_in_use():
    usage = usage_from_booked([((0,), {0: {HP2M: 4 * PAGE}})])
    # 10 free, 1 reserved for the machine, 4 booked on node 0 and not known used: 5 left.
    assert kernel_available(kernel({0: 10, 1: 10}, reserved=1), usage) == {(0, HP2M): 5 * PAGE,
                                                                           (1, HP2M): 9 * PAGE}
    # 3 of the 4 known in use (faulted in or reserved): only 1 still held back.
    assert kernel_available(kernel({0: 10}, in_use={0: 3 * PAGE}), usage) == {(0, HP2M): 9 * PAGE}
    # Never below nothing.
    assert kernel_available(kernel({0: 2}, reserved=5), usage) == {(0, HP2M): 0}


def test_a_node_whose_counter_was_not_read_is_not_limited():
    m = machine(pages=8)
    hints = memory_hints(m.memory, MemoryUsage(), MemoryRequest(hugepages={2048: 8}), (0, 1), kernel({1: 0}))
    assert [(h.mask.nodes(), h.preferred) for h in hints[HP2M].hints() if h.mask.count() == 1] == [((0,), True)]


def test_shortfall_reads_like_the_kubelet():
    short = hugepages_short(kernel({1: 2}), MemoryUsage(), [(1, HP2M, 4 * PAGE), (0, HP2M, 4 * PAGE)])
    assert short == (HugepagesShort(node=1, size_kb=2048, free_pages=2, requested_pages=4),)
    assert short[0].text() == "node 1: 2 free 2 MiB hugepages, 4 requested; 2 more needed"


def test_hints_prefer_the_node_that_has_the_pages():
    m = machine(pages=8)
    request = MemoryRequest(hugepages={2048: 4})
    plain = memory_hints(m.memory, MemoryUsage(), request, (0, 1))[HP2M]
    cut = memory_hints(m.memory, MemoryUsage(), request, (0, 1), kernel({0: 1, 1: 8}))[HP2M]
    one_node = [h.mask.nodes() for h in plain.hints() if h.preferred]
    assert one_node == [(0,), (1,)]
    assert [h.mask.nodes() for h in cut.hints() if h.preferred] == [(1,)]
    # And the allocation, given no affinity, takes them there.
    alloc = allocate_memory(m.memory, MemoryUsage(), request, None, kernel=kernel({0: 1, 1: 8}))
    assert alloc.amounts == ((1, HP2M, 4 * PAGE),)


# ---- decide


def test_pages_there_change_nothing():
    m = machine(pages=64)
    r = req("db", cpus=2, hugepages={2048: 16})
    plain = decide(m, AgentState(), r)
    counted = decide(m, AgentState(), r, kernel=kernel({0: 64, 1: 64}))
    assert counted.workload.booking == plain.workload.booking


def test_best_effort_moves_to_the_node_with_free_pages():
    m = machine(pages=64)
    d = decide(m, AgentState(), req("db", cpus=2, hugepages={2048: 16}), kernel=kernel({0: 3, 1: 64}))
    assert d.workload.booking.memory == {1: {HP2M: 16 * PAGE}}
    assert d.workload.booking.numa_nodes == (1,)


@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_a_request_the_bookings_would_admit_is_refused_naming_node_and_shortfall(policy):
    m = machine(policy, pages=8)
    with pytest.raises(Refusal) as refused:
        decide(m, AgentState(), req("db", cpus=2, hugepages={2048: 4}), kernel=kernel({0: 2, 1: 1}))
    err = refused.value
    assert err.code == "hugepages_not_free" and err.provider == "memory"
    assert err.message.startswith("node 0: 2 free 2 MiB hugepages, 4 requested; 2 more needed")
    assert err.explanation["hugepages_short"] == [
        {"node": 0, "page_size_bytes": PAGE, "free_pages": 2, "requested_pages": 4, "missing_pages": 2}]
    assert err.explanation["admit"] is False and err.explanation["reason"] == err.message


def test_a_request_no_booking_could_hold_keeps_its_own_reason():
    m = machine(pages=8)
    with pytest.raises(Refusal) as refused:
        decide(m, AgentState(), req("db", hugepages={2048: 40}), kernel=kernel({0: 0, 1: 0}))
    assert refused.value.code != "hugepages_not_free"


def test_pages_booked_by_a_live_workload_are_held_back_until_known_in_use():
    m = machine("single-numa-node", pages=8)
    first = decide(m, AgentState(), req("a", hugepages={2048: 4}), kernel=kernel({0: 8, 1: 8}))
    (node,) = first.workload.booking.memory
    other = 1 - node
    # Workload a has not faulted its 4 pages in: the kernel still counts all 8 free.
    # An outsider then took the other node's pages: nothing is left for a second 4.
    with pytest.raises(Refusal) as refused:
        decide(m, first.state, req("b", hugepages={2048: 8}), kernel=kernel({node: 8, other: 0}))
    assert refused.value.code == "hugepages_not_free"
    second = decide(m, first.state, req("b", hugepages={2048: 4}),
                    kernel=kernel({node: 8, other: 0}))
    assert second.workload.booking.memory == {node: {HP2M: 4 * PAGE}}
    # With a's pages known in use (gone from free), 4 are still free on its node.
    decide(m, first.state, req("b", hugepages={2048: 4}),
           kernel=kernel({node: 4, other: 0}, in_use={node: 4 * PAGE}))
    with pytest.raises(Refusal):  # not known: counted as still to come out of free
        decide(m, first.state, req("b", hugepages={2048: 4}), kernel=kernel({node: 4, other: 0}))


def test_a_pod_budget_is_checked_too():
    m = machine(pages=8)
    with pytest.raises(Refusal) as refused:
        decide(m, AgentState(), req("p-main", pod="p", pod_budget=Resources(cpus=2, hugepages={2048: 4})),
               kernel=kernel({0: 0, 1: 0}))
    assert refused.value.code == "hugepages_not_free"


def test_the_explanation_shows_what_the_kernel_leaves():
    m = machine(pages=8)
    view = AdmissionView(m, AgentState(), kernel=kernel({0: 3}))
    assert view.free["0"]["hugepages_bytes"]["2048"] == 3 * PAGE
    assert view.free["1"]["hugepages_bytes"]["2048"] == 8 * PAGE


@settings(max_examples=150, deadline=None)
@given(policy=st.sampled_from(["none", "best-effort", "restricted", "single-numa-node"]),
       free=st.tuples(st.integers(0, 16), st.integers(0, 16)), reserved=st.integers(0, 4),
       asks=st.lists(st.integers(1, 12), min_size=1, max_size=5))
def test_never_admits_more_than_the_kernel_leaves(policy, free, reserved, asks):
    m = machine(policy, pages=16)
    state = AgentState()
    counters = kernel({0: free[0], 1: free[1]}, reserved=reserved)
    for i, pages in enumerate(asks):
        try:
            state = decide(m, state, req(f"w{i}", hugepages={2048: pages}), kernel=counters).state
        except Refusal:
            continue
        # Every live booking's pages, on each node, fit what the kernel said was free there
        # (the same counters throughout: none of the bookings has used its pages yet).
        for n in (0, 1):
            booked = sum(w.booking.memory.get(n, {}).get(HP2M, 0) for w in state.workloads)
            assert booked <= max(0, free[n] - reserved) * PAGE


def test_no_counters_no_change_on_any_policy():
    for policy in ("none", "best-effort", "restricted", "single-numa-node"):
        m = machine(policy, pages=8)
        d = decide(m, AgentState(), req("x", cpus=2, hugepages={2048: 4}))
        assert d.workload.booking.memory


def test_hugepage_pools_name_only_what_the_request_asks_for():
    m = machine(pages=8)
    assert m.hugepage_pools(()) == ()
    assert m.hugepage_pools((2048,)) == ((0, 2048), (1, 2048))
    assert m.hugepage_pools((1048576,)) == ()  # the size exists, no pages: nothing to read
