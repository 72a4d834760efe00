"""The kernel's free hugepages, read for one admission before it is decided.

Bookings say what the agent handed out; the kernel's counters say what is
still there. Pages a process the agent never admitted has taken (a hugetlbfs
mount, ``mmap(MAP_HUGETLB)``) are free by the bookings and gone in the kernel,
and a workload placed on them fails when it faults them in. So an admission
asking for hugepages reads ``free_hugepages`` of the nodes and sizes it asks
for (and ``resv_hugepages`` of those sizes), outside the service's lock, and
the pure core (`admission.memory_manager.kernel_available`) offers no more
than they leave. A request without hugepages reads nothing.

The kernel counts a booked page free until its workload faults it in, so the
core holds back the booked pages not known to be in use. Where a live
booking of one of those sizes has a cgroup (the cgroup enforcer), its
``hugetlb.<size>.numa_stat`` says how many of its pages are faulted in on
each node (as much of that as it booked there counts as in use); where it
has none (the affinity fallback, a cgroup without the hugetlb controller),
none of its pages is known in use. Only the holders of hugepages are looked
at: an index of them (`hugepage_holders`) is kept in the state's memo and
follows each admission and release, so the look costs the holders of
hugepages, not every live workload.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import KernelHugepages, hugepage_size_kb, hugepages_resource
from numa_agent.core.layered import Layered
from numa_agent.discovery.files import DiscoveryError
from numa_agent.discovery.sysfs import FreeHugepages
from numa_agent.enforcement.cgroup import hugetlb_size_name
from numa_agent.enforcement.plan import pod_relpath, workload_relpath
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.model import AgentState, FollowsChanges, Holder, Pod

log = logging.getLogger("numa_agent.service")

# Reads the counters of (node, page size kB) pairs: discovery.sysfs.read_free_hugepages
# under the agent's sysfs root (the live /sys or a simulated tree).
CounterReader = Callable[[tuple[tuple[int, int], ...]], FreeHugepages]


# The cgroup directory of a workload or pod (by its layout path), None where it has none:
# the enforcer's path_of.
CgroupPath = Callable[[str], "str | None"]


def counters_for(read: CounterReader | None, machine: Machine, request: AdmitRequest,
                 state: AgentState | None = None, cgroup_path: CgroupPath | None = None) -> KernelHugepages | None:
    """The counters `request` needs (its hugepages and its pod budget's), or None
    when it asks for none or nothing reads them; with `state` and `cgroup_path`,
    the pages of its live bookings of those sizes known in use. A counter that
    cannot be read is logged and the admission goes by its bookings, as before
    counters were read: refusing every hugepage request over a sysfs hiccup
    would be worse."""
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
    in_use = None
    if state is not None and cgroup_path is not None:
        in_use = booked_in_use(state, cgroup_path, sorted({size for _, size in pools}))
    return KernelHugepages(free=free, reserved=reserved, in_use=in_use)


def booked_in_use(state: AgentState, cgroup_path: CgroupPath, sizes_kb: Iterable[int]
                  ) -> tuple[tuple[int, int, int], ...]:
    """(node, page size kB, bytes) of the live bookings' hugepages known in use:
    per booking with a cgroup, what its ``hugetlb.<size>.numa_stat`` says is
    faulted in on each node, up to what it booked there (pages beyond that
    are not the booking's to count)."""
    sizes = tuple(sizes_kb)
    found: dict[tuple[int, int], int] = {}
    for relpath, holder in hugepage_holders(state).items():
        memory = holder.booking.memory
        for size in sizes:
            resource = hugepages_resource(size)
            booked = {n: per[resource] for n, per in memory.items() if per.get(resource)}
            if not booked:
                continue
            where = cgroup_path(relpath)
            if where is None:
                continue
            faulted = _faulted(os.path.join(where, f"hugetlb.{hugetlb_size_name(size)}.numa_stat"))
            for n, amount in booked.items():
                used = min(amount, faulted.get(n, 0))
                if used:
                    found[(n, size)] = found.get((n, size), 0) + used
    return tuple((n, size, b) for (n, size), b in sorted(found.items()))


_MEMO = "hugepage_holders"


def hugepage_holders(state: AgentState) -> Mapping[str, Holder]:
    """The top-level holders (pods, workloads outside pods) whose booking holds
    hugepages, by their cgroup's path in the layout. Kept in the state's memo
    and followed through admissions and releases (FollowsChanges): after the
    first look, an admission costs its change, not the number of live workloads."""
    kept = state.memo.get(_MEMO)
    if kept is None:
        kept = state.memo[_MEMO] = _HugepageHolders(Layered()).after((), list(state.top_level_holders()))
    return kept.holders


def _holds_hugepages(holder: Holder) -> bool:
    return any(amount and hugepage_size_kb(resource) is not None
               for per in holder.booking.memory.values() for resource, amount in per.items())


def _path_of(holder: Holder) -> str:
    return pod_relpath(holder) if isinstance(holder, Pod) else workload_relpath(holder)


@dataclass(frozen=True)
class _HugepageHolders(FollowsChanges):
    holders: Layered[str, Holder]

    def after(self, removed: Sequence[Holder], added: Sequence[Holder]) -> "_HugepageHolders":
        gone = [_path_of(h) for h in removed if _holds_hugepages(h)]
        came = {_path_of(h): h for h in added if _holds_hugepages(h)}
        if not gone and not came:
            return self  # the same value
        return _HugepageHolders(self.holders.updated(came, gone))


def _faulted(path: str) -> dict[int, int]:
    """Bytes per node from a cgroup v2 hugetlb ``numa_stat`` ("total=B N0=B
    N1=B": faulted-in pages of the whole subtree); {} when it is missing or
    unreadable (none known in use)."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return {}
    for line in lines:
        first, *pairs = line.split() or [""]
        if first.partition("=")[0] != "total":
            continue
        out = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key[:1] == "N" and key[1:].isdigit() and value.isdigit():
                out[int(key[1:])] = int(value)
        return out
    return {}
