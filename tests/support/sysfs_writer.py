"""Write a `Topology` as a sysfs/procfs tree that discovery reads back.

The tree looks like a modern kernel's (list files and hex masks, `die_id`,
`core_cpus_list`, per-node hugepages, PCI devices under `sys/devices/` along their
`pci_path` with `sys/bus/pci/devices` symlinks, plain directories there without one) plus
`proc/self/status`. Tests of the whole agent point `--sysfs-root` at it:

    root = write_sysfs(make_topology(sockets=2, nodes_per_socket=4), tmp_path / "machine")
    assert read_topology(root) == topology
"""

from __future__ import annotations

import os
from pathlib import Path

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.topology import UNKNOWN_NODE, Cpu, PciDevice, Topology

_CPUINFO_BY_ARCH = {
    "x86_64": "vendor_id\t: GenuineIntel\nflags\t\t: fpu lm sse2\n",
    "i686": "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2\n",
    "aarch64": "CPU implementer\t: 0x41\nCPU architecture: 8\n",
    "ia64": "arch       : IA-64\n",
    "ppc64": "cpu\t\t: POWER9, altivec supported\n",
}


def write_sysfs(topology: Topology, root: str | os.PathLike) -> Path:
    """Write `topology` under `root` (created if needed); returns `root`."""
    root = Path(root)
    _write_cpus(topology, root / "sys/devices/system/cpu")
    _write_nodes(topology, root / "sys/devices/system/node")
    for device in topology.pci_devices:
        _write_pci_device(device, root / "sys")
        if device.nvidia_minor is not None:  # as the NVIDIA driver shows a GPU
            _put(root / "proc/driver/nvidia/gpus" / device.address / "information",
                 f"Model: \t\t Synthetic GPU\nIRQ:   \t\t 90\nGPU UUID: \t GPU-{device.address}\n"
                 f"Device Minor: \t {device.nvidia_minor}\nBus Location: \t {device.address}")
    _write_proc(topology, root / "proc")
    return root


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def _write_cpus(topo: Topology, cpu_dir: Path) -> None:
    every = CpuSet(c.id for c in topo.cpus)
    online = topo.online_cpus
    _put(cpu_dir / "possible", every.format())
    _put(cpu_dir / "present", every.format())
    _put(cpu_dir / "online", online.format())
    _put(cpu_dir / "offline", (every - online).format())
    _put(cpu_dir / "isolated", CpuSet(c.id for c in topo.cpus if c.isolated).format())
    l3_members: dict[int, set[int]] = {}
    for c in topo.cpus:
        if c.l3 is not None:
            l3_members.setdefault(c.l3, set()).add(c.id)
    for c in topo.cpus:
        d = cpu_dir / f"cpu{c.id}"
        _put(d / "online", "1" if c.online else "0")
        t = d / "topology"
        for name, value in (("physical_package_id", c.package), ("die_id", c.die),
                            ("cluster_id", c.cluster), ("core_id", c.core_id)):
            if value is not None:
                _put(t / name, str(value))
        _put(t / "core_cpus_list", c.siblings.format())
        _put(t / "core_cpus", c.siblings.format_mask())
        _put(t / "thread_siblings_list", c.siblings.format())
        _put(t / "thread_siblings", c.siblings.format_mask())
        _write_caches(topo, c, d / "cache", l3_members)
        if c.numa_node != UNKNOWN_NODE:
            _link(d / f"node{c.numa_node}", f"../../node/node{c.numa_node}")


def _write_caches(topo: Topology, c: Cpu, cache_dir: Path, l3_members: dict[int, set[int]]) -> None:
    """index0.. for the CPU's caches below L3 (an online CPU's, from
    `topo.caches`), then its L3 from `Cpu.l3` (offline CPUs too, as the kernel
    keeps them), sized from `topo.caches` where it has that L3."""
    entries = [(x.level, x.type, x.cpus | CpuSet((x.id,)), x.size_bytes)
               for x in topo.cpu_caches(c.id) if x.level != 3]
    if c.l3 is not None:
        size = next((x.size_bytes for x in topo.caches if x.level == 3 and x.id == c.l3), None)
        entries.append((3, "Unified", CpuSet(l3_members[c.l3]), size))
    for i, (level, kind, shared, size) in enumerate(entries):
        index = cache_dir / f"index{i}"
        _put(index / "level", str(level))
        _put(index / "type", kind)
        _put(index / "shared_cpu_list", shared.format())
        _put(index / "shared_cpu_map", shared.format_mask())
        if size is not None:
            _put(index / "size", f"{size >> 10}K")


