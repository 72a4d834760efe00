"""CPU manager static policy: topology view, options, reserved CPUs, hints,
allocation and their error messages."""

from dataclasses import replace

import pytest

from numa_agent.admission.cpu_manager import (
    CpuAllocationError,
    CpuManagerOptions,
    CpuPolicyConfigError,
    SMTAlignmentError,
    allocate_cpus,
    cpu_hints,
    reserved_cpus,
)
from numa_agent.admission.cpu_take import take_by_topology, take_by_topology_distributed
from numa_agent.admission.cpu_topology import CpuInfo, CpuTopology, CpuTopologyError
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask, TopologyHint
from tests.support.cpu_topology import from_cpus, from_vectors
from tests.support.synthetic import make_topology


def machine(sockets=2, nodes_per_socket=1, cores_per_node=4, threads=2, uncores_per_node=1):
    """A CpuTopology with split numbering: core c = {c, c + total_cores}."""
    nodes = sockets * nodes_per_socket
    total = nodes * cores_per_node
    per_uncore = max(1, cores_per_node // uncores_per_node)
    infos = []
    for core in range(total):
        node = core // cores_per_node
        uncore = node * uncores_per_node + (core % cores_per_node) // per_uncore
        for t in range(threads):
            infos.append(CpuInfo(core + t * total, core, node // nodes_per_socket, node, uncore))
    return from_cpus(infos)


# ---- CpuTopology ----------------------------------------------------------

def test_from_topology_maps_cores_packages_nodes_and_l3():
    topo = make_topology(sockets=2, nodes_per_socket=2, cores_per_node=2, offline_cpus=[15])
    cpu_topo = CpuTopology.from_topology(topo)
    assert 15 not in cpu_topo.all_cpus and len(cpu_topo.all_cpus) == 15
    assert (cpu_topo.num_cpus, cpu_topo.num_cores, cpu_topo.num_sockets,
            cpu_topo.num_numa_nodes, cpu_topo.num_uncore_caches) == (15, 8, 2, 4, 4)
    assert cpu_topo.core_cpus[0] == CpuSet([0, 8])
    assert cpu_topo.core_cpus[7] == CpuSet([7])  # its sibling 15 is offline
    assert cpu_topo.socket_cpus[1] == CpuSet.parse("4-7,12-14")
    assert cpu_topo.numas_of_socket[1] == (2, 3)
    assert cpu_topo.uncore_cpus[2] == CpuSet.parse("2-3,10-11")  # L3 id = lowest CPU of the group
    assert cpu_topo.numa_first is False  # 2 sockets < 4 NUMA nodes


def test_from_topology_uses_the_package_when_no_l3_is_known():
    topo = make_topology(sockets=2, cores_per_node=2)
    no_l3 = replace(topo, cpus=tuple(replace(c, l3=None) for c in topo.cpus))
    cpu_topo = CpuTopology.from_topology(no_l3)
    assert cpu_topo.uncore_cpus == cpu_topo.socket_cpus


def test_from_vectors_refuses_a_bad_entry():
    with pytest.raises(CpuTopologyError, match="bad topology entry"):
        from_vectors({"cpus": []})


def test_duplicate_cpu_ids_are_refused():
    with pytest.raises(CpuTopologyError, match="unique and sorted"):
        CpuTopology(cpus=(CpuInfo(0, 0, 0, 0, 0), CpuInfo(0, 0, 0, 0, 0)), num_cpus=2, num_cores=1,
                    num_sockets=1, num_numa_nodes=1, num_uncore_caches=1)


def test_min_nodes_for():
    topo = machine(sockets=4, cores_per_node=2)  # 4 nodes of 4 CPUs
    assert [topo.min_nodes_for(r) for r in (1, 4, 5, 16, 17)] == [1, 1, 2, 4, 4]


# ---- options --------------------------------------------------------------

def test_options_from_mapping_parses_go_booleans():
    opts = CpuManagerOptions.from_mapping({"full-pcpus-only": "true", "align-by-socket": "False",
                                           "strict-cpu-reservation": "1"})
    assert opts == CpuManagerOptions(full_pcpus_only=True, strict_cpu_reservation=True)
    assert opts.to_mapping() == {"full-pcpus-only": "true", "strict-cpu-reservation": "true"}
    assert CpuManagerOptions.from_mapping(None) == CpuManagerOptions()


def test_unknown_option_is_refused():
    with pytest.raises(CpuPolicyConfigError, match="unknown CPU manager option 'pack-tight'"):
        CpuManagerOptions.from_mapping({"pack-tight": "true"})


def test_non_boolean_value_is_refused():
    with pytest.raises(CpuPolicyConfigError, match="bad value for CPU manager option 'full-pcpus-only': 'yes'"):
        CpuManagerOptions.from_mapping({"full-pcpus-only": "yes"})


@pytest.mark.parametrize("a, b", [
    ("full-pcpus-only", "distribute-cpus-across-cores"),
    ("distribute-cpus-across-numa", "distribute-cpus-across-cores"),
    ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores"),
    ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa"),
])
def test_incompatible_options_name_both(a, b):
    with pytest.raises(CpuPolicyConfigError, match=f"options {a} and {b} cannot be used"):
        CpuManagerOptions.from_mapping({a: "true", b: "true"})
    fields = {k.replace("-", "_"): True for k in (a, b)}
    with pytest.raises(CpuPolicyConfigError, match=f"{a} and {b}"):
        CpuManagerOptions(**fields).validate(machine())


def test_align_by_socket_refused_when_sockets_outnumber_nodes():
    topo = from_cpus([CpuInfo(i, i, i, 0, 0) for i in range(4)])  # 4 sockets, 1 node
    with pytest.raises(CpuPolicyConfigError, match="align-by-socket needs sockets at least as large"):
        CpuManagerOptions(align_by_socket=True).validate(topo)
    CpuManagerOptions(align_by_socket=True).validate(machine(nodes_per_socket=2))


def test_align_by_socket_refused_with_single_numa_node_policy():
    with pytest.raises(CpuPolicyConfigError, match="align-by-socket .* single-numa-node"):
        CpuManagerOptions(align_by_socket=True).validate(machine(), topology_policy="single-numa-node")


# ---- reserved CPUs ----------------------------------------------------------

def test_reserved_count_takes_whole_low_cores():
    topo = machine(sockets=1, cores_per_node=4)  # core i = {i, i+4}
    assert reserved_cpus(topo, None, 2) == CpuSet([0, 4])
    assert reserved_cpus(topo, None, 3) == CpuSet([0, 1, 4])
    assert reserved_cpus(topo, None, 0) == CpuSet()


def test_reserved_explicit_list_wins():
    topo = machine(sockets=1, cores_per_node=4)
    assert reserved_cpus(topo, CpuSet([3, 5]), 0) == CpuSet([3, 5])
    assert reserved_cpus(topo, CpuSet([3, 5]), 2) == CpuSet([3, 5])


@pytest.mark.parametrize("explicit, count, message", [
    (CpuSet([1, 2]), 3, "holds 2 CPUs, but 3 are to be reserved"),
    (CpuSet([1, 99]), 0, "reserved CPUs 99 are not usable"),
    (None, 9, "cannot reserve 9 CPUs: the machine has 8"),
    (None, -1, "must be >= 0"),
])
def test_reserved_errors(explicit, count, message):
    with pytest.raises(CpuPolicyConfigError, match=message):
        reserved_cpus(machine(sockets=1, cores_per_node=4), explicit, count)


# ---- hints ----------------------------------------------------------------

def test_no_request_means_no_preference():
    assert cpu_hints(machine(), CpuSet(), 0).hints() == [TopologyHint(None, True)]


def test_impossible_request_gives_no_hints():
    hint_set = cpu_hints(machine(), CpuSet(range(4)), 5)
    assert hint_set.kind == "impossible" and hint_set.hints() == []


def test_reusable_cpus_pin_the_mask():
    topo = machine()  # node 0 = 0-3,8-11; node 1 = 4-7,12-15
    hints = cpu_hints(topo, CpuSet([4, 5]), 3, reusable=CpuSet([0])).hints()
    assert hints == [TopologyHint(NumaMask([0, 1]), False)]


def test_already_allocated_of_a_different_size_cannot_be_satisfied():
    assert cpu_hints(machine(), CpuSet(range(16)), 2, already_allocated=CpuSet([0])).hints() == []


# ---- allocation -------------------------------------------------------------

def test_allocation_follows_the_affinity():
    topo = machine()
    assert allocate_cpus(topo, topo.all_cpus, 4, NumaMask([1])) == CpuSet([4, 5, 12, 13])
    # Node 1 holds only 2 free CPUs: they are taken, the rest comes from node 0.
    got = allocate_cpus(topo, CpuSet([0, 1, 2, 8, 9, 10, 6, 14]), 4, NumaMask([1]))
    assert got == CpuSet([6, 14, 0, 8])


def test_align_by_socket_widens_the_affinity_to_the_socket():
    topo = machine(sockets=1, nodes_per_socket=2, cores_per_node=2)  # node 0 = 0,1,4,5; node 1 = 2,3,6,7
    available = CpuSet([0, 2, 3, 6, 7])
    opts = CpuManagerOptions(align_by_socket=True)
    assert allocate_cpus(topo, available, 3, NumaMask([0]), opts) == CpuSet([0, 2, 6])


def test_distribute_across_numa_spreads_the_request():
    topo = machine()
    opts = CpuManagerOptions(distribute_cpus_across_numa=True, full_pcpus_only=True)
    # More than one node is needed: 6 CPUs from each rather than 8 + 4.
    assert allocate_cpus(topo, topo.all_cpus, 12, None, opts) == CpuSet.parse("0-2,8-10,4-6,12-14")
    assert allocate_cpus(topo, topo.all_cpus, 12, None) == CpuSet.parse("0-3,8-11,4-5,12-13")


def test_smt_error_for_a_request_not_multiple_of_threads():
    with pytest.raises(SMTAlignmentError, match="SMTAlignmentError: requested 3 cpus is not a multiple "
                                                "of cpus per core = 2") as info:
        allocate_cpus(machine(), machine().all_cpus, 3, None, CpuManagerOptions(full_pcpus_only=True))
    assert isinstance(info.value, CpuAllocationError)


def test_smt_error_when_not_enough_whole_cores():
    # 6 free CPUs but only one whole core (0, 8): lone threads do not count.
    available = CpuSet([0, 8, 1, 2, 3, 4])
    with pytest.raises(SMTAlignmentError, match="available physical cpus = 2, requested cpus = 4, "
                                                "cpus per core = 2"):
        allocate_cpus(machine(), available, 4, None, CpuManagerOptions(full_pcpus_only=True))


def test_full_pcpus_only_never_takes_a_lone_thread():
    topo = machine()
    available = CpuSet([0, 8, 1, 9, 2, 4, 12])  # core 2 has only CPU 2 free
    got = allocate_cpus(topo, available, 4, NumaMask([0]), CpuManagerOptions(full_pcpus_only=True))
    assert got == CpuSet([0, 8, 1, 9])


def test_allocation_errors():
    topo = machine()
    with pytest.raises(CpuAllocationError, match="requested=5, available=4"):
        allocate_cpus(topo, CpuSet(range(4)), 5, None)
    with pytest.raises(CpuAllocationError, match="negative number of cpus: requested=-1"):
        allocate_cpus(topo, topo.all_cpus, -1, None)


def test_take_errors():
    topo = machine()
    with pytest.raises(CpuAllocationError, match="not enough cpus available to satisfy request: "
                                                 "requested=5, available=4"):
        take_by_topology(topo, CpuSet(range(4)), 5)
    with pytest.raises(CpuAllocationError, match="negative"):
        take_by_topology(topo, topo.all_cpus, -2)
    with pytest.raises(CpuAllocationError, match="cpu group size must be >= 1, got 0"):
        take_by_topology_distributed(topo, topo.all_cpus, 2, 0)
    with pytest.raises(CpuAllocationError, match="requested=20, available=16"):
        take_by_topology_distributed(topo, topo.all_cpus, 20, 1)


def test_cpus_outside_the_topology_are_never_taken():
    topo = machine(sockets=1, cores_per_node=2)
    assert take_by_topology(topo, CpuSet([0, 1, 2, 3, 100]), 4) == CpuSet(range(4))


def test_uncore_alignment_keeps_a_request_in_one_l3_group():
    topo = machine(sockets=1, cores_per_node=8, threads=1, uncores_per_node=2)  # L3: 0-3, 4-7
    opts = CpuManagerOptions(prefer_align_cpus_by_uncorecache=True)
    available = CpuSet([2, 3, 4, 5, 6, 7])
    assert take_by_topology(topo, available, 3, opts) == CpuSet([4, 5, 6])
    assert take_by_topology(topo, available, 3) == CpuSet([2, 3, 4])
