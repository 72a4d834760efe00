"""What discovery sees, as JSON (the `topology --json` contract) and as text
(`numactl -H` followed by a per-node tree of packages, dies, L3 groups,
clusters, cores with their threads, and PCI devices).

Pure functions of a Topology value: no I/O, output independent of dict or
set iteration order.
"""

from __future__ import annotations

from typing import Iterable

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.topology import UNKNOWN_NODE, Cpu, NumaNode, PciDevice, Topology
from numa_agent.core.units import format_bytes

# Bridges carry no workload; the tree hides them (and says how many).
HIDDEN_CLASS_PREFIXES = ("0x0600", "0x0604")


def _nodes_text(ids: Iterable[int]) -> str:
    return CpuSet(ids).format()  # node ids share the kernel's list syntax


def _or_none(text: str | None) -> str | None:
    return text if text else None


# ---- JSON --------------------------------------------------------------------------

def topology_to_json(topo: Topology) -> dict:
    return {
        "architecture": topo.architecture,
        "kernel": topo.kernel,
        "online_cpus": topo.online_cpus.format(),
        "usable_cpus": topo.usable_cpus.format(),
        "allowed_cpus": None if topo.allowed_cpus is None else topo.allowed_cpus.format(),
        "allowed_mems": None if topo.allowed_mems is None else _nodes_text(topo.allowed_mems),
        "numa_nodes": [_node_json(topo, n) for n in topo.numa_nodes],
        "cpus": [_cpu_json(c) for c in topo.cpus],
        "packages": [{"id": p, "cpus": cpus.format()} for p, cpus in topo.packages.items()],
        "l3_groups": [{"id": g, "cpus": cpus.format()} for g, cpus in topo.l3_groups.items()],
        "pci_devices": [_device_json(d) for d in topo.pci_devices],
    }


def _node_json(topo: Topology, node: NumaNode) -> dict:
    return {
        "id": node.id,
        "cpus": node.cpus.format(),
        "online_cpus": topo.node_cpus(node.id).format(),
        "memory_total_bytes": node.memory_total_bytes,
        "memory_free_bytes": node.memory_free_bytes,
        "hugepages": {h.label: {"total": h.total, "free": h.free, "surplus": h.surplus}
                      for h in sorted(node.hugepages, key=lambda h: h.size_kb)},
        "distances": {str(k): node.distances[k] for k in sorted(node.distances)},
    }


def _cpu_json(cpu: Cpu) -> dict:
    return {
        "id": cpu.id,
        "online": cpu.online,
        "package": cpu.package,
        "die": cpu.die,
        "cluster": cpu.cluster,
        "core_id": cpu.core_id,
        "core": cpu.core,
        "numa_node": cpu.numa_node,
        "l3": cpu.l3,
        "siblings": cpu.siblings.format(),
        "isolated": cpu.isolated,
    }


def _device_json(dev: PciDevice) -> dict:
    return {
        "address": dev.address,
        "class": _or_none(dev.pci_class),
        "vendor": _or_none(dev.vendor),
        "device": _or_none(dev.device),
        "subsystem_vendor": dev.subsystem_vendor,
        "subsystem_device": dev.subsystem_device,
        "numa_node": dev.numa_node,
        "numa_node_source": dev.numa_node_source,
        "driver": dev.driver,
        "local_cpus": dev.local_cpus.format(),
        "physfn": dev.physfn,
        "virtfns": list(dev.virtfns),
        "sriov_totalvfs": dev.sriov_totalvfs,
        "sriov_numvfs": dev.sriov_numvfs,
        "net": list(dev.net),
        "block": list(dev.block),
        "infiniband": list(dev.infiniband),
        "other_children": list(dev.other_children),
    }


# ---- text ----------------------------------------------------------------------------

def render_text(topo: Topology) -> str:
    lines = _numactl_lines(topo)
    lines.append("")
    lines.extend(_tree_lines(topo))
    return "\n".join(lines) + "\n"


def _numactl_lines(topo: Topology) -> list[str]:
    ids = topo.node_ids
    lines = [f"available: {len(ids)} nodes ({_nodes_text(ids)})"]
    for node in topo.numa_nodes:
        lines.append(f"node {node.id} cpus: " + " ".join(str(c) for c in node.cpus))
        lines.append(f"node {node.id} size: {node.memory_total_bytes >> 20} MB")
        lines.append(f"node {node.id} free: {node.memory_free_bytes >> 20} MB")
    if any(n.distances for n in topo.numa_nodes):
        width = max(3, max(len(str(i)) for i in ids))
        lines.append("node distances:")
        lines.append("node " + " ".join(f"{i:>{width}}" for i in ids))
        for a in ids:
            lines.append(f"{a:>{width}}: " + " ".join(f"{topo.distance(a, b):>{width}}" for b in ids))
    return lines


def _key(value: int | None) -> tuple[bool, int]:
    return (value is None, value if value is not None else 0)


