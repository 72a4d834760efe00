"""What discovery sees, as JSON (the `topology --json` contract) and as text
(`numactl -H` followed by a per-node tree of packages, dies, shared caches,
clusters, cores with their own caches and threads, and PCI devices by the
names the OS and pci.ids give them).

Pure functions of a Topology value: no I/O, output independent of dict or
set iteration order.
"""

from __future__ import annotations

from typing import Callable, Iterable

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.pci import NO_NAMES, PciNames, device_kind, os_names
from numa_agent.core.topology import CPU_NODE, UNKNOWN_NODE, Cache, Cpu, NumaNode, PciDevice, Topology
from numa_agent.core.units import format_bytes


def _nodes_text(ids: Iterable[int]) -> str:
    return CpuSet(ids).format()  # node ids share the kernel's list syntax


def _or_none(text: str | None) -> str | None:
    return text if text else None


def restriction_text(topo: Topology) -> str | None:
    """What the agent's own cpuset leaves it, in one line (the topology tree
    and the start-up log); None when it is not restricted."""
    if topo.allowed_cpus is None and topo.allowed_mems is None:
        return None
    cpus = "all" if topo.allowed_cpus is None else topo.allowed_cpus.format()
    mems = "all" if topo.allowed_mems is None else _nodes_text(topo.allowed_mems)
    usable = topo.usable_cpus
    text = (f"agent cpuset: cpus {cpus or '(none)'}, mems {mems or '(none)'}; "
            f"usable cpus {usable.format() or '(none)'} on NUMA nodes "
            f"{_nodes_text(topo.usable_node_ids) or '(none)'}")
    left_out = topo.allowed_online_cpus - usable
    if left_out:
        nodes = _nodes_text({topo.cpu(c).numa_node for c in left_out})
        text += (f"; allowed CPUs {left_out.format()} not used: the memory of their node(s) {nodes} "
                 f"is outside the allowed mems, so they would never run on local memory")
    with_cpus = {topo.cpu(c).numa_node for c in usable}
    memory_only = [n for n in topo.usable_node_ids if n not in with_cpus and topo.node_cpus(n)]
    if memory_only:
        text += f"; node(s) {_nodes_text(memory_only)}: memory only, none of their CPUs is allowed"
    return text


# ---- JSON --------------------------------------------------------------------------

def topology_to_json(topo: Topology, names: PciNames = NO_NAMES) -> dict:
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
        "caches": [_cache_json(c) for c in topo.caches],
        "pci_devices": [_device_json(d, names) for d in topo.pci_devices],
    }


