"""The synthetic machine builder: shapes as Linux reports them."""

import pytest

from numa_agent.core.cpuset import CpuSet
from tests.support.synthetic import make_numa_machine, make_topology


def test_default_shape_split_numbering():
    topo = make_topology()
    assert topo.node_ids == (0, 1)
    assert topo.node(0).cpus == CpuSet.parse("0-3,8-11")
    assert topo.node(1).cpus == CpuSet.parse("4-7,12-15")
    assert topo.cpu(0).siblings == CpuSet([0, 8])
    assert topo.cpu(8).core == 0
    assert len(topo.cores) == 8
    assert topo.packages == {0: CpuSet.parse("0-3,8-11"), 1: CpuSet.parse("4-7,12-15")}
    assert topo.distance(0, 1) == 21 and topo.distance(1, 1) == 10
    assert topo.allowed_cpus is None and topo.usable_cpus == CpuSet.parse("0-15")


def test_interleaved_numbering_and_socket_l3():
    topo = make_topology(sockets=1, nodes_per_socket=2, cores_per_node=2, numbering="interleaved",
                         l3_per="socket")
    assert topo.node(0).cpus == CpuSet.parse("0-3")
    assert topo.cpu(3).siblings == CpuSet([2, 3])
    assert topo.distance(0, 1) == 12
    assert topo.l3_groups == {0: CpuSet.parse("0-7")}


def test_sub_numa_two_sockets_eight_nodes():
    topo = make_topology(sockets=2, nodes_per_socket=4, cores_per_node=2)
    assert len(topo.numa_nodes) == 8
    assert topo.distance(0, 3) == 12 and topo.distance(3, 4) == 21
    assert topo.cpu(0).siblings == CpuSet([0, 16])
    assert set(topo.l3_groups) == {0, 2, 4, 6, 8, 10, 12, 14}


def test_hugepages_memory_and_devices():
    topo = make_topology(hugepages_2m_per_node=512, hugepages_1g_per_node=2,
                         memory_per_node_bytes=16 << 30,
                         devices=[("0x030200", "0x10de", "0x20b0", 1, "nvidia"),
                                  ("0x020000", "0x8086", "0x1572", 0, "i40e")])
    node = topo.node(0)
    assert node.hugepage(2048).total == 512 and node.hugepage(1048576).free == 2
    assert node.memory_free_bytes == (16 << 30) - (1 << 30) - (2 << 30)
    gpu = topo.device("0000:01:00.0")
    assert gpu.numa_node == 1 and gpu.local_cpus == topo.node(1).cpus and gpu.driver == "nvidia"
    assert topo.device("0000:02:00.0").pci_class == "0x020000"


def test_sparse_and_cpuless_nodes():
    topo = make_topology(node_ids=(0, 8), cpuless_node_ids=(250,), offline_cpus=[15])
    assert topo.node_ids == (0, 8, 250)
    assert not topo.node(250).cpus
    assert topo.distance(8, 250) == 40
    assert 15 not in topo.online_cpus


def test_make_numa_machine():
    topo = make_numa_machine(4, 8)
    assert len(topo.numa_nodes) == 4 and len(topo.cpus) == 32
    assert all(len(n.cpus) == 8 for n in topo.numa_nodes)


@pytest.mark.parametrize("kwargs, message", [
    (dict(numbering="odd"), "numbering must be"),
    (dict(l3_per="core"), "l3_per must be"),
    (dict(sockets=0), "must be >= 1"),
    (dict(node_ids=(0,)), "node_ids names 1 nodes"),
    (dict(node_ids=(0, 0)), "distinct"),
    (dict(devices=[("0x0200", "0x8086", "0x1", 5, None)]), "NUMA node 5"),
    (dict(devices=[("0x0200",)]), "device #0 must be"),
    (dict(memory_per_node_bytes=1 << 30, hugepages_1g_per_node=2), "exceed"),
])
def test_bad_shapes_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_topology(**kwargs)


def test_make_numa_machine_rejects_odd_split():
    with pytest.raises(ValueError, match="multiple of threads_per_core"):
        make_numa_machine(2, 3)
