"""The machine as discovery sees it: one immutable value.

Everything here is plain data plus derived views; nothing reads files. The
sysfs reader (numa_agent.discovery.sysfs) builds it; the managers only read it.
Ids are the kernel's: NUMA node ids may be sparse, package ids may be large
(PPTT offsets on ARM), and a NUMA node may have no CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import CPU_NODE, MEMORY_ONLY

UNKNOWN_NODE = -1


@dataclass(frozen=True, slots=True)
class Cpu:
    id: int
    online: bool
    numa_node: int  # UNKNOWN_NODE when the CPU is in no node
    package: int | None = None  # physical_package_id
    die: int | None = None  # die_id where the kernel has it
    cluster: int | None = None  # cluster_id where the kernel has it
    core_id: int | None = None  # raw core_id: NOT unique per package on every machine
    core: int | None = None  # machine-unique core index: lowest CPU id of the SMT sibling group
    siblings: CpuSet = CpuSet()  # SMT siblings incl. itself (thread_siblings / core_cpus)
    l3: int | None = None  # machine-unique L3 group index: lowest CPU id sharing the L3
    isolated: bool = False


@dataclass(frozen=True, slots=True)
class Cache:
    """One cache instance, as sysfs `cpuN/cache/indexM` describes it."""
    level: int
    type: str  # the kernel's word: "Data", "Instruction", "Unified" ("" if not given)
    id: int  # unique per level and type: the lowest CPU sharing it, as Cpu.l3
    cpus: CpuSet  # the online CPUs sharing it
    size_bytes: int | None = None  # None where the kernel gives no size

    @property
    def name(self) -> str:
        """lstopo's name: "L1d", "L1i", "L2", "L3"."""
        return f"L{self.level}" + {"Data": "d", "Instruction": "i"}.get(self.type, "")


@dataclass(frozen=True, slots=True)
class HugePages:
    size_kb: int
    total: int
    free: int
    surplus: int = 0

    @property
    def label(self) -> str:
        """"2048kB" as in sysfs directory names."""
        return f"{self.size_kb}kB"


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: CpuSet  # every CPU the kernel lists for the node (online or not)
    memory_total_bytes: int = 0
    memory_free_bytes: int = 0
    hugepages: tuple[HugePages, ...] = ()
    distances: Mapping[int, int] = field(default_factory=dict)  # node id -> distance

    def hugepage(self, size_kb: int) -> HugePages | None:
        for h in self.hugepages:
            if h.size_kb == size_kb:
                return h
        return None


@dataclass(frozen=True, slots=True)
class PciDevice:
    address: str  # "0000:3b:00.0"
    pci_class: str  # "0x030200"
    vendor: str  # "0x10de"
    device: str
    numa_node: int  # UNKNOWN_NODE when neither numa_node nor local_cpulist tells
    numa_node_source: str = "numa_node"  # "numa_node" | "local_cpulist" | "unknown"
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    driver: str | None = None
    local_cpus: CpuSet = CpuSet()
    physfn: str | None = None  # SR-IOV: the physical function's address (for a VF)
    virtfns: tuple[str, ...] = ()  # SR-IOV: the virtual functions' addresses (for a PF)
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    net: tuple[str, ...] = ()  # network interface names
    block: tuple[str, ...] = ()  # block device names (NVMe namespaces...)
    infiniband: tuple[str, ...] = ()
    other_children: tuple[str, ...] = ()  # other class children, "class/name"
    nvidia_minor: int | None = None  # the NVIDIA driver's "Device Minor": /dev/nvidia<minor>
    # Where the device sits in the PCI tree: its host bridge ("pci0000:80"), then each bridge
    # down to its parent ("0000:80:00.0", ...), the device itself left out. () when unknown
    # (a captured tree of plain directories). Two devices' common prefix is their deepest
    # shared ancestor: the longer, the closer (same switch > same root port > same host bridge).
    pci_path: tuple[str, ...] = ()

    @property
    def pci_root(self) -> str | None:
        """The host bridge the device is under ("pci0000:80"), None when unknown."""
        return self.pci_path[0] if self.pci_path else None


