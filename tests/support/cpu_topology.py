"""CpuTopology values the tests build by hand or read from the conformance
vectors, and the one question they ask of one that the agent never does."""

from __future__ import annotations

from typing import Iterable, Mapping

from numa_agent.admission.cpu_topology import CpuInfo, CpuTopology, CpuTopologyError
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask


def from_cpus(cpus: Iterable[CpuInfo]) -> CpuTopology:
    """Header counts derived from the CPUs themselves."""
    return CpuTopology.counted(cpus)


def from_vectors(entry: Mapping) -> CpuTopology:
    """A `topologies` entry of the conformance vectors:
    {"header": {"NumCPUs": .., ...}, "cpus": [{"cpu", "core", "socket", "numa", "uncore"}]}."""
    try:
        header = entry["header"]
        cpus = tuple(sorted(
            (CpuInfo(int(c["cpu"]), int(c["core"]), int(c["socket"]), int(c["numa"]),
                     int(c.get("uncore", 0))) for c in entry["cpus"]),
            key=lambda i: i.cpu,
        ))
        return CpuTopology(
            cpus=cpus,
            num_cpus=int(header["NumCPUs"]),
            num_cores=int(header["NumCores"]),
            num_sockets=int(header["NumSockets"]),
            num_numa_nodes=int(header.get("NumNUMANodes") or 0),
            num_uncore_caches=int(header.get("NumUncoreCache") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CpuTopologyError):
            raise
        raise CpuTopologyError(f"bad topology entry: {exc!r}") from None


def numas_of(topo: CpuTopology, cpus: CpuSet) -> NumaMask:
    """The NUMA nodes of `topo` holding at least one of `cpus`."""
    return NumaMask(n for n, node_cpus in topo.numa_cpus.items() if node_cpus.bits & cpus.bits)
