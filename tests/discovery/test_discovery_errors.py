"""Bad or partial trees give a DiscoveryError naming the file; odd but valid
trees (old kernels, cgroup variants, no NUMA) are read."""

from __future__ import annotations

import os
import shutil

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.discovery.sysfs import DiscoveryError, read_topology
from numa_agent.views.topology_report import render_text
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


@pytest.fixture
def machine(tmp_path):
    return write_sysfs(make_topology(sockets=2, cores_per_node=2), tmp_path / "m")


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_missing_cpu_directory(tmp_path):
    (tmp_path / "sys").mkdir()
    with pytest.raises(DiscoveryError, match=r"sys/devices/system/cpu: not found"):
        read_topology(tmp_path)


def test_garbage_node_cpulist(machine):
    _write(machine / "sys/devices/system/node/node1/cpulist", "4-x\n")
    with pytest.raises(DiscoveryError, match=r"node1/cpulist: bad CPU list"):
        read_topology(machine)


def test_garbage_cpu_mask(machine):
    cpu = machine / "sys/devices/system/cpu/cpu2/topology"
    os.remove(cpu / "core_cpus_list")
    os.remove(cpu / "thread_siblings_list")
    _write(cpu / "core_cpus", "zz\n")
    with pytest.raises(DiscoveryError, match=r"cpu2/topology/core_cpus: bad CPU mask"):
        read_topology(machine)


def test_non_numeric_distance(machine):
    _write(machine / "sys/devices/system/node/node0/distance", "10 far\n")
    with pytest.raises(DiscoveryError, match=r"node0/distance: expected integers, got '10 far'"):
        read_topology(machine)


def test_distance_row_of_the_wrong_length(machine):
    _write(machine / "sys/devices/system/node/node0/distance", "10 21 21\n")
    with pytest.raises(DiscoveryError, match=r"node0/distance: 3 distances, but the machine has 2 node"):
        read_topology(machine)


def test_non_numeric_package_id(machine):
    _write(machine / "sys/devices/system/cpu/cpu1/topology/physical_package_id", "one\n")
    with pytest.raises(DiscoveryError, match=r"cpu1/topology/physical_package_id: expected an integer"):
        read_topology(machine)


def test_bad_per_cpu_online_value(machine):
    os.remove(machine / "sys/devices/system/cpu/online")
    _write(machine / "sys/devices/system/cpu/cpu3/online", "maybe\n")
    with pytest.raises(DiscoveryError, match=r"cpu3/online: expected 0 or 1, got 'maybe'"):
        read_topology(machine)


def test_bad_node_memtotal(machine):
    _write(machine / "sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: lots kB\n")
    with pytest.raises(DiscoveryError, match=r"node0/meminfo: bad MemTotal line"):
        read_topology(machine)


def test_bad_pci_numa_node(tmp_path):
    root = write_sysfs(make_topology(devices=[("0x020000", "0x8086", "0x1572", 0, None)]), tmp_path / "m")
    _write(root / "sys/bus/pci/devices/0000:01:00.0/numa_node", "zero\n")
    with pytest.raises(DiscoveryError, match=r"0000:01:00.0/numa_node: expected an integer, got 'zero'"):
        read_topology(root)


def test_bad_status_cpus_allowed_list(machine):
    _write(machine / "proc/self/status", "Cpus_allowed_list:\t0-\n")
    with pytest.raises(DiscoveryError, match=r"proc/self/status: bad CPU list"):
        read_topology(machine)


def test_per_cpu_online_files_when_no_global_list(machine):
    os.remove(machine / "sys/devices/system/cpu/online")
    _write(machine / "sys/devices/system/cpu/cpu5/online", "0\n")
    _write(machine / "sys/devices/system/cpu/cpu6/online", "\0\n")  # empty = online
    os.remove(machine / "sys/devices/system/cpu/cpu0/online")  # cpu0: no file = online
    topo = read_topology(machine)
    assert topo.online_cpus == CpuSet.parse("0-4,6-7")


def test_nul_bytes_and_hex_mask_fallbacks(machine):
    node = machine / "sys/devices/system/node/node1"
    os.remove(node / "cpulist")
    _write(node / "cpumap", "000000cc\n\0")
    topo = read_topology(machine)
    assert topo.node(1).cpus == CpuSet.parse("2-3,6-7")


def test_cpu_node_from_link_when_nodes_list_no_cpus(machine):
    for name in ("cpulist", "cpumap"):
        os.remove(machine / "sys/devices/system/node/node1" / name)
    for cpu in (2, 3, 6, 7):
        os.remove(machine / f"sys/devices/system/node/node1/cpu{cpu}")
    topo = read_topology(machine)
    assert topo.node(1).cpus == CpuSet()
    assert topo.cpu(6).numa_node == 1  # from cpu6/node1


