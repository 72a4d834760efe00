"""A node's memory changing under live bookings (memory blocks offlined or
unplugged, a balloon, a hugepage pool resized): pure admission and accounting
on the machine rebuilt from the new figures, as the hotplug path rebuilds it.

Bookings are never cut (the kernel keeps the workload's pages); a node short
of what is booked on it is reported and takes no new admission until it fits
again, so nothing is ever booked twice over."""

import pytest

from numa_agent.admission.accounting import node_accounting
from numa_agent.admission.admit import Refusal, Request, Resources, decide, release
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.memory_manager import MemoryCapacity, shortfalls, usage_from_booked
from numa_agent.admission.view import allocatable_cpus, fenced_nodes
from numa_agent.core.cpuset import CpuSet
from numa_agent.hotplug.rebase import rebase_state
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology, with_node_memory

GiB = 1 << 30


def topology(node1_bytes=8 * GiB, hugepages_2m=0):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=8 * GiB, hugepages_2m_per_node=hugepages_2m)
    return with_node_memory(topo, 1, node1_bytes)


def machine(topo, **policy):
    return build_machine(topo, PolicyConfig(**policy))


def req(name, **kw):
    res = {k: kw.pop(k) for k in ("cpus", "memory_bytes", "hugepages") if k in kw}
    return Request(name=name, owner_uid=1000, pid=4242, resources=Resources(**res), **kw)


def booked_on_node1(m):
    """A state with 6 GiB booked on node 1 (CPUs there too)."""
    d = decide(m, AgentState(), req("big", cpus=2, memory_bytes=6 * GiB, cpunodebind=(1,), membind=(1,)))
    assert d.workload.booking.memory == {1: {"memory": 6 * GiB}}
    return d.state


def test_capacity_follows_the_node_memory_both_ways():
    small = machine(topology(4 * GiB), topology_policy="single-numa-node")
    grown = machine(topology(12 * GiB), topology_policy="single-numa-node")
    assert small.memory.allocatable(1, "memory") == 4 * GiB
    assert grown.memory.allocatable(1, "memory") == 12 * GiB
    # 10 GiB on one node fits only once the node grew
    with pytest.raises(Refusal):
        decide(small, AgentState(), req("w", memory_bytes=10 * GiB))
    assert decide(grown, AgentState(), req("w", memory_bytes=10 * GiB)).workload.booking.memory \
        == {1: {"memory": 10 * GiB}}


def test_shortfalls_name_node_resource_booked_and_allocatable():
    capacity = MemoryCapacity.from_topology(topology(4 * GiB))
    usage = usage_from_booked([((1,), {1: {"memory": 6 * GiB}}), ((0,), {0: {"memory": GiB}})])
    assert shortfalls(capacity, usage) == ((1, "memory", 6 * GiB, 4 * GiB),)
    assert shortfalls(MemoryCapacity.from_topology(topology()), usage) == ()


def test_a_node_shrunk_below_its_bookings_is_fenced_reported_and_keeps_them():
    state = booked_on_node1(machine(topology()))
    shrunk = machine(topology(4 * GiB))
    rebased, lost = rebase_state(shrunk, state)
    # nothing is cut from the booking: the pages are the workload's
    assert lost == [] and rebased.workload("big").booking.memory == {1: {"memory": 6 * GiB}}
    assert fenced_nodes(shrunk, rebased) == (1,)
    acc = {n["id"]: n for n in node_accounting(shrunk, rebased)}
    assert acc[1]["memory_bytes"] == {"capacity": 4 * GiB, "reserved": 0, "allocated": 6 * GiB, "free": 0}
    assert acc[1]["memory_short"] == [{"resource": "memory", "booked_bytes": 6 * GiB,
                                       "allocatable_bytes": 4 * GiB}]
    assert acc[0]["memory_short"] == []
    # its CPUs cannot become exclusive meanwhile
    assert allocatable_cpus(shrunk, rebased).isdisjoint(shrunk.cpus_of_nodes((1,)))


@pytest.mark.parametrize("ask", [
    {"cpus": 2, "cpunodebind": (1,)},
    {"memory_bytes": GiB, "membind": (1,)},
    {"shared": True, "cpunodebind": (1,)},
])
def test_a_fenced_node_refuses_what_names_it(ask):
    state = booked_on_node1(machine(topology()))
    shrunk = machine(topology(4 * GiB))
    with pytest.raises(Refusal) as err:
        decide(shrunk, state, req("new", **ask))
    assert err.value.code == "numa_node_memory_short"
    assert ("NUMA node(s) 1 take no new admission: more memory is booked there than they have now "
            "(node 1 memory: 6 GiB booked, 4 GiB allocatable)") in err.value.message
    assert err.value.explanation["fenced_nodes"] == [1]


def test_physcpubind_on_a_fenced_node_is_refused_with_the_reason():
    state = booked_on_node1(machine(topology()))
    shrunk = machine(topology(4 * GiB))
    node1_cpu = shrunk.cpus_of_nodes((1,)).max()
    with pytest.raises(Refusal, match="take no new admission") as err:
        decide(shrunk, state, req("pinned", physcpubind=CpuSet([node1_cpu])))
    assert err.value.code == "numa_node_memory_short"


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
def test_new_admissions_go_to_the_other_node_while_one_is_fenced(policy):
    state = booked_on_node1(machine(topology(), topology_policy=policy))
    shrunk = machine(topology(4 * GiB), topology_policy=policy)
    d = decide(shrunk, state, req("elsewhere", cpus=4, memory_bytes=2 * GiB))
    assert set(d.workload.booking.numa_nodes) == {0}
    assert d.workload.booking.memory == {0: {"memory": 2 * GiB}}
    # a plain shared workload books nothing on a node: admitted
    assert decide(shrunk, state, req("shared", shared=True)).workload.shared


def test_a_refusal_while_fenced_says_the_fence_may_be_why():
    state = booked_on_node1(machine(topology()))
    shrunk = machine(topology(4 * GiB))
    with pytest.raises(Refusal) as err:  # 10 GiB: node 0 has 8, node 1 is fenced
        decide(shrunk, state, req("huge", memory_bytes=10 * GiB))
    assert "take no new admission" in err.value.message


def test_the_fence_lifts_when_memory_comes_back_or_the_booking_leaves():
    state = booked_on_node1(machine(topology()))
    shrunk = machine(topology(4 * GiB))
    assert fenced_nodes(shrunk, state) == (1,)
    back = machine(topology(8 * GiB))
    assert fenced_nodes(back, state) == ()
    assert decide(back, state, req("again", cpus=2, cpunodebind=(1,))).workload.booking.cpus
    released, _, _ = release(state, "big")
    assert fenced_nodes(shrunk, released) == ()
    assert decide(shrunk, released, req("after", memory_bytes=3 * GiB, membind=(1,))).workload.booking.memory \
        == {1: {"memory": 3 * GiB}}


def test_a_hugepage_pool_shrunk_under_its_bookings_fences_the_node():
    grown = machine(topology(hugepages_2m=512))
    d = decide(grown, AgentState(), req("hp", cpus=2, hugepages={2048: 400}, cpunodebind=(1,)))
    node = d.workload.booking.numa_nodes[0]
    fewer = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 * GiB,
                          hugepages_2m_per_node=256)
    shrunk = machine(fewer)
    assert fenced_nodes(shrunk, d.state) == (node,)
    acc = {n["id"]: n for n in node_accounting(shrunk, d.state)}
    assert acc[node]["memory_short"] == [{"resource": "hugepages-2048kB", "booked_bytes": 400 << 21,
                                          "allocatable_bytes": 256 << 21}]
