"""Synthetic machines: pure builders of `Topology` values.

Benchmarks, property tests and end-to-end tests need machines of any shape
without a sysfs snapshot. The shapes follow what Linux reports on real
hardware so that code tuned on them behaves the same on the real thing:

- ``numbering="split"`` (Intel's usual enumeration): thread t of core c has
  CPU id ``c + t * total_cores``, so SMT siblings are i and i+N.
  ``numbering="interleaved"`` (AMD/ARM/POWER style): siblings are adjacent,
  CPU id ``c * threads_per_core + t``.
- NUMA distances: 10 local, 12 between nodes of one socket (sub-NUMA
  clustering), 21 between sockets.
- ``core`` is the lowest CPU id of the sibling group and ``l3`` the lowest
  CPU id sharing the L3, exactly as discovery computes them.
- caches (``with_caches``): L1d, L1i and L2 per core, the L3 per ``l3_per``
  group, sized like a current server part (``CACHE_SIZES``).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.topology import (
    UNKNOWN_NODE,
    Cache,
    Cpu,
    HugePages,
    NumaNode,
    PciDevice,
    Topology,
)

LOCAL_DISTANCE = 10
SAME_SOCKET_DISTANCE = 12
REMOTE_DISTANCE = 21
CPULESS_DISTANCE = 40  # memory-only nodes (GPU memory, CXL) sit far from everything

HUGEPAGE_2M_KB = 2048
HUGEPAGE_1G_KB = 1024 * 1024

# (level, type) -> bytes
CACHE_SIZES = {(1, "Data"): 48 << 10, (1, "Instruction"): 32 << 10, (2, "Unified"): 2 << 20,
               (3, "Unified"): 32 << 20}

# (pci_class, vendor, device, numa_node, driver)
DeviceSpec = tuple[str, str, str, int, "str | None"]


def make_topology(
    sockets: int = 2,
    nodes_per_socket: int = 1,
    cores_per_node: int = 4,
    threads_per_core: int = 2,
    memory_per_node_bytes: int = 64 << 30,
    hugepages_2m_per_node: int = 0,
    hugepages_1g_per_node: int = 0,
    numbering: str = "split",
    l3_per: str = "node",
    devices: Iterable[DeviceSpec | PciDevice] = (),
    *,
    node_ids: Sequence[int] | None = None,
    cpuless_node_ids: Sequence[int] = (),
    offline_cpus: Iterable[int] = (),
    allowed_cpus: CpuSet | None = None,
    allowed_mems: Iterable[int] | None = None,
    with_caches: bool = True,
) -> Topology:
    """Build a regular machine.

    Keyword-only extras for odd shapes: ``node_ids`` renames the CPU nodes
    (sparse ids, in socket order), ``cpuless_node_ids`` adds memory-only
    nodes, ``offline_cpus`` marks CPUs offline, ``allowed_*`` sets the
    agent's own cpuset (None = unrestricted).
    """
    _check_shape(sockets, nodes_per_socket, cores_per_node, threads_per_core, numbering, l3_per)
    cpu_nodes = sockets * nodes_per_socket
    node_ids, cpuless = _node_ids(cpu_nodes, node_ids, cpuless_node_ids)
    all_ids = node_ids + cpuless

    total_cores = cpu_nodes * cores_per_node

    def thread_id(core: int, thread: int) -> int:
        if numbering == "split":
            return core + thread * total_cores
        return core * threads_per_core + thread

    offline = CpuSet(offline_cpus)
    node_cpu_ids: dict[int, list[int]] = {n: [] for n in all_ids}
    socket_cpu_ids: dict[int, list[int]] = {s: [] for s in range(sockets)}
    # core index -> (node id, socket, sibling ids)
    core_layout = []
    for core in range(total_cores):
        node_index = core // cores_per_node
        socket = node_index // nodes_per_socket
        siblings = [thread_id(core, t) for t in range(threads_per_core)]
        core_layout.append((node_ids[node_index], socket, siblings))
        node_cpu_ids[node_ids[node_index]].extend(siblings)
        socket_cpu_ids[socket].extend(siblings)

    cpus = []
    for core, (node, socket, siblings) in enumerate(core_layout):
        l3_members = node_cpu_ids[node] if l3_per == "node" else socket_cpu_ids[socket]
        sibling_set = CpuSet(siblings)
        for cpu_id in siblings:
            cpus.append(Cpu(
                id=cpu_id,
                online=cpu_id not in offline,
                numa_node=node,
                package=socket,
                die=0,
                core_id=core % (nodes_per_socket * cores_per_node),
                core=sibling_set.min(),
                siblings=sibling_set,
                l3=min(l3_members),
            ))
    cpus.sort(key=lambda c: c.id)

    socket_of_node = {node_ids[i]: i // nodes_per_socket for i in range(cpu_nodes)}

    def distance(a: int, b: int) -> int:
        if a == b:
            return LOCAL_DISTANCE
        if a in cpuless or b in cpuless:
            return CPULESS_DISTANCE
        return SAME_SOCKET_DISTANCE if socket_of_node[a] == socket_of_node[b] else REMOTE_DISTANCE

    hugepages = (
        HugePages(HUGEPAGE_2M_KB, hugepages_2m_per_node, hugepages_2m_per_node),
        HugePages(HUGEPAGE_1G_KB, hugepages_1g_per_node, hugepages_1g_per_node),
    )
    reserved = hugepages_2m_per_node * (2 << 20) + hugepages_1g_per_node * (1 << 30)
    if reserved > memory_per_node_bytes:
        raise ValueError("hugepages per node exceed memory_per_node_bytes")
    nodes = tuple(
        NumaNode(
            id=n,
            cpus=CpuSet(node_cpu_ids[n]),
            memory_total_bytes=memory_per_node_bytes,
            memory_free_bytes=memory_per_node_bytes - reserved,
            hugepages=hugepages,
            distances={m: distance(n, m) for m in sorted(all_ids)},
        )
        for n in sorted(all_ids)
    )

    pci = tuple(sorted(
        (_device(i, spec, nodes) for i, spec in enumerate(devices)),
        key=lambda d: d.address,
    ))
    return Topology(
        numa_nodes=nodes,
        cpus=tuple(cpus),
        pci_devices=pci,
        allowed_cpus=allowed_cpus,
        allowed_mems=None if allowed_mems is None else frozenset(int(m) for m in allowed_mems),
        caches=_caches(cpus) if with_caches else (),
    )


def _caches(cpus: list[Cpu]) -> tuple[Cache, ...]:
    """Per-core L1d, L1i, L2 and the L3 groups, over online CPUs, as discovery
    merges them (an L3 id is its lowest CPU, online or not)."""
    groups: dict[tuple[int, str, int], list[int]] = {}
    for c in cpus:
        for level, kind in CACHE_SIZES:
            group_id = c.l3 if level == 3 else c.core
            if c.online and group_id is not None:
                groups.setdefault((level, kind, group_id), []).append(c.id)
    return tuple(Cache(level=level, type=kind, id=group_id, cpus=CpuSet(members),
                       size_bytes=CACHE_SIZES[(level, kind)])
                 for (level, kind, group_id), members in sorted(groups.items()))


def _check_shape(sockets: int, nodes_per_socket: int, cores_per_node: int, threads_per_core: int,
                 numbering: str, l3_per: str) -> None:
    if sockets < 1 or nodes_per_socket < 1 or cores_per_node < 1 or threads_per_core < 1:
        raise ValueError("sockets, nodes_per_socket, cores_per_node and threads_per_core must be >= 1")
    if numbering not in ("split", "interleaved"):
        raise ValueError(f"numbering must be 'split' or 'interleaved', got {numbering!r}")
    if l3_per not in ("node", "socket"):
        raise ValueError(f"l3_per must be 'node' or 'socket', got {l3_per!r}")


def _node_ids(cpu_nodes: int, node_ids: Sequence[int] | None,
              cpuless_node_ids: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The CPU nodes' ids and the memory-only nodes' ids, checked."""
    ids = tuple(range(cpu_nodes)) if node_ids is None else tuple(int(n) for n in node_ids)
    if len(ids) != cpu_nodes:
        raise ValueError(f"node_ids names {len(ids)} nodes, the shape has {cpu_nodes}")
    cpuless = tuple(int(n) for n in cpuless_node_ids)
    all_ids = ids + cpuless
    if len(set(all_ids)) != len(all_ids) or min(all_ids) < 0:
        raise ValueError(f"NUMA node ids must be distinct and >= 0, got {list(all_ids)}")
    return ids, cpuless