def _tree_lines(topo: Topology) -> list[str]:
    lines = []
    header = []
    if topo.architecture:
        header.append(topo.architecture)
    if topo.kernel:
        header.append(f"kernel {topo.kernel}")
    online = topo.online_cpus
    header.append(f"{len(online)} online CPUs, {len(topo.cores)} cores, "
                  f"{len(topo.packages)} packages, {len(topo.numa_nodes)} NUMA nodes")
    lines.append("machine: " + ", ".join(header))
    if topo.allowed_cpus is not None or topo.allowed_mems is not None:
        cpus = "all" if topo.allowed_cpus is None else topo.allowed_cpus.format()
        mems = "all" if topo.allowed_mems is None else _nodes_text(topo.allowed_mems)
        lines.append(f"agent cpuset: cpus {cpus or '(none)'}, mems {mems or '(none)'}; "
                     f"usable cpus {topo.usable_cpus.format() or '(none)'}")

    shown = [d for d in topo.pci_devices if not d.pci_class.startswith(HIDDEN_CLASS_PREFIXES)]
    hidden = len(topo.pci_devices) - len(shown)

    for node in topo.numa_nodes:
        lines.extend(_node_lines(topo, node, [d for d in shown if d.numa_node == node.id]))

    nodeless = CpuSet(c.id for c in topo.cpus if c.online and c.numa_node == UNKNOWN_NODE)
    if nodeless:
        lines.append(f"CPUs in no NUMA node: {nodeless.format()}")
        lines.extend(_cpu_tree(topo, nodeless, "  "))
    known = set(topo.node_ids)
    orphans = [d for d in shown if d.numa_node not in known]
    if orphans:
        lines.append("PCI devices with no known NUMA node:")
        lines.extend("  " + _device_text(d) for d in orphans)
    if hidden:
        lines.append(f"({hidden} PCI bridge{'s' if hidden != 1 else ''} hidden: classes 0x0600, 0x0604)")
    return lines


def _node_lines(topo: Topology, node: NumaNode, devices: list[PciDevice]) -> list[str]:
    online = topo.node_cpus(node.id)
    offline = node.cpus - online
    desc = [f"cpus {node.cpus.format() or '(none)'}"]
    if offline:
        desc.append(f"offline {offline.format()}")
    desc.append(f"memory {format_bytes(node.memory_total_bytes)} (free {format_bytes(node.memory_free_bytes)})")
    pools = [f"{h.label} {h.free}/{h.total} free" for h in sorted(node.hugepages, key=lambda h: h.size_kb)
             if h.total or h.free]
    if pools:
        desc.append("hugepages " + ", ".join(pools))
    lines = [f"NUMA node {node.id}: " + ", ".join(desc)]
    lines.extend(_cpu_tree(topo, online, "  "))
    if devices:
        lines.append("  PCI devices:")
        lines.extend("    " + _device_text(d) for d in devices)
    return lines


# What kernels write for a die or cluster they do not know: nothing, -1
# (arm64) or 65535 (x86, where cluster_id is 16 bits).
_NO_ID = (None, -1, 65535)


def _cpu_tree(topo: Topology, cpus: CpuSet, indent: str) -> list[str]:
    """package > die > L3 > cluster > core lines for the given online CPUs."""
    members = [topo.cpu(c) for c in cpus]
    lines: list[str] = []
    levels = (
        ("package", lambda c: c.package),
        ("die", lambda c: c.die),
        ("L3", lambda c: c.l3),
        ("cluster", lambda c: c.cluster),
    )

    def walk(group: list[Cpu], depth: int, pad: str) -> None:
        if depth == len(levels):
            cores: dict[int, list[int]] = {}
            for c in group:
                cores.setdefault(c.core if c.core is not None else c.id, []).append(c.id)
            for core in sorted(cores):
                threads = CpuSet(cores[core])
                lines.append(f"{pad}core {core}: threads {threads.format()}")
            return
        name, attr = levels[depth]
        values = sorted({attr(c) for c in group}, key=_key)
        if len(values) == 1 and values[0] in _NO_ID:
            walk(group, depth + 1, pad)  # this level is unknown here: skip it
            return
        for value in values:
            sub = [c for c in group if attr(c) == value]
            label = "?" if value is None else str(value)
            lines.append(f"{pad}{name} {label}: cpus {CpuSet(c.id for c in sub).format()}")
            walk(sub, depth + 1, pad + "  ")

    walk(members, 0, indent)
    return lines


def _device_text(dev: PciDevice) -> str:
    parts = [dev.address, f"class {dev.pci_class or '?'}"]
    if dev.vendor or dev.device:
        parts.append(f"{(dev.vendor or '?').removeprefix('0x')}:{(dev.device or '?').removeprefix('0x')}")
    if dev.driver:
        parts.append(f"driver {dev.driver}")
    for label, names in (("net", dev.net), ("block", dev.block), ("ib", dev.infiniband),
                         ("other", dev.other_children)):
        if names:
            parts.append(f"{label} {','.join(names)}")
    if dev.sriov_totalvfs is not None:
        parts.append(f"SR-IOV {dev.sriov_numvfs or 0}/{dev.sriov_totalvfs} VFs")
    if dev.physfn:
        parts.append(f"VF of {dev.physfn}")
    if dev.numa_node_source == "local_cpulist":
        parts.append("(node from local_cpulist)")
    return "  ".join(parts)
