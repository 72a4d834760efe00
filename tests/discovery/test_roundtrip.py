"""write_sysfs -> read_topology returns the Topology it was given."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.topology import PciDevice
from numa_agent.discovery.sysfs import read_free_hugepages, read_topology
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

GPU = ("0x030200", "0x10de", "0x20b0")
NIC = ("0x020000", "0x8086", "0x1572")


def roundtrip(topo, tmp_path):
    return read_topology(write_sysfs(topo, tmp_path / "machine"))


SHAPES = {
    "default": dict(),
    "2 sockets x 4 sub-NUMA nodes, GPUs and NICs": dict(
        sockets=2, nodes_per_socket=4, cores_per_node=4, threads_per_core=2,
        hugepages_2m_per_node=256, hugepages_1g_per_node=4, l3_per="socket",
        devices=[GPU + (0, "nvidia"), GPU + (5, "nvidia"), NIC + (2, "i40e"), NIC + (7, None)]),
    "interleaved SMT4": dict(sockets=1, nodes_per_socket=2, cores_per_node=3, threads_per_core=4,
                             numbering="interleaved"),
    "no SMT, one node": dict(sockets=1, cores_per_node=6, threads_per_core=1),
    "sparse ids and a CPU-less node": dict(node_ids=(0, 8), cpuless_node_ids=(250, 251),
                                           devices=[GPU + (8, "nvidia")]),
    "offline CPUs and a restricted cpuset": dict(offline_cpus=[3, 11], allowed_cpus=CpuSet.parse("0-5"),
                                                 allowed_mems=[0]),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_roundtrip_shapes(tmp_path, shape):
    topo = make_topology(**SHAPES[shape])
    assert roundtrip(topo, tmp_path) == topo


def test_eight_node_machine_reads_back_with_its_facts(tmp_path):
    topo = roundtrip(make_topology(**SHAPES["2 sockets x 4 sub-NUMA nodes, GPUs and NICs"]), tmp_path)
    assert topo.node_ids == tuple(range(8))
    assert topo.cpu(0).siblings == CpuSet([0, 32])  # threads i and i+N
    assert topo.distance(0, 1) == 12 and topo.distance(0, 4) == 21
    gpus = [d for d in topo.pci_devices if d.pci_class == "0x030200"]
    assert [d.numa_node for d in gpus] == [0, 5]
    assert [d.numa_node for d in topo.pci_devices if d.pci_class == "0x020000"] == [2, 7]


def test_roundtrip_kernel_architecture_and_derived_device_node(tmp_path):
    base = make_topology()
    derived = PciDevice(address="0000:40:00.0", pci_class="0x010802", vendor="0x8086", device="0x0953",
                        numa_node=1, numa_node_source="local_cpulist", driver="nvme",
                        local_cpus=base.node(1).cpus, block=("nvme0n1",))
    pf = PciDevice(address="0000:50:00.0", pci_class="0x020000", vendor="0x15b3", device="0x1017",
                   numa_node=0, subsystem_vendor="0x15b3", subsystem_device="0x0020", driver="mlx5_core",
                   local_cpus=base.node(0).cpus, virtfns=("0000:50:00.2", "0000:50:00.3"),
                   sriov_totalvfs=8, sriov_numvfs=2, net=("ens1f0",), infiniband=("mlx5_0",))
    vf = dataclasses.replace(pf, address="0000:50:00.2", device="0x1018", physfn="0000:50:00.0",
                             virtfns=(), sriov_totalvfs=None, sriov_numvfs=None, net=("ens1f0v0",),
                             infiniband=(), other_children=("ptp/ptp1",))
    vf3 = dataclasses.replace(vf, address="0000:50:00.3", net=(), other_children=())
    unknown = PciDevice(address="0000:00:05.0", pci_class="0x088000", vendor="0x8086", device="0x2021",
                        numa_node=-1, numa_node_source="unknown", local_cpus=base.online_cpus)
    gpu = PciDevice(address="0000:3b:00.0", pci_class="0x030200", vendor="0x10de", device="0x20b0",
                    numa_node=0, driver="nvidia", local_cpus=base.node(0).cpus, nvidia_minor=3,
                    pci_path=("pci0000:3a", "0000:3a:00.0", "0000:3b:00.0", "0000:3c:08.0"))
    nic = dataclasses.replace(pf, address="0000:3e:00.0", virtfns=(), sriov_totalvfs=None,
                              sriov_numvfs=None, net=("ens2",), infiniband=(),
                              pci_path=("pci0000:3a", "0000:3a:00.0", "0000:3b:00.0", "0000:3c:0c.0"))
    topo = dataclasses.replace(base, pci_devices=(unknown, gpu, nic, derived, pf, vf, vf3),
                               kernel="6.1.0-13-amd64", architecture="x86_64")
    assert roundtrip(topo, tmp_path) == topo


settings_small = settings(max_examples=15, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings_small
@given(sockets=st.integers(1, 3), nodes_per_socket=st.integers(1, 3), cores=st.integers(1, 3),
       threads=st.integers(1, 4), numbering=st.sampled_from(["split", "interleaved"]),
       l3_per=st.sampled_from(["node", "socket"]), data=st.data())
def test_roundtrip_property(tmp_path_factory, sockets, nodes_per_socket, cores, threads, numbering,
                            l3_per, data):
    nodes = sockets * nodes_per_socket
    node_ids = data.draw(st.lists(st.integers(0, 63), min_size=nodes, max_size=nodes, unique=True))
    devices = data.draw(st.lists(st.tuples(st.sampled_from(["0x030200", "0x020000"]), st.just("0x10de"),
                                           st.just("0x0001"), st.sampled_from(node_ids + [-1]),
                                           st.sampled_from([None, "vfio-pci"])), max_size=3))
    topo = make_topology(sockets=sockets, nodes_per_socket=nodes_per_socket, cores_per_node=cores,
                         threads_per_core=threads, numbering=numbering, l3_per=l3_per,
                         node_ids=node_ids, devices=devices)
    assert roundtrip(topo, tmp_path_factory.mktemp("m")) == topo


def test_free_hugepages_are_read_for_just_the_pools_asked(tmp_path):
    root = write_sysfs(make_topology(sockets=2, hugepages_2m_per_node=8, hugepages_1g_per_node=2), tmp_path / "m")
    pool = root / "sys/devices/system/node/node1/hugepages/hugepages-2048kB"
    (pool / "free_hugepages").write_text("3\n")
    resv = root / "sys/kernel/mm/hugepages/hugepages-2048kB"
    resv.mkdir(parents=True)
    (resv / "resv_hugepages").write_text("1\n")
    assert read_free_hugepages(root, ((0, 2048), (1, 2048))) == (((0, 2048, 8), (1, 2048, 3)), ((2048, 1),))
    assert read_free_hugepages(root, ((1, 1048576),)) == (((1, 1048576, 2),), ())
    # A counter that is not there (a pool gone since discovery) is left out.
    assert read_free_hugepages(root, ((5, 2048),)) == ((), ((2048, 1),))
    assert read_free_hugepages(root, ()) == ((), ())
