"""The CPU manager's view of the machine: one record per online CPU of the
NUMA nodes the agent may use.

The static policy reasons over four groupings of CPUs (core, socket, NUMA
node, uncore/L3 cache) plus the kubelet's header counts. The header counts are
kept as given (not recomputed) because the kubelet's choices depend on them:
NUMA nodes are taken before sockets iff ``num_sockets >= num_numa_nodes``, a
socket is wholly free iff its free CPUs equal ``num_cpus // num_sockets``, and
so on. Built from a discovered `Topology` they simply match the machine.

Every grouping is precomputed once as CpuSet bitmasks, so "free CPUs of node
N" is one AND and one popcount on 1024-CPU machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.core.topology import Topology


class CpuTopologyError(ValueError):
    """A CPU topology description that cannot be used."""


@dataclass(frozen=True, slots=True)
class CpuInfo:
    cpu: int
    core: int
    socket: int
    numa: int
    uncore: int


def _group(cpus: tuple[CpuInfo, ...], field: str) -> dict[int, CpuSet]:
    bits: dict[int, int] = {}
    for info in cpus:
        key = getattr(info, field)
        bits[key] = bits.get(key, 0) | (1 << info.cpu)
    return {k: CpuSet.from_bits(bits[k]) for k in sorted(bits)}


def _relation(cpus: tuple[CpuInfo, ...], parent: str, child: str) -> dict[int, tuple[int, ...]]:
    """parent id -> sorted ids of the children that share at least one CPU."""
    out: dict[int, set[int]] = {}
    for info in cpus:
        out.setdefault(getattr(info, parent), set()).add(getattr(info, child))
    return {k: tuple(sorted(v)) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class CpuTopology:
    cpus: tuple[CpuInfo, ...]  # sorted by CPU id
    num_cpus: int
    num_cores: int
    num_sockets: int
    num_numa_nodes: int
    num_uncore_caches: int

    def __post_init__(self) -> None:
        ids = [c.cpu for c in self.cpus]
        if ids != sorted(set(ids)):
            raise CpuTopologyError("CPU ids must be unique and sorted")
        for name in ("num_cpus", "num_cores", "num_sockets", "num_numa_nodes", "num_uncore_caches"):
            if getattr(self, name) < 0:
                raise CpuTopologyError(f"{name} must be >= 0, got {getattr(self, name)}")

    # ---- constructors ---------------------------------------------------
    @classmethod
    def from_topology(cls, topo: Topology) -> "CpuTopology":
        """Online CPUs of the NUMA nodes the agent may use, those outside its
        cpuset included: like reserved CPUs they keep cores and sockets whole
        (an SMT sibling outside the cpuset is not a free core), while the
        callers' available sets hold only usable CPUs. A node the agent may
        not use is not here at all, so no hint ever names it. The uncore group
        is the L3 group, or the package on machines that report no L3."""
        nodes = set(topo.usable_node_ids)
        infos = []
        for c in topo.cpus:
            if not c.online or c.numa_node not in nodes:
                continue
            socket = c.package if c.package is not None else 0
            infos.append(CpuInfo(
                cpu=c.id,
                core=c.core if c.core is not None else c.id,
                socket=socket,
                numa=c.numa_node,
                uncore=c.l3 if c.l3 is not None else socket,
            ))
        return cls.counted(infos)

    @classmethod
    def counted(cls, cpus: Iterable[CpuInfo]) -> "CpuTopology":
        """The CPUs in id order, with the header counts derived from them."""
        infos = tuple(sorted(cpus, key=lambda i: i.cpu))
        return cls(
            cpus=infos,
            num_cpus=len(infos),
            num_cores=len({i.core for i in infos}),
            num_sockets=len({i.socket for i in infos}),
            num_numa_nodes=len({i.numa for i in infos}),
            num_uncore_caches=len({i.uncore for i in infos}),
        )

    # ---- header-derived ratios (integer division, like the kubelet) -------
    @property
    def cpus_per_core(self) -> int:
        return max(1, self.num_cpus // self.num_cores) if self.num_cores else 1

    @property
    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else self.num_cpus

    @property
    def cpus_per_uncore(self) -> int:
        # A header without uncore caches means one cache for the whole machine.
        return self.num_cpus // self.num_uncore_caches if self.num_uncore_caches else self.num_cpus

    @property
    def numa_first(self) -> bool:
        """Whether NUMA nodes sit above sockets in the kubelet's take order."""
        return self.num_sockets >= self.num_numa_nodes

    # ---- groupings ------------------------------------------------------
    @cached_property
    def info(self) -> dict[int, CpuInfo]:
        return {c.cpu: c for c in self.cpus}

    @cached_property
    def all_cpus(self) -> CpuSet:
        return CpuSet(c.cpu for c in self.cpus)

    @cached_property
    def core_cpus(self) -> dict[int, CpuSet]:
        return _group(self.cpus, "core")

    @cached_property
    def socket_cpus(self) -> dict[int, CpuSet]:
        return _group(self.cpus, "socket")

    @cached_property
    def numa_cpus(self) -> dict[int, CpuSet]:
        return _group(self.cpus, "numa")

    @cached_property
    def uncore_cpus(self) -> dict[int, CpuSet]:
        return _group(self.cpus, "uncore")

    @cached_property
    def group_bits(self) -> dict[str, dict[int, int]]:
        """The groupings as raw bitmasks, for the allocator's inner loops."""
        return {level: {k: v.bits for k, v in groups.items()}
                for level, groups in (("numa", self.numa_cpus), ("socket", self.socket_cpus),
                                      ("core", self.core_cpus), ("uncore", self.uncore_cpus))}

    @cached_property
    def numa_of_cpu(self) -> dict[int, int]:
        """CPU id -> its NUMA node: which one node a set of CPUs may lie in."""
        return {c.cpu: c.numa for c in self.cpus}

    @cached_property
    def core_size(self) -> int:
        """CPUs in every core when all cores are as large (0: they differ)."""
        sizes = {bits.bit_count() for bits in self.group_bits["core"].values()}
        return sizes.pop() if len(sizes) == 1 else 0

    @cached_property
    def numa_bits_by_node_bit(self) -> tuple[tuple[int, int], ...]:
        """(1 << node, the node's CPUs as bits) per NUMA node: what the hint
        generation counts free CPUs over, made once."""
        return tuple((1 << node, bits) for node, bits in self.group_bits["numa"].items())

    @cached_property
    def smallest_group(self) -> dict[str, int]:
        """CPUs in the smallest group of each grouping (0: none): a request for
        fewer CPUs never takes a group of that level whole."""
        return {level: min((bits.bit_count() for bits in groups.values()), default=0)
                for level, groups in self.group_bits.items()}

    @property
    def numa_ids(self) -> tuple[int, ...]:
        return tuple(self.numa_cpus)

    @property
    def socket_ids(self) -> tuple[int, ...]:
        return tuple(self.socket_cpus)

    @property
    def core_ids(self) -> tuple[int, ...]:
        return tuple(self.core_cpus)

    @property
    def uncore_ids(self) -> tuple[int, ...]:
        return tuple(self.uncore_cpus)

    @cached_property
    def numa_mask(self) -> NumaMask:
        return NumaMask(self.numa_ids)

    @cached_property
    def sockets_of_numa(self) -> dict[int, tuple[int, ...]]:
        return _relation(self.cpus, "numa", "socket")

    @cached_property
    def numas_of_socket(self) -> dict[int, tuple[int, ...]]:
        return _relation(self.cpus, "socket", "numa")

    @cached_property
    def cores_of_socket(self) -> dict[int, tuple[int, ...]]:
        return _relation(self.cpus, "socket", "core")

    @cached_property
    def cores_of_numa(self) -> dict[int, tuple[int, ...]]:
        return _relation(self.cpus, "numa", "core")

    @cached_property
    def cores_of_uncore(self) -> dict[int, tuple[int, ...]]:
        return _relation(self.cpus, "uncore", "core")

    @cached_property
    def uncores_of_numa(self) -> dict[int, tuple[int, ...]]:
        return _relation(self.cpus, "numa", "uncore")

    def cpus_of_numas(self, nodes: Iterable[int]) -> CpuSet:
        bits = 0
        for n in nodes:
            cpus = self.numa_cpus.get(n)
            if cpus is not None:
                bits |= cpus.bits
        return CpuSet.from_bits(bits)

    def cpus_of_sockets(self, sockets: Iterable[int]) -> CpuSet:
        bits = 0
        for s in sockets:
            cpus = self.socket_cpus.get(s)
            if cpus is not None:
                bits |= cpus.bits
        return CpuSet.from_bits(bits)

    def sockets_of_numas(self, nodes: Iterable[int]) -> tuple[int, ...]:
        out: set[int] = set()
        for n in nodes:
            out.update(self.sockets_of_numa.get(n, ()))
        return tuple(sorted(out))

    def whole_core_cpus(self, available: CpuSet) -> CpuSet:
        """The CPUs of every core whose CPUs are all in `available`."""
        bits = available.bits
        out = 0
        for cpus in self.core_cpus.values():
            if cpus.bits & bits == cpus.bits:
                out |= cpus.bits
        return CpuSet.from_bits(out)

    @cached_property
    def _node_sizes_desc(self) -> tuple[int, ...]:
        sizes = sorted((len(c) for c in self.numa_cpus.values()), reverse=True)
        prefix, total = [], 0
        for s in sizes:
            total += s
            prefix.append(total)
        return tuple(prefix)

    def min_nodes_for(self, request: int) -> int:
        """Fewest NUMA nodes whose CPUs (free or not) could hold `request`;
        every node when even the whole machine cannot (the kubelet's rule)."""
        for k, total in enumerate(self._node_sizes_desc, start=1):
            if total >= request:
                return k
        return len(self._node_sizes_desc)
