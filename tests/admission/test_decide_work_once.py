"""What one admission derives from the machine and the state is derived once:
per decide(), per state value or per machine, not once per provider step
that reads it. Counted with spies on the functions that do the work."""

from __future__ import annotations

import pytest

import numa_agent.admission.memory_manager as mm
from numa_agent.admission.admit import Request, Resources, decide, release
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.memory_manager import MEMORY, MemoryRequest, hugepages_resource, memory_hints
from numa_agent.admission.view import memory_usage
from numa_agent.core.hints import NumaMask
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

GIB = 1 << 30


def machine(nodes: int = 4, policy: str = "best-effort"):
    topo = make_topology(sockets=1, nodes_per_socket=nodes, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=16 * GIB, hugepages_2m_per_node=512)
    return build_machine(topo, PolicyConfig(topology_policy=policy,
                                            topology_options={"max-allowable-numa-nodes": "64"}))


def counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("policy,gib", [("best-effort", 20), ("single-numa-node", 8)])
def test_one_admission_builds_the_memory_node_vectors_once(monkeypatch, policy, gib):
    m = machine(policy=policy)
    built = counting(monkeypatch, mm, "_build_node_vectors")
    d = decide(m, AgentState(), Request("a", 0, Resources(cpus=2, memory_bytes=gib * GIB,
                                                          hugepages={2048: 64})))
    assert len(built) == 1
    assert d.workload.booking.memory_total(MEMORY) == gib * GIB
    # The next admission reads a state derived from the first one: its
    # vectors are the ancestor's with the one booking's nodes updated.
    after = decide(m, d.state, Request("b", 0, Resources(cpus=2, memory_bytes=GIB, hugepages={2048: 8})))
    assert len(built) == 1
    assert after.workload.booking.memory_total(MEMORY) == GIB
    # Other resources asked together, or a state not derived from those:
    # vectors of their own.
    decide(m, after.state, Request("c", 0, Resources(memory_bytes=GIB)))
    assert len(built) == 2
    decide(m, AgentState(), Request("c", 0, Resources(memory_bytes=GIB, hugepages={2048: 8})))
    assert len(built) == 3


@pytest.mark.parametrize("seed", range(4))
def test_node_vectors_carried_through_usage_updates_equal_a_fresh_build(seed):
    import random

    rng = random.Random(seed)
    m = machine(nodes=8)
    cap, hp = m.memory, mm.hugepages_resource(2048)
    resource_sets = ((MEMORY,), (MEMORY, hp), (hp,))
    usage, live = mm.MemoryUsage(), []
    for step in range(40):
        for resources in resource_sets:
            mm._node_vectors(cap, usage, resources)  # kept on this usage, then carried on
        if live and (rng.random() < 0.4 or len(live) > 6):
            usage = mm.usage_without(usage, live.pop(rng.randrange(len(live))))
        else:
            req = MemoryRequest(rng.randint(1, 20) * GIB, {2048: rng.choice((0, 8, 600))})
            try:
                a = mm.allocate_memory(cap, usage, req, None)
            except mm.MemoryAllocationError:
                continue
            usage = mm.usage_with(usage, a)
            live.append(a)
        assert usage == mm.usage_from(live), step
        for resources in resource_sets:
            assert mm._node_vectors(cap, usage, resources) == mm._build_node_vectors(cap, usage, resources), \
                (step, resources)


def spy_from_bits(monkeypatch, value_class) -> list[int]:
    """The bits of every `value_class.from_bits` call from now on, in order."""
    made: list[int] = []
    real = value_class.from_bits.__func__

    def spy(cls, bits):
        made.append(bits)
        return real(cls, bits)

    monkeypatch.setattr(value_class, "from_bits", classmethod(spy))
    return made

def spy_merge_fits(monkeypatch) -> list[int]:
    """The node bits of every fits() the merge asks a provider from now on, in order."""
    from numa_agent.admission import topology_manager as tm

    asked: list[int] = []
    real = tm._Gen.fits

    def spy(self, bits):
        asked.append(bits)
        return real(self, bits)

    monkeypatch.setattr(tm._Gen, "fits", spy)
    return asked

