"""The kernel's free hugepages, read for one admission before it is decided.

Bookings say what the agent handed out; the kernel's counters say what is
still there. Pages a process the agent never admitted has taken (a hugetlbfs
mount, ``mmap(MAP_HUGETLB)``) are free by the bookings and gone in the kernel,
and a workload placed on them fails when it faults them in. So an admission
asking for hugepages reads ``free_hugepages`` of the nodes and sizes it asks
for (and ``resv_hugepages`` of those sizes), outside the service's lock, and
the pure core (`admission.memory_manager.kernel_available`) offers no more
than they leave. A request without hugepages reads nothing.
"""

from __future__ import annotations

import logging
from typing import Callable

from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import KernelHugepages
from numa_agent.discovery.files import DiscoveryError
from numa_agent.discovery.sysfs import FreeHugepages
from numa_agent.service.requests import AdmitRequest

log = logging.getLogger("numa_agent.service")

# Reads the counters of (node, page size kB) pairs: discovery.sysfs.read_free_hugepages
# under the agent's sysfs root (the live /sys or a simulated tree).
CounterReader = Callable[[tuple[tuple[int, int], ...]], FreeHugepages]


def counters_for(read: CounterReader | None, machine: Machine, request: AdmitRequest) -> KernelHugepages | None:
    """The counters `request` needs (its hugepages and its pod budget's), or None
    when it asks for none or nothing reads them. A counter that cannot be read
    is logged and the admission goes by its bookings, as before counters were
    read: refusing every hugepage request over a sysfs hiccup would be worse."""
    if read is None:
        return None
    sizes = [size for size, count in request.hugepages.items() if count]
    if request.pod_budget is not None:
        sizes += [size for size, count in request.pod_budget.hugepages.items() if count]
    try:
        pools = machine.hugepage_pools(int(size) for size in sizes)
    except ValueError:
        return None  # not a page size: the admission refuses the request itself
    if not pools:
        return None
    try:
        free, reserved = read(pools)
    except DiscoveryError as exc:
        log.warning("cannot read the kernel's free hugepages, deciding by the bookings alone: %s", exc)
        return None
    return KernelHugepages(free=free, reserved=reserved)