def test_kernel_without_numa_is_one_node(machine, tmp_path):
    import shutil
    shutil.rmtree(machine / "sys/devices/system/node")
    for cpu in range(8):
        os.remove(machine / f"sys/devices/system/cpu/cpu{cpu}/node{0 if cpu in (0, 1, 4, 5) else 1}")
    topo = read_topology(machine)
    assert topo.node_ids == (0,)
    assert topo.node(0).cpus == CpuSet.parse("0-7")
    assert topo.node(0).memory_total_bytes == 2 * (64 << 30)
    assert all(c.numa_node == 0 for c in topo.cpus)


# ---- the agent's own cpuset -------------------------------------------------

def _no_status(root):
    os.remove(root / "proc/self/status")


def test_status_wins(machine):
    _write(machine / "proc/self/status", "Cpus_allowed_list:\t1-2\nMems_allowed_list:\t1\n")
    topo = read_topology(machine)
    assert (topo.allowed_cpus, topo.allowed_mems) == (CpuSet.parse("1-2"), frozenset({1}))


def test_cgroup2_walks_up_when_no_effective_files(machine):
    _no_status(machine)
    _write(machine / "proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    _write(machine / "proc/self/cgroup", "0::/agent.slice/numa-agent.service\n")
    _write(machine / "sys/fs/cgroup/agent.slice/cpuset.cpus", "2-5\n")
    _write(machine / "sys/fs/cgroup/agent.slice/cpuset.mems", "0\n")
    _write(machine / "sys/fs/cgroup/agent.slice/numa-agent.service/cpuset.cpus", "\n")
    topo = read_topology(machine)
    assert (topo.allowed_cpus, topo.allowed_mems) == (CpuSet.parse("2-5"), frozenset({0}))


def test_cgroup_v1_prefixed_files_via_proc_self_cgroup(machine):
    _no_status(machine)
    _write(machine / "proc/mounts",
           "cgroup /sys/fs/cgroup/cpu\\040set cgroup rw,cpuset 0 0\n")
    _write(machine / "proc/self/cgroup", "4:memory:/\n3:cpuset:/jobs/7\n")
    _write(machine / "sys/fs/cgroup/cpu set/jobs/7/cpuset.cpus", "0,4\n")
    _write(machine / "sys/fs/cgroup/cpu set/jobs/7/cpuset.mems", "0-1\n")
    topo = read_topology(machine)
    assert (topo.allowed_cpus, topo.allowed_mems) == (CpuSet([0, 4]), frozenset({0, 1}))


def test_legacy_dev_cpuset_without_mounts(machine):
    _no_status(machine)
    _write(machine / "proc/self/cpuset", "/batch\n")
    _write(machine / "dev/cpuset/batch/cpus", "6-7\n")
    _write(machine / "dev/cpuset/batch/mems", "1\n")
    topo = read_topology(machine)
    assert (topo.allowed_cpus, topo.allowed_mems) == (CpuSet.parse("6-7"), frozenset({1}))


def test_cgroup_without_cpuset_files_is_unrestricted(machine):
    _no_status(machine)
    _write(machine / "proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    _write(machine / "proc/self/cgroup", "0::/user.slice\n")
    topo = read_topology(machine)
    assert topo.allowed_cpus is None and topo.allowed_mems is None


def test_pci_plain_directory_nvme_namespaces_and_sriov_links(machine):
    base = machine / "sys/bus/pci/devices"
    nvme = base / "0000:05:00.0"  # a plain directory, as in some captured trees
    _write(nvme / "class", "0x010802\n")
    _write(nvme / "vendor", "0x144d\n")
    _write(nvme / "device", "0xa808\n")
    _write(nvme / "numa_node", "-1\n")
    _write(nvme / "local_cpus", "00000000,000000cc\n")  # no local_cpulist: the mask is used
    _write(nvme / "nvme/nvme0/nvme0n1/size", "1000\n")
    _write(nvme / "nvme/nvme0/nvme0c0n1/size", "1000\n")  # multipath path, not a namespace name
    _write(nvme / "power/control", "auto\n")  # not a class directory
    os.symlink("../../../bus/pci/drivers/nvme", nvme / "driver")
    vf = base / "0000:05:00.1"
    _write(vf / "class", "0x020000\n")
    _write(vf / "numa_node", "0\n")
    os.symlink("../0000:05:00.0", vf / "physfn")
    os.symlink("../0000:05:00.3", nvme / "virtfn1")
    os.symlink("../0000:05:00.2", nvme / "virtfn0")
    topo = read_topology(machine)
    dev = topo.device("0000:05:00.0")
    assert dev.local_cpus == CpuSet.parse("2-3,6-7")
    assert (dev.numa_node, dev.numa_node_source) == (1, "local_cpulist")
    assert dev.block == ("nvme0n1",) and dev.other_children == ("nvme/nvme0",)
    assert dev.driver == "nvme" and dev.virtfns == ("0000:05:00.2", "0000:05:00.3")
    assert topo.device("0000:05:00.1").physfn == "0000:05:00.0"
    assert topo.device("0000:05:00.1").vendor == ""


def test_pci_local_cpus_spanning_two_nodes_stay_unknown(machine):
    dev = machine / "sys/bus/pci/devices/0000:06:00.0"
    _write(dev / "class", "0x088000\n")
    _write(dev / "numa_node", "-1\n")
    _write(dev / "local_cpulist", "0-7\n")
    found = read_topology(machine).device("0000:06:00.0")
    assert (found.numa_node, found.numa_node_source) == (-1, "unknown")


def test_caches_with_l1i_and_a_cpu_without_cache_directory(tmp_path):
    # Written with the L3 only; cpu0 and cpu4 then gain an L1i, cpu1 loses its cache directory.
    machine = write_sysfs(make_topology(sockets=2, cores_per_node=2, with_caches=False), tmp_path / "m")
    cpu = machine / "sys/devices/system/cpu"
    for n in (0, 4):  # cpu0 and its SMT sibling share an L1i
        _write(cpu / f"cpu{n}/cache/index1/level", "1\n")
        _write(cpu / f"cpu{n}/cache/index1/type", "Instruction\n")
        _write(cpu / f"cpu{n}/cache/index1/size", "32K\n")
        _write(cpu / f"cpu{n}/cache/index1/shared_cpu_list", "0,4\n")
    shutil.rmtree(cpu / "cpu1/cache")
    topo = read_topology(machine)
    l1i = [c for c in topo.caches if c.name == "L1i"]
    assert [(c.id, c.cpus.format(), c.size_bytes) for c in l1i] == [(0, "0,4", 32 << 10)]
    assert [(c.name, c.size_bytes) for c in topo.cpu_caches(0)] == [("L1i", 32 << 10), ("L3", None)]
    assert topo.cpu(1).l3 is None  # its own directory is gone...
    assert [c.name for c in topo.cpu_caches(1)] == ["L3"]  # ...but cpu0's L3 names it


def test_garbage_cache_size(machine):
    _write(machine / "sys/devices/system/cpu/cpu2/cache/index0/size", "lots\n")
    with pytest.raises(DiscoveryError, match=r"cpu2/cache/index0/size: expected a size like 32K, got 'lots'"):
        read_topology(machine)


def test_a_cache_naming_a_cpu_discovery_does_not_know_leaves_it_out(machine):
    # `online` and cpu0's L3 name CPU 8, which has no directory and is in no node.
    cpu = machine / "sys/devices/system/cpu"
    _write(cpu / "online", "0-8\n")
    l3 = next(p.parent for p in (cpu / "cpu0/cache").glob("index*/level") if p.read_text().strip() == "3")
    _write(l3 / "shared_cpu_list", "0-1,4-5,8\n")
    topo = read_topology(machine)
    assert [c.cpus.format() for c in topo.caches if c.level == 3] == ["0-1,4-5", "2-3,6-7"]
    render_text(topo)  # every cache's CPUs are CPUs of the topology


def test_virtio_functions_are_named_by_their_virtio_device_classes(machine):
    # A VM's virtio-pci functions: the class directories sit below virtioN/.
    base = machine / "sys/bus/pci/devices"
    for address, cls, child in (("0000:00:02.0", "0x010000", "block/vda"),
                                ("0000:00:03.0", "0x020000", "net/eth0"),
                                ("0000:00:05.0", "0x00ff00", None)):
        dev = base / address
        _write(dev / "class", cls + "\n")
        _write(dev / "virtio1/features", "0\n")
        _write(dev / "virtio1/power/control", "auto\n")
        if child:
            _write(dev / "virtio1" / child / "uevent", "\n")
    topo = read_topology(machine)
    assert topo.device("0000:00:02.0").block == ("vda",)
    assert topo.device("0000:00:03.0").net == ("eth0",)
    rng = topo.device("0000:00:05.0")
    assert (rng.net, rng.block, rng.other_children) == ((), (), ())


@pytest.mark.parametrize("text, size", [("32K", 32 << 10), ("28160K", 28160 << 10), ("2M", 2 << 20),
                                        ("512", 512), ("0K", None)])
def test_cache_sizes_are_the_kernels_binary_units(tmp_path, text, size):
    machine = write_sysfs(make_topology(sockets=1, cores_per_node=1, threads_per_core=1), tmp_path / "m")
    _write(machine / "sys/devices/system/cpu/cpu0/cache/index0/size", text + "\n")
    assert read_topology(machine).cpu_caches(0)[0].size_bytes == size