def test_a_usage_update_builds_no_mask_for_the_groups_it_leaves_alone(monkeypatch):
    groups = [mm.MemoryAllocation(NumaMask([n]), ((n, MEMORY, GIB),)) for n in range(32)]
    usage = mm.usage_from(groups)
    one = mm.MemoryAllocation(NumaMask([40, 41]), ((40, MEMORY, GIB), (41, MEMORY, GIB)))
    made = spy_from_bits(monkeypatch, NumaMask)
    more = mm.usage_with(usage, one)
    less = mm.usage_without(more, groups[3])
    assert made == []
    monkeypatch.undo()
    assert more == mm.usage_from([*groups, one])
    assert less == mm.usage_from([*groups[:3], *groups[4:], one])
    assert less.group_of(41) == NumaMask([40, 41]) and less.group_of(3) is None
    assert less.allocated_bytes(3, MEMORY) == 0 and less.allocated_bytes(40, MEMORY) == GIB


def test_node_vectors_kept_on_the_usage_are_the_usages_own():
    m = machine()
    d = decide(m, AgentState(), Request("a", 0, Resources(memory_bytes=12 * GIB)))
    after = decide(m, d.state, Request("b", 0, Resources(memory_bytes=12 * GIB)))
    # The second request could not stay on node 0, which the first one fills.
    assert after.workload.booking.mems != d.workload.booking.mems
    first = d.workload.booking.memory
    assert sum(first[0].values()) == 12 * GIB


def test_the_preferred_size_pool_is_built_once_per_capacity_and_node_set(monkeypatch):
    m = machine(nodes=8)
    shapes = counting(monkeypatch, mm, "_PoolShape")
    cap, usage = m.memory, mm.MemoryUsage()
    sizes = []
    for gib in (4, 20, 40, 100):
        hints = memory_hints(cap, usage, MemoryRequest(gib * GIB), range(8))
        sizes.append(hints[MEMORY].min_size)
    assert len(shapes) == 1
    # 16 GiB less the 1 GiB hugepage pool per node: 15 GiB of memory each.
    assert sizes == [1, 2, 3, 7]
    memory_hints(cap, usage, MemoryRequest(4 * GIB), range(4))  # another node set
    memory_hints(cap, usage, MemoryRequest(4 * GIB, {2048: 8}), range(8))  # other resources
    assert len(shapes) == 3


def test_preferred_size_without_a_search_equals_the_searched_one():
    """One resource, or nodes all alike: the bound is the answer. Nodes
    unlike each other with two resources still search, and agree."""
    m = machine(nodes=8)
    hp = hugepages_resource(2048)
    for gib, pages in ((4, 0), (20, 0), (20, 600), (4, 1500), (100, 4000)):
        req = MemoryRequest(gib * GIB, {2048: pages})
        state = mm._State(m.memory, mm.MemoryUsage(), req, m.memory.memory_nodes.bits)
        searched = mm._Pool(mm._PoolShape(tuple(state.allocatable.items()), state.width))
        searched._uniform = False  # force the search
        assert state.min_size() == searched.fewest(state.need), (gib, pages, hp)