def _write_nodes(topo: Topology, node_dir: Path) -> None:
    ids = CpuSet(topo.node_ids).format()  # node ids use the same list syntax
    _put(node_dir / "possible", ids)
    _put(node_dir / "online", ids)
    _put(node_dir / "has_cpu", CpuSet(n.id for n in topo.numa_nodes if n.cpus).format())
    _put(node_dir / "has_memory", CpuSet(n.id for n in topo.numa_nodes if n.memory_total_bytes).format())
    for node in topo.numa_nodes:
        d = node_dir / f"node{node.id}"
        _put(d / "cpulist", node.cpus.format())
        _put(d / "cpumap", node.cpus.format_mask())
        if node.distances:
            _put(d / "distance", " ".join(str(topo.distance(node.id, other)) for other in topo.node_ids))
        total_kb, free_kb = node.memory_total_bytes // 1024, node.memory_free_bytes // 1024
        _put(d / "meminfo", "\n".join([
            f"Node {node.id} MemTotal:       {total_kb} kB",
            f"Node {node.id} MemFree:        {free_kb} kB",
            f"Node {node.id} MemUsed:        {total_kb - free_kb} kB",
        ]))
        for pool in node.hugepages:
            p = d / "hugepages" / f"hugepages-{pool.size_kb}kB"
            _put(p / "nr_hugepages", str(pool.total))
            _put(p / "free_hugepages", str(pool.free))
            _put(p / "surplus_hugepages", str(pool.surplus))
        for cpu in node.cpus:
            _link(d / f"cpu{cpu}", f"../../cpu/cpu{cpu}")


def _write_pci_device(dev: PciDevice, sys_dir: Path) -> None:
    """Under sys/devices/<its pci_path>/ with a sys/bus/pci/devices symlink, as a kernel
    shows it; a device of no known pci_path as a plain directory of sys/bus/pci/devices,
    as some captured trees have it (discovery reads () from both)."""
    if dev.pci_path:
        rel = "/".join(("devices",) + dev.pci_path + (dev.address,))
        d = sys_dir / rel
        d.mkdir(parents=True, exist_ok=True)
        _link(sys_dir / "bus/pci/devices" / dev.address, f"../../../{rel}")
    else:
        d = sys_dir / "bus/pci/devices" / dev.address
        d.mkdir(parents=True, exist_ok=True)
    for name, value in (("class", dev.pci_class), ("vendor", dev.vendor), ("device", dev.device),
                        ("subsystem_vendor", dev.subsystem_vendor),
                        ("subsystem_device", dev.subsystem_device),
                        ("sriov_totalvfs", dev.sriov_totalvfs), ("sriov_numvfs", dev.sriov_numvfs)):
        if value not in (None, ""):
            _put(d / name, str(value))
    # Only a node the firmware reported is written; a derived one is left
    # for discovery to derive again from local_cpulist.
    _put(d / "numa_node", str(dev.numa_node if dev.numa_node_source == "numa_node" else -1))
    _put(d / "local_cpulist", dev.local_cpus.format())
    _put(d / "local_cpus", dev.local_cpus.format_mask())
    if dev.driver:
        _link(d / "driver", f"../../../bus/pci/drivers/{dev.driver}")
    if dev.physfn:
        _link(d / "physfn", f"../{dev.physfn}")
    for i, vf in enumerate(dev.virtfns):
        _link(d / f"virtfn{i}", f"../{vf}")
    children = ([f"net/{n}" for n in dev.net] + [f"block/{n}" for n in dev.block]
                + [f"infiniband/{n}" for n in dev.infiniband] + list(dev.other_children))
    for child in children:
        _put(d / child / "uevent", f"NAME={child.split('/')[-1]}")


def _write_proc(topo: Topology, proc_dir: Path) -> None:
    status = ["Name:\tnuma-agent", "State:\tR (running)"]
    if topo.allowed_cpus is not None:
        status.append(f"Cpus_allowed_list:\t{topo.allowed_cpus.format()}")
    if topo.allowed_mems is not None:
        status.append(f"Mems_allowed_list:\t{CpuSet(topo.allowed_mems).format()}")
    _put(proc_dir / "self" / "status", "\n".join(status))
    total_kb = sum(n.memory_total_bytes for n in topo.numa_nodes) // 1024
    free_kb = sum(n.memory_free_bytes for n in topo.numa_nodes) // 1024
    _put(proc_dir / "meminfo", f"MemTotal:       {total_kb} kB\nMemFree:        {free_kb} kB")
    if topo.kernel is not None:
        _put(proc_dir / "version", f"Linux version {topo.kernel} (builder@synthetic) #1 SMP")
    if topo.architecture in _CPUINFO_BY_ARCH:
        _put(proc_dir / "cpuinfo", "processor\t: 0\n" + _CPUINFO_BY_ARCH[topo.architecture])
