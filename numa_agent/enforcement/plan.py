"""What the cgroup tree should look like for a state: a pure function.

Below the agent's cgroup root:

    agent/              the agent's own process (no-internal-process rule)
    shared/             the shared pool; cpuset = every CPU not held exclusively
    shared/<name>       a workload without exclusive CPUs (the pool's CPUs)
    shared/_released    processes left behind by a released workload
    wl-<name>/          a workload with exclusive CPUs
    pod-<pod>/          a pod budget
    pod-<pod>/<member>  a pod member: its exclusive CPUs, or the pod's shared part

Enforcement compares two layouts and applies the difference in a safe order
(see order_changes): CPUs leave their old holder before a new holder gets
them, and limits are written before any process moves in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from numa_agent.admission.admit import effective_cpus, shared_pool
from numa_agent.admission.machine import Machine
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import is_workload_name
from numa_agent.state.model import AgentState, Pod, Workload
from numa_agent.state.model import replace as replace_value

AGENT_CGROUP = "agent"
SHARED_CGROUP = "shared"
# Processes still running when their workload is released (an operator's
# `numa-agent release`, or numa-run failing to exec) move here: the shared
# pool. The leading underscore keeps it apart from workload names.
RELEASED_CGROUP = "shared/_released"
WORKLOAD_PREFIX = "wl-"
POD_PREFIX = "pod-"



@dataclass(frozen=True)
class CgroupSpec:
    relpath: str
    cpus: CpuSet
    mems: tuple[int, ...]
    memory_max: int | None = None  # bytes; None = "max"
    hugetlb_max: Mapping[int, int] = field(default_factory=dict)  # page size kB -> bytes
    workload: str | None = None  # the workload that lives here, if any
    pid: int | None = None  # its first process (the affinity fallback pins it)
    # The booking this cgroup carries as its record (record.py), written
    # before any process moves in and again whenever it changes.
    record: Workload | Pod | None = None


def safe_component(name: str) -> str:
    # Names are validated at the API; this is the last line of defence before
    # a name becomes a path component.
    if not is_workload_name(name):
        raise ValueError(f"unsafe cgroup name {name!r}")
    return name


def workload_relpath(w: Workload) -> str:
    name = safe_component(w.name)
    if w.pod is not None:
        return f"{POD_PREFIX}{safe_component(w.pod)}/{name}"
    if w.shared:
        return f"{SHARED_CGROUP}/{name}"
    return f"{WORKLOAD_PREFIX}{name}"


def _limits(w_request: Mapping, booking_memory: Mapping[int, Mapping[str, int]]):
    memory_max = int(w_request.get("memory_bytes") or 0) or None
    hugetlb: dict[int, int] = {}
    for per in booking_memory.values():
        for resource, amount in per.items():
            if resource.startswith("hugepages-") and resource.endswith("kB"):
                size_kb = int(resource[len("hugepages-"):-2])
                hugetlb[size_kb] = hugetlb.get(size_kb, 0) + amount
    # What was asked for, where less is booked (a pod member, whose pages come
    # out of its pod's budget; a recovery that found part of them taken).
    for size, count in (w_request.get("hugepages") or {}).items():
        asked = int(count) * int(size) * 1024
        hugetlb[int(size)] = max(hugetlb.get(int(size), 0), asked)
    return memory_max, hugetlb


def desired_layout(machine: Machine, state: AgentState) -> dict[str, CgroupSpec]:
    pool = shared_pool(machine, state)
    all_mems = machine.memory.memory_nodes.nodes() or machine.node_ids
    out: dict[str, CgroupSpec] = {
        AGENT_CGROUP: CgroupSpec(AGENT_CGROUP, pool, all_mems),
        SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, all_mems),
        RELEASED_CGROUP: CgroupSpec(RELEASED_CGROUP, pool, all_mems),
    }
    for pod in state.pods:
        rel = f"{POD_PREFIX}{safe_component(pod.name)}"
        memory_max, hugetlb = _limits(pod.request, pod.booking.memory)
        out[rel] = CgroupSpec(rel, pod.booking.cpus, pod.booking.mems or all_mems, memory_max, hugetlb,
                              # Members are found below it on recovery; left out, adding
                              # or releasing one does not rewrite the pod's cgroup.
                              record=replace_value(pod, members=()))
    for w in state.workloads:
        rel = workload_relpath(w)
        memory_max, hugetlb = _limits(w.request, w.booking.memory)
        # Always explicit: an empty cpuset.cpus would mean "every CPU of the
        # parent", so shared workloads get the pool written and rewritten.
        cpus = effective_cpus(machine, state, w)
        mems = w.booking.mems or all_mems
        out[rel] = CgroupSpec(rel, cpus, mems, memory_max, hugetlb, workload=w.name, pid=w.pid,
                              record=w)
    return out


@dataclass(frozen=True)
class Change:
    kind: str  # "shrink" | "remove" | "create" | "update" | "grow"
    spec: CgroupSpec | None
    relpath: str


def order_changes(old: Mapping[str, CgroupSpec], new: Mapping[str, CgroupSpec]) -> list[Change]:
    """The steps from `old` to `new`, in an order that never lets two cgroups
    hold the same exclusive CPU: shrink existing cpusets first, remove gone
    cgroups (deepest first), create new ones (parents first, limits before
    cpus), then grow existing cpusets."""
    shrinks, grows, updates, creates, removes = [], [], [], [], []
    for rel, spec in new.items():
        before = old.get(rel)
        if before is None:
            creates.append(Change("create", spec, rel))
            continue
        if before == spec:
            continue
        if spec.cpus != before.cpus:
            if spec.cpus.issubset(before.cpus):
                shrinks.append(Change("shrink", spec, rel))
            else:
                # Grow in two steps: drop what it loses now, gain the rest last.
                kept = spec.cpus & before.cpus
                if kept != before.cpus and kept:
                    shrinks.append(Change("shrink", replace(spec, cpus=kept), rel))
                grows.append(Change("grow", spec, rel))
        else:
            updates.append(Change("update", spec, rel))
    for rel in old:
        if rel not in new:
            removes.append(Change("remove", None, rel))
    depth = lambda c: c.relpath.count("/")  # noqa: E731
    removes.sort(key=lambda c: (-depth(c), c.relpath))
    creates.sort(key=lambda c: (depth(c), c.relpath))
    key = lambda c: c.relpath  # noqa: E731
    return [*sorted(shrinks, key=key), *removes, *sorted(updates, key=key), *creates,
            *sorted(grows, key=key)]