def test_shortfalls_are_found_once_per_usage_and_capacity():
    m = machine()
    d = decide(m, AgentState(), Request("a", 0, Resources(memory_bytes=12 * GIB)))
    usage = memory_usage(d.state)
    first = mm.shortfalls(m.memory, usage)
    assert first == () and mm.shortfalls(m.memory, usage) is first
    # Node 0 shrank under its booking: another capacity, its own answer.
    shrunk = mm.MemoryCapacity(tuple((n, r, mm.ResourceCapacity(c.total // 2 if n == 0 else c.total, c.reserved))
                                     for n, r, c in m.memory.entries))
    assert mm.shortfalls(shrunk, usage) == ((0, MEMORY, 12 * GIB, shrunk.allocatable(0, MEMORY)),)
    assert mm.shortfalls(m.memory, usage) == ()


def _provider_hint_sets(m, state, resources):
    from numa_agent.admission.registry import PROVIDERS
    from numa_agent.admission.view import AdmissionView

    view = AdmissionView(m, state)
    request = Request("probe", 0, resources)
    for provider in PROVIDERS:
        for resource, hs in (provider.hints(request, view) or {}).items():
            if hs.kind == "generated":
                yield provider.name, resource, hs


@pytest.mark.parametrize("seed", range(6))
def test_fits_alone_answers_as_fits_on_every_single_node(seed):
    import random

    from tests.support.synthetic import make_topology as topology

    rng = random.Random(seed)
    gpu = ("0x030200", "0x10de", "0x20b0", "nvidia")
    topo = topology(sockets=2, nodes_per_socket=3, cores_per_node=4, threads_per_core=2,
                    memory_per_node_bytes=8 * GIB, hugepages_2m_per_node=256,
                    devices=[(*gpu[:3], n, gpu[3]) for n in (0, 0, 2, 3, 5)])
    m = build_machine(topo, PolicyConfig(devices={"gpu": {"vendor": "0x10de"}}))
    state, seen = AgentState(), set()
    for i in range(40):
        res = Resources(cpus=rng.choice((1, 2, 6, 10)), memory_bytes=rng.choice((0, GIB, 5 * GIB, 12 * GIB)),
                        hugepages=rng.choice(({}, {2048: 100}, {2048: 300})),
                        devices=rng.choice(({}, {"gpu": 1}, {"gpu": 2})))
        for name, resource, hs in _provider_hint_sets(m, state, res):
            assert hs.fits_alone is not None, (name, resource)
            one_by_one = sum(1 << n for n in hs.nodes.nodes() if hs.fits(NumaMask([n])))
            assert hs.fits_alone() == one_by_one, (name, resource, res)
            seen.add(name)
        try:
            state = decide(m, state, Request(f"w{i}", 0, res)).state
        except Exception:
            pass
    assert seen == {"cpu", "memory", "devices"}


def test_single_numa_node_merge_asks_no_single_node_fits_when_answered_at_once(monkeypatch):

    m = machine(nodes=8, policy="single-numa-node")
    asked = spy_merge_fits(monkeypatch)
    d = decide(m, AgentState(), Request("a", 0, Resources(cpus=4, memory_bytes=4 * GIB)))
    assert d.workload.booking.numa_nodes == (0,)
    assert [b for b in asked if b.bit_count() == 1] == []


def spy_orderings(monkeypatch, method: str) -> list[int]:
    """How many CPUs the take still needed at each call of the accumulator's
    ordering `method` from now on, in order."""
    from numa_agent.admission import cpu_take

    needed: list[int] = []
    real = getattr(cpu_take._Accumulator, method)

    def spy(self):
        needed.append(self.needed)
        return real(self)

    monkeypatch.setattr(cpu_take._Accumulator, method, spy)
    return needed


def test_a_request_smaller_than_any_node_orders_no_node_for_taking_it_whole(monkeypatch):
    from numa_agent.admission import cpu_take
    from numa_agent.admission.cpu_topology import CpuTopology
    from numa_agent.core.cpuset import CpuSet

    topo = CpuTopology.from_topology(make_topology(sockets=2, nodes_per_socket=2, cores_per_node=4))
    orderings = spy_orderings(monkeypatch, "sorted_sockets")
    taken = cpu_take.take_by_topology(topo, topo.all_cpus - CpuSet([0]), 4)
    # Only the whole-core step orders the sockets (nodes: 8 CPUs, sockets: 16).
    assert len(orderings) == 1
    assert len(taken) == 4 and taken.issubset(topo.numa_cpus[0] | topo.numa_cpus[1])
    # A request of a whole node still takes it whole.
    assert cpu_take.take_by_topology(topo, topo.all_cpus, 8) == topo.numa_cpus[0]


def test_closest_first_subsets_are_ordered_once_per_machine(monkeypatch):
    import numa_agent.admission.topology_manager as tm

    m = machine(nodes=8)
    assert m.tm_options.prefer_closest_numa_nodes
    enumerated = counting(monkeypatch, tm, "_gosper")
    # More memory than one node holds: the merge walks two-node masks, closest first.
    req = Request("a", 0, Resources(memory_bytes=20 * GIB))
    first = decide(m, AgentState(), req)
    walked = len(enumerated)
    assert walked >= 1 and len(first.workload.booking.mems) == 2
    again = decide(m, AgentState(), req)
    other = decide(m, first.state, Request("b", 0, Resources(memory_bytes=20 * GIB)))
    assert len(enumerated) == walked  # the machine's order, kept
    assert again.workload.booking.mems == first.workload.booking.mems
    assert len(other.workload.booking.mems) == 2
    assert not set(other.workload.booking.mems) & set(first.workload.booking.mems)


def test_the_kept_closest_first_order_is_the_sorted_one():
    m = machine(nodes=8)
    closeness = m.closeness
    assert closeness is not None
    sums = {}
    for universe in (0xFF, 0b10110110, 0b1111):
        for width in range(1, universe.bit_count() + 1):
            nodes = [n for n in range(8) if universe >> n & 1]
            from itertools import combinations

            masks = [sum(1 << n for n in c) for c in combinations(nodes, width)]
            for bits in masks:
                ns = [n for n in range(8) if bits >> n & 1]
                sums[bits] = sum(m.distances[a][b] for a in ns for b in ns)
            want = sorted(masks, key=lambda b: (sums[b], b))
            assert list(closeness.closest_first(universe, width)) == want
            assert list(closeness.closest_first(universe, width)) == want  # kept


def test_cpu_hints_read_no_cpu_set_of_the_topology_per_request(monkeypatch):
    from numa_agent.admission.cpu_manager import cpu_hints
    from numa_agent.core.cpuset import CpuSet

    m = machine(nodes=16)
    topo = m.cpu_topology
    half = CpuSet(c for c in m.usable_cpus if c % 2 == 0)
    cpu_hints(topo, half, 3)  # what the topology keeps, made once
    read = []
    real = CpuSet.bits

    monkeypatch.setattr(CpuSet, "bits", property(lambda s: read.append(s) or real.fget(s)))
    hints = cpu_hints(topo, half, 3)
    with_reusable = cpu_hints(topo, half, 3, reusable=CpuSet([1]))
    # The request's own sets only (available, reusable), not one per node.
    assert len(read) <= 4
    monkeypatch.undo()
    assert hints.fits_alone() == m.memory.memory_nodes.bits  # every node has 4 free CPUs
    assert with_reusable.fits_alone() == 1  # CPU 1 is on node 0: only node 0 holds it


@pytest.mark.parametrize("seed", range(5))
def test_single_numa_node_merge_sets_no_states_and_agrees_with_the_general_one(monkeypatch, seed):
    import random

    import numa_agent.admission.topology_manager as tm

    rng = random.Random(seed)
    all_bits = (1 << 8) - 1
    cases = []
    for _ in range(200):
        lists = []
        for _ in range(rng.randint(1, 4)):
            hints = [(1 << n, True) for n in rng.sample(range(9), rng.randint(0, 4))]  # node 8: outside
            if rng.random() < 0.4:
                hints.append((None, True))
            rng.shuffle(hints)
            lists.append(tuple(hints))
        cases.append(lists)
    tie = (lambda bits: -bits) if seed % 2 else None
    order = tm._Order(False, None, all_bits, tie)
    want = [tm._merge_finite(lists, all_bits, order) for lists in cases]
    merged = counting(monkeypatch, tm, "_merge_finite")
    got = [tm._merge_single_nodes(lists, all_bits, order) for lists in cases]
    assert merged == []
    assert got == want
    # Not of that form (a wider or a non-preferred hint): the general merge.
    assert tm._merge_single_nodes([((0b11, True),), ((0b1, True),)], all_bits, order) == (0b1, False)
    assert len(merged) == 1


def test_single_numa_node_admission_merges_without_the_state_sets(monkeypatch):
    import numa_agent.admission.topology_manager as tm

    m = machine(nodes=8, policy="single-numa-node")
    merged = counting(monkeypatch, tm, "_merge_finite")
    d = decide(m, AgentState(), Request("a", 0, Resources(cpus=4, memory_bytes=2 * GIB)))
    assert merged == []
    assert len(d.workload.booking.mems) == 1


def test_an_admission_makes_no_mask_of_the_machines_node_lists(monkeypatch):
    m = machine(nodes=8)
    seen = []
    real = NumaMask.__init__

    def spy(self, nodes=()):
        nodes = tuple(nodes)
        seen.append(nodes)
        real(self, nodes)

    monkeypatch.setattr(NumaMask, "__init__", spy)
    for policy in ("best-effort", "single-numa-node"):
        mp = machine(nodes=8, policy=policy)
        # made once per machine (and topology)
        assert mp.node_mask and mp.ordinary_node_mask and mp.cpu_topology.numa_mask
        seen.clear()
        d = decide(mp, AgentState(), Request("a", 0, Resources(cpus=4, memory_bytes=2 * GIB)))
        assert len(d.workload.booking.mems) == 1
        assert m.node_ids not in seen and m.ordinary_node_ids not in seen, policy


def test_taking_single_threads_makes_no_cpu_set_per_core(monkeypatch):
    from numa_agent.admission import cpu_take
    from numa_agent.admission.cpu_topology import CpuTopology
    from numa_agent.core.cpuset import CpuSet

    topo = CpuTopology.from_topology(make_topology(sockets=1, nodes_per_socket=2, cores_per_node=8,
                                                   threads_per_core=2))
    # One thread of every core is busy: no core is whole, the request is met thread by thread.
    available = topo.all_cpus - CpuSet(min(topo.core_cpus[c]) for c in topo.core_ids)
    unspied = cpu_take.take_by_topology(topo, available, 5)
    first_node = available & topo.numa_cpus[0]
    made = spy_from_bits(monkeypatch, CpuSet)
    taken = cpu_take.take_by_topology(topo, available, 5)
    assert taken == unspied and len(taken) == 5 and taken.issubset(first_node)
    assert made == [taken.bits]  # the result only


@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
def test_the_preferred_merge_reads_one_node_fits_at_once(monkeypatch, policy):

    m = machine(nodes=8, policy=policy)
    # Nodes 0-2 lose most of their memory: the closest-first walk passes them.
    state = AgentState()
    for i, node in enumerate((0, 1, 2)):
        state = decide(m, state, Request(f"fill{i}", 0, Resources(memory_bytes=14 * GIB),
                                         membind=(node,))).state
    asked = spy_merge_fits(monkeypatch)
    d = decide(m, state, Request("a", 0, Resources(cpus=4, memory_bytes=4 * GIB)))
    assert len(d.workload.booking.numa_nodes) == 1
    assert d.workload.booking.numa_nodes[0] not in (0, 1, 2)
    assert d.explanation["merged"]["preferred"] is True
    assert [b for b in asked if b.bit_count() == 1] == []


def test_a_usage_update_remakes_no_vectors_it_is_not_asked_for():
    from numa_agent.admission.memory_manager import MemoryAllocation, usage_with

    m = machine()
    hugepages = hugepages_resource(2048)
    usage = memory_usage(decide(m, AgentState(), Request("a", 0, Resources(memory_bytes=GIB))).state)
    # Vectors for two resource sets, kept on the usage by reading them.
    mm._node_vectors(m.memory, usage, (MEMORY,))
    before = mm._node_vectors(m.memory, usage, (hugepages,))
    after = usage_with(usage, MemoryAllocation(NumaMask([1]), ((1, MEMORY, 3 * GIB),)))
    # Handed on as they were until read: no free vector made per update.
    assert after._derived[(hugepages,)][1] is before
    # Read, they agree with vectors built afresh; a node no update named is shared.
    for resources in ((MEMORY,), (hugepages,)):
        read = mm._node_vectors(m.memory, after, resources)
        assert read == mm._build_node_vectors(m.memory, after, resources)
    assert read[0][0] is before[0][0]
    assert mm._node_vectors(m.memory, after, (MEMORY,))[0][1][0] + 3 * GIB == \
        mm._node_vectors(m.memory, usage, (MEMORY,))[0][1][0]


def test_taking_whole_cores_of_one_size_sorts_no_cores(monkeypatch):
    from numa_agent.admission import cpu_take
    from numa_agent.admission.cpu_topology import CpuTopology
    from numa_agent.core.cpuset import CpuSet

    topo = CpuTopology.from_topology(make_topology(sockets=1, nodes_per_socket=2, cores_per_node=8,
                                                   threads_per_core=2))
    # Node 1 is fuller (one thread of its first core busy): whole cores come from it, lowest first.
    half = min(topo.core_cpus[topo.cores_of_numa[1][0]])
    available = topo.all_cpus - CpuSet([half])
    want = CpuSet.union_of(topo.core_cpus[c] for c in topo.cores_of_numa[1][1:3])
    orderings = spy_orderings(monkeypatch, "sorted_cores")
    assert cpu_take.take_by_topology(topo, available, 4) == want
    assert orderings == []
    # An odd count still orders the cores for its last thread.
    assert len(cpu_take.take_by_topology(topo, available, 5)) == 5
    assert len(orderings) == 1


def test_the_free_report_reads_the_machines_layout_once(monkeypatch):
    from numa_agent.admission.view import AdmissionView
    from numa_agent.core.topology import Topology

    m = machine()
    state = decide(m, AgentState(), Request("a", 0, Resources(cpus=2, memory_bytes=GIB,
                                                              hugepages={2048: 64}))).state
    empty = AdmissionView(m, AgentState()).free
    read = counting(monkeypatch, Topology, "node")
    first = AdmissionView(m, state).free
    second = AdmissionView(m, state).free
    assert read == []  # the machine's part, read for the first report and kept
    assert second == first
    booked = [n for n, entry in first.items() if entry != empty[n]]
    assert len(booked) == 1
    assert first[booked[0]]["memory_bytes"] == empty[booked[0]]["memory_bytes"] - GIB
    assert first[booked[0]]["hugepages_bytes"]["2048"] == empty[booked[0]]["hugepages_bytes"]["2048"] - (64 * 2 << 20)
    assert sum(entry["cpus"] for entry in first.values()) == len(m.usable_cpus) - len(m.reserved_cpus) - 2


def test_a_summary_of_one_node_hints_reads_fits_alone_not_fits():
    from numa_agent.admission.topology_manager import SUMMARY_LIMIT, _summarize
    from numa_agent.core.hints import HintSet, count_fits

    free = {1 << n: c for n, c in enumerate((1, 6, 2, 8, 9, 0, 7, 5))}
    fits, fits_alone = count_fits(free, 5)
    asked = []

    def counted_fits(mask):
        asked.append(mask)
        return fits(mask)

    hs = HintSet.generated(NumaMask(range(8)), counted_fits, 1, monotone=True, fits_alone=fits_alone)
    summary = _summarize(0, "cpu", hs)
    assert asked == []
    plain = _summarize(0, "cpu", HintSet.generated(NumaMask(range(8)), fits, 1, monotone=True))
    assert summary == plain
    assert summary.hints == tuple(f"{{{n}}} preferred" for n in (1, 3, 4, 6)[:SUMMARY_LIMIT])


def test_the_alignment_report_looks_up_no_cpu_per_booking(monkeypatch):
    from numa_agent.admission.admit import alignment
    from numa_agent.core.topology import Topology

    m = machine()
    whole = decide(m, AgentState(), Request("a", 0, Resources(cpus=4))).workload.booking
    odd = decide(m, AgentState(), Request("b", 0, Resources(cpus=3))).workload.booking
    alignment(m, whole)  # the machine's table, made once
    looked_up = counting(monkeypatch, Topology, "cpu")
    assert alignment(m, whole) == {"numa_node": True, "physical_core": True, "l3": True}
    assert alignment(m, odd) == {"numa_node": True, "physical_core": False, "l3": True}
    assert looked_up == []


def test_an_aligned_allocation_that_holds_the_request_takes_no_rest(monkeypatch):
    """The CPUs of the merged nodes hold the whole request: no second, empty take
    over the rest of the machine (each take sorts the machine's groups anew)."""
    from numa_agent.admission import cpu_take

    m = machine(nodes=4)
    takes = counting(monkeypatch, cpu_take, "_Accumulator")
    d = decide(m, AgentState(), Request("a", 0, Resources(cpus=3)))
    assert len(takes) == 1
    assert len(d.workload.booking.cpus) == 3 and len(d.workload.booking.numa_nodes) == 1


@pytest.mark.parametrize("policy", ["best-effort", "single-numa-node"])
def test_one_admission_builds_the_memory_managers_state_once(monkeypatch, policy):
    m = machine(policy=policy)
    built = counting(monkeypatch, mm, "_State")
    d = decide(m, AgentState(), Request("a", 0, Resources(cpus=2, memory_bytes=4 * GIB, hugepages={2048: 64})))
    # The hints' state serves the allocation: same usage, request and nodes.
    assert len(built) == 1
    assert d.workload.booking.memory_total(MEMORY) == 4 * GIB
    decide(m, d.state, Request("b", 0, Resources(memory_bytes=GIB)))
    assert len(built) == 2  # another request, its own


def test_a_booking_folded_into_the_kept_usage_builds_no_memory_allocation(monkeypatch):
    m = machine()
    state = decide(m, AgentState(), Request("a", 0, Resources(memory_bytes=20 * GIB, hugepages={2048: 8}))).state
    memory_usage(state)  # kept in the state, handed on by its updates
    made = counting(monkeypatch, mm.MemoryAllocation, "__post_init__")
    d = decide(m, state, Request("b", 0, Resources(cpus=2, memory_bytes=GIB, hugepages={2048: 8})))
    assert len(made) == 1  # the memory manager's answer; the update folds the booking as it is
    released, _, _ = release(d.state, "a")
    assert len(made) == 1
    monkeypatch.undo()
    for s in (d.state, released):
        fresh = mm.usage_from_booked((b.memory_group, b.memory) for b in s.top_level_bookings() if b.memory)
        assert memory_usage(s) == fresh
    assert memory_usage(released).allocated_bytes(0, MEMORY) == 0


def test_device_hints_look_up_the_free_devices_once(monkeypatch):
    from numa_agent.admission import device_manager as dm
    from numa_agent.admission.registry import PROVIDERS
    from numa_agent.admission.view import AdmissionView

    gpu = ("0x030200", "0x10de", "0x20b0", "nvidia")
    topo = make_topology(sockets=1, nodes_per_socket=4, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=16 * GIB, devices=[(*gpu[:3], n, gpu[3]) for n in (0, 1, 1, 3)])
    m = build_machine(topo, PolicyConfig(devices={"gpu": {"vendor": "0x10de"}}))
    d = decide(m, AgentState(), Request("a", 0, Resources(devices={"gpu": 1})))
    looked_up = counting(monkeypatch, dm, "_free")
    (devices,) = [p for p in PROVIDERS if p.name == "devices"]
    hints = devices.hints(Request("b", 0, Resources(devices={"gpu": 2})), AdmissionView(m, d.state))
    assert len(looked_up) == 1
    monkeypatch.undo()
    # One GPU on node 0 is taken: node 1 alone holds two free ones.
    assert hints is not None and hints["gpu"].fits_alone() == 0b10 and hints["gpu"].min_size == 1
    assert dm.device_refusal_reason(m.devices, d.state.devices_in_use(), "gpu", 4) == \
        "gpu: requested 4 devices, 3 of 4 are free"


def test_taking_cpus_of_one_node_orders_no_node_or_socket(monkeypatch):
    from numa_agent.admission import cpu_take
    from numa_agent.admission.cpu_topology import CpuTopology

    topo = CpuTopology.from_topology(make_topology(sockets=2, nodes_per_socket=2, cores_per_node=4,
                                                   threads_per_core=2))
    wanted = {n: cpu_take.take_by_topology(topo, topo.numa_cpus[n], count)
              for n, count in ((1, 3), (2, 8), (3, 1))}
    orderings = counting(monkeypatch, cpu_take._Accumulator, "sorted_sockets")
    for n, count in ((1, 3), (2, 8), (3, 1)):
        # Free CPUs on one node, as inside a one-node affinity: no ordering to make.
        taken = cpu_take.take_by_topology(topo, topo.numa_cpus[n], count)
        assert taken == wanted[n] and len(taken) == count and taken.issubset(topo.numa_cpus[n])
    assert orderings == []


def test_a_hugepage_request_reads_the_machines_page_sizes_once(monkeypatch):
    from numa_agent.admission.admit import InvalidRequest

    m = machine(nodes=8)
    decide(m, AgentState(), Request("a", 0, Resources(memory_bytes=GIB, hugepages={2048: 8})))
    looked_up = counting(monkeypatch, type(m.topology), "node")
    d = decide(m, AgentState(), Request("b", 0, Resources(memory_bytes=GIB, hugepages={2048: 8})))
    assert looked_up == []  # the page sizes were read for the machine once
    assert d.workload.booking.memory_total(hugepages_resource(2048)) == 8 * 2048 * 1024
    with pytest.raises(InvalidRequest, match="do not exist on this machine"):
        decide(m, AgentState(), Request("c", 0, Resources(hugepages={4096: 1})))


def test_the_memory_managers_state_copies_no_group_index_when_every_node_is_in_reach():
    m = machine(nodes=8)
    state = AgentState()
    for i, gib in enumerate((20, 4, 4)):
        state = decide(m, state, Request(f"w{i}", 0, Resources(memory_bytes=gib * GIB))).state
    usage = memory_usage(state)
    req = MemoryRequest(4 * GIB)
    whole = mm._State(m.memory, usage, req, m.memory.memory_nodes.bits)
    assert whole.group_of is usage._group_of  # read as it is, not filtered into a copy
    part = mm._State(m.memory, usage, req, 0b11110000)
    assert part.group_of == {n: g for n, g in usage._group_of.items() if n >= 4}
    for bits in range(1, 256):
        mask = NumaMask.from_bits(bits)
        assert part.fits(mask) == (bits & 0x0F == 0 and whole.fits(mask)), bits


def spy_cores_of_numa(monkeypatch, topo) -> list[int]:
    """The nodes whose cores `topo.cores_of_numa` is asked for from now on, in order."""
    read: list[int] = []

    class Reads(dict):
        def __getitem__(self, node):
            read.append(node)
            return super().__getitem__(node)

    monkeypatch.setitem(topo.__dict__, "cores_of_numa", Reads(topo.cores_of_numa))
    return read


def test_taking_whole_cores_lists_the_cores_of_no_more_nodes_than_it_takes_from(monkeypatch):
    from numa_agent.admission import cpu_take
    from numa_agent.admission.cpu_topology import CpuTopology

    topo = CpuTopology.from_topology(make_topology(sockets=2, nodes_per_socket=4, cores_per_node=4,
                                                   threads_per_core=2))
    assert not topo.numa_first
    available = topo.all_cpus - topo.numa_cpus[0]  # the rest of the machine, as a second take reads it
    wanted = cpu_take.take_by_topology(topo, available, 4)
    read = spy_cores_of_numa(monkeypatch, topo)
    taken = cpu_take.take_by_topology(topo, available, 4)
    assert taken == wanted and len(taken) == 4 and taken.issubset(topo.numa_cpus[1])
    assert read == [1]  # two whole cores of node 1: the other nodes' cores go unlisted


def test_taking_single_threads_orders_the_cores_of_no_more_nodes_than_it_takes_from(monkeypatch):
    from numa_agent.admission import cpu_take
    from numa_agent.admission.cpu_topology import CpuTopology

    topo = CpuTopology.from_topology(make_topology(sockets=2, nodes_per_socket=4, cores_per_node=4,
                                                   threads_per_core=2))
    available = topo.all_cpus - topo.numa_cpus[0]  # the rest of the machine, as a second take reads it
    wanted = {count: cpu_take.take_by_topology(topo, available, count) for count in (1, 3)}
    read = spy_cores_of_numa(monkeypatch, topo)
    for count in (1, 3):
        read.clear()
        taken = cpu_take.take_by_topology(topo, available, count)
        assert taken == wanted[count] and len(taken) == count and taken.issubset(topo.numa_cpus[1])
        # One thread (after a whole core, for 3): node 1's cores only, in order.
        assert set(read) == {1}, count