def _cache_json(cache: Cache) -> dict:
    return {
        "name": cache.name,
        "level": cache.level,
        "type": cache.type.lower() or None,
        "id": cache.id,
        "size_bytes": cache.size_bytes,
        "cpus": cache.cpus.format(),
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
        "kind": topo.node_kind(node.id),
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


def _device_json(dev: PciDevice, names: PciNames) -> dict:
    return {
        "address": dev.address,
        "class": _or_none(dev.pci_class),
        "vendor": _or_none(dev.vendor),
        "device": _or_none(dev.device),
        "kind": device_kind(dev),
        "os_names": list(os_names(dev)),
        "class_name": names.class_name(dev),
        "vendor_name": names.vendor_name(dev),
        "device_name": names.device_name(dev),
        "subsystem_vendor": dev.subsystem_vendor,
        "subsystem_device": dev.subsystem_device,
        "numa_node": dev.numa_node,
        "numa_node_source": dev.numa_node_source,
        "pci_root": dev.pci_root,
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

def render_text(topo: Topology, names: PciNames = NO_NAMES, all_devices: bool = False) -> str:
    """numactl -H's first block, then the tree. PCI devices of no KINDS
    (bridges, uncore, DMA engines ...) are counted, and listed only with
    `all_devices`."""
    lines = _numactl_lines(topo)
    lines.append("")
    lines.extend(_tree_lines(topo, names, all_devices))
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


def _tree_lines(topo: Topology, names: PciNames, all_devices: bool) -> list[str]:
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
    restriction = restriction_text(topo)
    if restriction:
        lines.append(restriction)

    shown = [d for d in topo.pci_devices if all_devices or device_kind(d) is not None]
    hidden = len(topo.pci_devices) - len(shown)

    def device_lines(devices: list[PciDevice], pad: str) -> list[str]:
        return [pad + _device_text(d, names) for d in devices]

    for node in topo.numa_nodes:
        lines.extend(_node_lines(topo, node))
        here = [d for d in shown if d.numa_node == node.id]
        if here:
            lines.append("  PCI devices:")
            lines.extend(device_lines(here, "    "))

    nodeless = CpuSet(c.id for c in topo.cpus if c.online and c.numa_node == UNKNOWN_NODE)
    if nodeless:
        lines.append(f"CPUs in no NUMA node: {nodeless.format()}")
        lines.extend(_cpu_tree(topo, nodeless, "  "))
    known = set(topo.node_ids)
    orphans = [d for d in shown if d.numa_node not in known]
    if orphans:
        lines.append("PCI devices with no known NUMA node:")
        lines.extend(device_lines(orphans, "  "))
    if hidden:
        lines.append(f"({hidden} other PCI device{'s' if hidden != 1 else ''} not shown: bridges, "
                     "uncore, DMA engines, USB, ...; --all-devices lists them)")
    return lines


def _node_lines(topo: Topology, node: NumaNode) -> list[str]:
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
    # Only the odd kind is named: a plain node reads as numactl's reader expects.
    kind = "" if topo.node_kind(node.id) == CPU_NODE else f" ({topo.node_kind(node.id)})"
    lines = [f"NUMA node {node.id}{kind}: " + ", ".join(desc)]
    lines.extend(_cpu_tree(topo, online, "  "))
    return lines


# What kernels write for a die or cluster they do not know: nothing, -1
# (arm64) or 65535 (x86, where cluster_id is 16 bits).
_NO_ID = (None, -1, 65535)


def _cpu_tree(topo: Topology, cpus: CpuSet, indent: str) -> list[str]:
    """package > die > shared caches of L3 and up > cluster > shared L2/L1
    > core lines for the given online CPUs; a core's own caches lead its line,
    as lstopo writes them: `L2 (2.0 MiB) + L1d (48.0 KiB) + core 0: threads 0,8`."""
    members = [topo.cpu(c) for c in cpus]
    lines: list[str] = []
    shared = {c for c in topo.caches if _spans_cores(topo, c)}
    cache_levels = sorted({(c.level, c.type) for c in shared}, reverse=True)
    levels: list[tuple[Callable[[Cpu], int | None], Callable[[int | None], str]]] = [
        (lambda c: c.package, lambda v: f"package {_id_text(v)}"),
        (lambda c: c.die, lambda v: f"die {_id_text(v)}"),
    ]
    levels.extend(_cache_level(topo, shared, level, kind) for level, kind in cache_levels if level >= 3)
    if not any(c.level == 3 for c in topo.caches):  # a Topology made without caches: its L3 groups
        levels.append((lambda c: c.l3, lambda v: f"L3 {_id_text(v)}"))
    levels.append((lambda c: c.cluster, lambda v: f"cluster {_id_text(v)}"))
    levels.extend(_cache_level(topo, shared, level, kind) for level, kind in cache_levels if level < 3)

    def walk(group: list[Cpu], depth: int, pad: str) -> None:
        if depth == len(levels):
            cores: dict[int, list[int]] = {}
            for c in group:
                cores.setdefault(c.core if c.core is not None else c.id, []).append(c.id)
            for core in sorted(cores):
                threads = CpuSet(cores[core])
                own = [x for x in topo.cpu_caches(threads.min()) if x not in shared]
                lead = "".join(f"{_cache_text(x)} + " for x in sorted(own, key=_core_cache_order))
                lines.append(f"{pad}{lead}core {core}: threads {threads.format()}")
            return
        attr, label = levels[depth]
        values = sorted({attr(c) for c in group}, key=_key)
        if len(values) == 1 and values[0] in _NO_ID:
            walk(group, depth + 1, pad)  # this level is unknown here: skip it
            return
        for value in values:
            sub = [c for c in group if attr(c) == value]
            if value is None and label(None) == "":
                walk(sub, depth + 1, pad)  # CPUs whose cache of this level is their core's own
                continue
            lines.append(f"{pad}{label(value)}: cpus {CpuSet(c.id for c in sub).format()}")
            walk(sub, depth + 1, pad + "  ")

    walk(members, 0, indent)
    return lines


def _id_text(value: int | None) -> str:
    return "?" if value is None else str(value)


def _spans_cores(topo: Topology, cache: Cache) -> bool:
    """A cache over more than one core is a level of the tree; a core's own
    caches lead its line."""
    return len({topo.cpu(c).core for c in cache.cpus}) > 1


def _cache_level(topo: Topology, shared: set[Cache], level: int, kind: str
                 ) -> tuple[Callable[[Cpu], int | None], Callable[[int | None], str]]:
    """The tree level of the shared caches of one level and type: a CPU's
    value is its cache's id, None where that cache is its core's own."""
    mine = {c.id: c for c in shared if (c.level, c.type) == (level, kind)}

    def attr(cpu: Cpu) -> int | None:
        return next((x.id for x in topo.cpu_caches(cpu.id)
                     if (x.level, x.type) == (level, kind) and x.id in mine), None)

    def label(value: int | None) -> str:
        if value is None:
            return ""
        return _cache_text(mine[value], value)

    return attr, label


def _core_cache_order(cache: Cache) -> tuple[int, str]:
    return (-cache.level, cache.type)  # L2, then L1d before L1i, as lstopo


def _cache_text(cache: Cache, cache_id: int | None = None) -> str:
    """"L2 (2.0 MiB)", "L3 0 (32.0 MiB)" with its id, "L2" where the kernel gives no size."""
    name = cache.name if cache_id is None else f"{cache.name} {cache_id}"
    return name if cache.size_bytes is None else f"{name} ({format_bytes(cache.size_bytes)})"


def _device_text(dev: PciDevice, names: PciNames) -> str:
    """`0000:02:00.0  eth0  Ethernet controller: Intel Corporation I350 ... [8086:1521]  driver igb
    host bridge pci0000:00`; without pci.ids `class 0x020000 [8086:1521]`."""
    parts = [dev.address]
    given = os_names(dev)
    if given:
        parts.append(",".join(given))
    parts.append(_device_description(dev, names))
    if dev.driver:
        parts.append(f"driver {dev.driver}")
    if dev.pci_root:
        parts.append(f"host bridge {dev.pci_root}")
    if dev.sriov_totalvfs is not None:
        parts.append(f"SR-IOV {dev.sriov_numvfs or 0}/{dev.sriov_totalvfs} VFs")
    if dev.physfn:
        parts.append(f"VF of {dev.physfn}")
    if dev.numa_node_source == "local_cpulist":
        parts.append("(node from local_cpulist)")
    return "  ".join(parts)


def _device_description(dev: PciDevice, names: PciNames) -> str:
    vendor_id, device_id = (dev.vendor or "?").removeprefix("0x"), (dev.device or "?").removeprefix("0x")
    text = names.class_name(dev) or f"class {dev.pci_class or '?'}"
    vendor = names.vendor_name(dev)
    if vendor is not None:
        text += f": {vendor} {names.device_name(dev) or 'device ' + device_id}"
    if dev.vendor or dev.device:
        text += f" [{vendor_id}:{device_id}]"
    return text

