"""Benchmark (a script, not a test): CPU hints and allocation on a 64-node,
1024-CPU machine. Run: python benchmarks/cpu_manager_micro.py"""

import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numa_agent.admission.cpu_manager import CpuManagerOptions, allocate_cpus, cpu_hints  # noqa: E402
from numa_agent.admission.cpu_topology import CpuTopology  # noqa: E402
from numa_agent.core.hints import NumaMask  # noqa: E402
from tests.support.synthetic import make_topology  # noqa: E402


def timed(label, fn, repeat=20):
    start = time.perf_counter()
    for _ in range(repeat):
        result = fn()
    per_call = (time.perf_counter() - start) / repeat
    print(f"{label:<60} {per_call * 1000:8.2f} ms")
    return result


def _fits_many(hint_set, mask, times):
    return [hint_set.fits(mask) for _ in range(times)]


def main():
    start = time.perf_counter()
    topo = CpuTopology.from_topology(make_topology(sockets=2, nodes_per_socket=32, cores_per_node=8))
    _ = topo.core_cpus, topo.numa_cpus, topo.socket_cpus, topo.uncore_cpus, topo.cores_of_socket
    print(f"{'CpuTopology.from_topology + groupings (64 nodes, 1024 CPUs)':<60} "
          f"{(time.perf_counter() - start) * 1000:8.2f} ms")
    free = topo.all_cpus
    packed = CpuManagerOptions()
    for request in (4, 40, 300):
        hint_set = timed(f"cpu_hints request={request}", partial(cpu_hints, topo, free, request, packed))
        mask = NumaMask(range(hint_set.min_size))
        timed(f"  fits() on a {hint_set.min_size}-node mask x1000",
              partial(_fits_many, hint_set, mask, 1000), repeat=5)
        timed(f"  allocate_cpus packed request={request}",
              partial(allocate_cpus, topo, free, request, mask, packed))
        timed(f"  allocate_cpus distributed request={request}",
              partial(allocate_cpus, topo, free, request, None,
                      CpuManagerOptions(distribute_cpus_across_numa=True, full_pcpus_only=True)),
              repeat=3)
    # A fragmented machine: every other core busy.
    half = topo.whole_core_cpus(free) - topo.cpus_of_numas(range(0, 64, 2))
    timed("allocate_cpus packed request=100, half the nodes busy",
          lambda: allocate_cpus(topo, half, 100, None, packed))


if __name__ == "__main__":
    main()