def with_node_memory(topo: Topology, node_id: int, total_bytes: int) -> Topology:
    """`topo` after node `node_id`'s memory became `total_bytes` (memory
    blocks onlined or offlined, a DIMM added, a balloon): what hotplug tests
    write as the changed machine."""
    nodes = tuple(dataclasses.replace(n, memory_total_bytes=total_bytes,
                                      memory_free_bytes=min(total_bytes, n.memory_free_bytes))
                  if n.id == node_id else n for n in topo.numa_nodes)
    return dataclasses.replace(topo, numa_nodes=nodes)


def make_numa_machine(numa_nodes: int, cpus_per_node: int, threads_per_core: int = 2) -> Topology:
    """One socket per NUMA node, `cpus_per_node` logical CPUs each, split numbering."""
    if cpus_per_node % threads_per_core:
        raise ValueError(
            f"cpus_per_node ({cpus_per_node}) must be a multiple of threads_per_core ({threads_per_core})"
        )
    return make_topology(
        sockets=numa_nodes,
        nodes_per_socket=1,
        cores_per_node=cpus_per_node // threads_per_core,
        threads_per_core=threads_per_core,
    )


def _device(index: int, spec: DeviceSpec | PciDevice, nodes: tuple[NumaNode, ...]) -> PciDevice:
    if isinstance(spec, PciDevice):
        return spec
    try:
        pci_class, vendor, device, numa_node, driver = spec
    except (TypeError, ValueError):
        raise ValueError(
            f"device #{index} must be (pci_class, vendor, device, numa_node, driver), got {spec!r}"
        ) from None
    node_cpus = {n.id: n.cpus for n in nodes}
    if numa_node != UNKNOWN_NODE and numa_node not in node_cpus:
        raise ValueError(f"device #{index} is on NUMA node {numa_node}, which the machine lacks")
    if index > 0xFE:
        raise ValueError("at most 255 synthetic devices (one per PCI bus)")
    return PciDevice(
        address=f"0000:{index + 1:02x}:00.0",
        pci_class=pci_class,
        vendor=vendor,
        device=device,
        numa_node=numa_node,
        numa_node_source="numa_node" if numa_node != UNKNOWN_NODE else "unknown",
        driver=driver,
        local_cpus=node_cpus.get(numa_node, CpuSet()),
    )