# No slots: the cached_property views below need an instance __dict__.
@dataclass(frozen=True)
class Topology:
    numa_nodes: tuple[NumaNode, ...]  # sorted by id
    cpus: tuple[Cpu, ...]  # sorted by id; every CPU with a cpuN dir or named by a node
    pci_devices: tuple[PciDevice, ...] = ()  # sorted by address
    allowed_cpus: CpuSet | None = None  # the agent's own cpuset; None = unrestricted
    allowed_mems: frozenset[int] | None = None
    architecture: str | None = None
    kernel: str | None = None
    caches: tuple[Cache, ...] = ()  # sorted by level, type, first CPU; () where sysfs has none

    # ---- derived views --------------------------------------------------
    @cached_property
    def _cpu_index(self) -> dict[int, Cpu]:
        return {c.id: c for c in self.cpus}

    def cpu(self, cpu_id: int) -> Cpu:
        return self._cpu_index[cpu_id]

    @cached_property
    def _node_index(self) -> dict[int, NumaNode]:
        return {n.id: n for n in self.numa_nodes}

    def node(self, node_id: int) -> NumaNode:
        return self._node_index[node_id]

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.numa_nodes)

    @cached_property
    def online_cpus(self) -> CpuSet:
        return CpuSet(c.id for c in self.cpus if c.online)

    @cached_property
    def allowed_online_cpus(self) -> CpuSet:
        """Online CPUs in a NUMA node and in the agent's cpuset."""
        cpus = CpuSet(c.id for c in self.cpus if c.online and c.numa_node != UNKNOWN_NODE)
        if self.allowed_cpus is not None:
            cpus = cpus & self.allowed_cpus
        return cpus

    @cached_property
    def usable_node_ids(self) -> tuple[int, ...]:
        """The NUMA nodes the agent may use: those whose memory its cpuset
        allows, and nodes without memory holding a CPU it may use (the kernel
        never lists a memory-less node in a cpuset's mems; its CPUs take
        memory from other nodes anyway)."""
        if self.allowed_mems is None:
            return self.node_ids
        with_cpus = {self.cpu(c).numa_node for c in self.allowed_online_cpus}
        return tuple(n.id for n in self.numa_nodes
                     if n.id in self.allowed_mems or (n.memory_total_bytes <= 0 and n.id in with_cpus))

    @cached_property
    def usable_cpus(self) -> CpuSet:
        """The CPUs the agent may hand out: online, in its cpuset, in a usable
        node. An allowed CPU of a node whose memory the cpuset excludes is
        left out: a workload there would never have local memory."""
        nodes = set(self.usable_node_ids)
        return CpuSet(c for c in self.allowed_online_cpus if self.cpu(c).numa_node in nodes)

    @cached_property
    def memory_only_node_ids(self) -> tuple[int, ...]:
        """Nodes with memory and none of the usable CPUs: GPU memory
        (Grace-Hopper, MI300A, POWER9 with NVLink), CXL expanders, or a node
        whose every CPU is offline or outside the agent's cpuset. No workload
        runs next to that memory, so it is far (and often another tier) for all."""
        with_cpus = {self.cpu(c).numa_node for c in self.usable_cpus}
        return tuple(n.id for n in self.numa_nodes if n.id not in with_cpus and n.memory_total_bytes > 0)

    def node_kind(self, node_id: int) -> str:
        """"memory-only" for a node of `memory_only_node_ids`, else "cpu"."""
        return MEMORY_ONLY if node_id in self.memory_only_node_ids else CPU_NODE

    def node_cpus(self, node_id: int, online_only: bool = True) -> CpuSet:
        if online_only:
            return CpuSet(c.id for c in self.cpus if c.online and c.numa_node == node_id)
        return self.node(node_id).cpus

    def distance(self, a: int, b: int) -> int:
        return self.node(a).distances.get(b, 10 if a == b else 20)

    @cached_property
    def packages(self) -> dict[int, CpuSet]:
        out: dict[int, set[int]] = {}
        for c in self.cpus:
            if c.online and c.package is not None:
                out.setdefault(c.package, set()).add(c.id)
        return {p: CpuSet(ids) for p, ids in sorted(out.items())}

    @cached_property
    def cores(self) -> tuple[CpuSet, ...]:
        """Every SMT sibling group among online CPUs, by first CPU."""
        groups = {c.siblings & self.online_cpus for c in self.cpus if c.online}
        return tuple(sorted((g for g in groups if g), key=lambda g: g.min()))

    @cached_property
    def l3_groups(self) -> dict[int, CpuSet]:
        out: dict[int, set[int]] = {}
        for c in self.cpus:
            if c.online and c.l3 is not None:
                out.setdefault(c.l3, set()).add(c.id)
        return {k: CpuSet(v) for k, v in sorted(out.items())}

    @cached_property
    def _caches_of_cpu(self) -> dict[int, tuple[Cache, ...]]:
        out: dict[int, list[Cache]] = {}
        for cache in self.caches:
            for cpu in cache.cpus:
                out.setdefault(cpu, []).append(cache)
        return {cpu: tuple(found) for cpu, found in out.items()}

    def cpu_caches(self, cpu_id: int) -> tuple[Cache, ...]:
        """The caches a CPU uses, in `caches` order (L1 first)."""
        return self._caches_of_cpu.get(cpu_id, ())

    def device(self, address: str) -> PciDevice:
        for d in self.pci_devices:
            if d.address == address:
                return d
        raise KeyError(address)
