"""Properties of the static policy's allocation over random small machines."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_agent.admission.cpu_manager import (
    CpuManagerOptions,
    SMTAlignmentError,
    allocate_cpus,
    cpu_hints,
)
from numa_agent.admission.cpu_topology import CpuInfo, CpuTopology
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from tests.support.cpu_topology import from_cpus, numas_of
from tests.support.synthetic import make_topology

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def machines(draw):
    sockets = draw(st.integers(1, 2))
    nodes_per_socket = draw(st.integers(1, 2))
    cores_per_node = draw(st.integers(1, 4))
    threads = draw(st.integers(1, 2))
    l3_per_socket = draw(st.booleans())
    nodes = sockets * nodes_per_socket
    total = nodes * cores_per_node
    infos = []
    for core in range(total):
        node = core // cores_per_node
        socket = node // nodes_per_socket
        for t in range(threads):
            infos.append(CpuInfo(core + t * total, core, socket, node, socket if l3_per_socket else node))
    return from_cpus(infos)


OPTIONS = st.sampled_from([
    CpuManagerOptions(),
    CpuManagerOptions(full_pcpus_only=True),
    CpuManagerOptions(distribute_cpus_across_cores=True),
    CpuManagerOptions(distribute_cpus_across_numa=True),
    CpuManagerOptions(distribute_cpus_across_numa=True, full_pcpus_only=True),
    CpuManagerOptions(prefer_align_cpus_by_uncorecache=True),
    CpuManagerOptions(align_by_socket=True),
])


def subset(draw, cpus: CpuSet) -> CpuSet:
    ids = cpus.ids()
    return CpuSet(i for i, keep in zip(ids, draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids))), strict=True)
                  if keep)


def affinity(draw, topo: CpuTopology) -> NumaMask | None:
    nodes = [n for n in topo.numa_ids if draw(st.booleans())]
    return NumaMask(nodes) if nodes else None


def smt_refusal_is_justified(topo, available, request) -> bool:
    whole = topo.whole_core_cpus(available & topo.all_cpus)
    return request % topo.cpus_per_core != 0 or request > len(whole)


@SETTINGS
@given(st.data(), machines(), OPTIONS)
def test_allocation_is_an_exact_deterministic_subset(data, topo, options):
    available = subset(data.draw, topo.all_cpus)
    request = data.draw(st.integers(0, len(available)))
    mask = affinity(data.draw, topo)
    try:
        got = allocate_cpus(topo, available, request, mask, options)
    except SMTAlignmentError:
        assert options.full_pcpus_only and smt_refusal_is_justified(topo, available, request)
        return
    assert got.issubset(available)
    assert len(got) == request
    # Same inputs, fresh values (no cached state): same answer.
    fresh = from_cpus(topo.cpus)
    assert allocate_cpus(fresh, CpuSet(available.ids()), request, mask, options) == got


@SETTINGS
@given(st.data(), machines(), OPTIONS)
def test_a_sequence_of_allocations_never_overlaps(data, topo, options):
    free = topo.all_cpus
    taken = CpuSet()
    for _ in range(data.draw(st.integers(1, 5))):
        request = data.draw(st.integers(0, len(free)))
        try:
            got = allocate_cpus(topo, free, request, affinity(data.draw, topo), options)
        except SMTAlignmentError:
            assert options.full_pcpus_only and smt_refusal_is_justified(topo, free, request)
            continue
        assert got.isdisjoint(taken) and got.issubset(free) and len(got) == request
        taken |= got
        free -= got


@SETTINGS
@given(st.data(), machines(), st.sampled_from([
    CpuManagerOptions(),
    CpuManagerOptions(full_pcpus_only=True),
    CpuManagerOptions(prefer_align_cpus_by_uncorecache=True),
    CpuManagerOptions(align_by_socket=True),
    CpuManagerOptions(distribute_cpus_across_numa=True, full_pcpus_only=True),
]))
def test_whole_cores_when_the_request_allows(data, topo, options):
    cores = [c for c in topo.core_ids if data.draw(st.booleans())]
    available = CpuSet(cpu for c in cores for cpu in topo.core_cpus[c])
    per_core = topo.cpus_per_core
    request = per_core * data.draw(st.integers(0, len(cores)))
    got = allocate_cpus(topo, available, request, affinity(data.draw, topo), options)
    for cpus in topo.core_cpus.values():
        assert cpus.isdisjoint(got) or cpus.issubset(got), f"core {cpus} split by {got}"


@SETTINGS
@given(st.data(), machines(), OPTIONS)
def test_every_hinted_mask_can_really_hold_the_request(data, topo, options):
    available = subset(data.draw, topo.all_cpus)
    request = data.draw(st.integers(1, len(topo.all_cpus) + 1))
    hints = cpu_hints(topo, available, request, options).hints()
    fitting = {m for m in (NumaMask(n) for n in _all_masks(topo.numa_ids))
               if len(available & topo.cpus_of_numas(m.nodes())) >= request}
    assert {h.mask for h in hints} == fitting
    assert all(h.preferred for h in hints if h.mask.count() == topo.min_nodes_for(request))


def _all_masks(nodes):
    for bits in range(1, 1 << len(nodes)):
        yield [n for i, n in enumerate(nodes) if bits >> i & 1]


def test_large_machine_hints_and_allocation_complete():
    # 64 NUMA nodes, 1024 CPUs: hints stay a rule (never enumerated) and
    # fits() touches only the mask's nodes.
    topo = CpuTopology.from_topology(make_topology(sockets=2, nodes_per_socket=32, cores_per_node=8))
    assert len(topo.all_cpus) == 1024 and len(topo.numa_ids) == 64
    hint_set = cpu_hints(topo, topo.all_cpus, 40, CpuManagerOptions())
    assert hint_set.min_size == 3
    assert hint_set.fits(NumaMask(range(3))) and not hint_set.fits(NumaMask(range(2)))
    got = allocate_cpus(topo, topo.all_cpus, 40, NumaMask(range(3)), CpuManagerOptions())
    assert len(got) == 40 and numas_of(topo, got) == NumaMask(range(3))
    spread = allocate_cpus(topo, topo.all_cpus, 40, None,
                           CpuManagerOptions(distribute_cpus_across_numa=True, full_pcpus_only=True))
    assert len(spread) == 40 and len(numas_of(topo, spread)) == 3
