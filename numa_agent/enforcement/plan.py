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

An admission or release changes one workload (and perhaps its pod and the
pool): `update_layout` derives the next layout from the previous one by
recomputing only what depends on those, and names the paths that may differ,
so the cost of a change does not grow with the number of workloads (except
when the shared pool itself changes, which every plain shared workload
follows). It equals `desired_layout` of the new state.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Collection, Iterable, Iterator, Mapping, NamedTuple, TypeVar

from numa_agent.admission.admit import effective_cpus, shared_pool
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import hugepage_size_kb
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.layered import Layered
from numa_agent.core.names import is_engine_cgroup, is_workload_name
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
# A workload pinned inside an engine's cgroup it shares (Workload.pinned_in):
# no cgroup of its own, so its path names no directory ("pinned/<name>").
PINNED_PREFIX = "pinned/"



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
    # cpuset.cpus is left empty: cgroup v2 then gives the cgroup its parent's
    # effective CPUs, so a plain shared workload follows the pool without a
    # write of its own when the pool changes. `cpus` is still what its
    # effective set must be (and what the affinity fallback pins).
    inherit: bool = False


def safe_component(name: str) -> str:
    # Names are validated at the API; this is the last line of defence before
    # a name becomes a path component.
    if not is_workload_name(name):
        raise ValueError(f"unsafe cgroup name {name!r}")
    return name


def workload_relpath(w: Workload) -> str:
    if w.pinned_in is not None:
        return f"{PINNED_PREFIX}{safe_component(w.name)}"
    if w.cgroup is not None:
        return w.cgroup  # an engine's (CgroupV2.path checks it)
    name = safe_component(w.name)
    if w.pod is not None:
        return f"{POD_PREFIX}{safe_component(w.pod)}/{name}"
    if w.shared:
        return f"{SHARED_CGROUP}/{name}"
    return f"{WORKLOAD_PREFIX}{name}"


def is_pinned(relpath: str) -> bool:
    """The path of a workload pinned inside a cgroup it shares: the affinity of its
    process, not a cgroup, holds its booking."""
    return relpath.startswith(PINNED_PREFIX)


def engine_held(w: Workload) -> str | None:
    """The engine cgroup `w` is booked on, or pinned inside (listed once for each
    workload pinned there: a release takes one out)."""
    return w.cgroup if w.cgroup is not None else w.pinned_in


def engine_clash(booked: list[str], cgroup: str) -> str | None:
    """The engine cgroup among `booked` (sorted) that is `cgroup`, above it or
    below it; None when there is none. O(depth log N)."""
    parts = cgroup.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        path = "/" + "/".join(parts[:depth])
        i = bisect.bisect_left(booked, path)
        if i < len(booked) and booked[i] == path:
            return path
    # Below it: the paths that start with it and a "/" are together in sorted order.
    below = cgroup.rstrip("/") + "/"
    i = bisect.bisect_left(booked, below)
    return booked[i] if i < len(booked) and booked[i].startswith(below) else None


def _limits(w_request: Mapping, booking_memory: Mapping[int, Mapping[str, int]]):
    memory_max = int(w_request.get("memory_bytes") or 0) or None
    hugetlb: dict[int, int] = {}
    for per in booking_memory.values():
        for resource, amount in per.items():
            size_kb = hugepage_size_kb(resource)
            if size_kb is not None:
                hugetlb[size_kb] = hugetlb.get(size_kb, 0) + amount
    # What was asked for, where less is booked (a pod member, whose pages come
    # out of its pod's budget; a recovery that found part of them taken).
    for size, count in (w_request.get("hugepages") or {}).items():
        asked = int(count) * int(size) * 1024
        hugetlb[int(size)] = max(hugetlb.get(int(size), 0), asked)
    return memory_max, hugetlb


def _all_mems(machine: Machine) -> tuple[int, ...]:
    return machine.memory.memory_nodes.nodes() or machine.node_ids


def _pool_specs(machine: Machine, state: AgentState) -> dict[str, CgroupSpec]:
    pool = shared_pool(machine, state)
    all_mems = _all_mems(machine)
    return {rel: CgroupSpec(rel, pool, all_mems) for rel in (AGENT_CGROUP, SHARED_CGROUP, RELEASED_CGROUP)}


def pod_relpath(pod: Pod) -> str:
    return f"{POD_PREFIX}{safe_component(pod.name)}"


def _pod_spec(machine: Machine, pod: Pod) -> CgroupSpec:
    rel = pod_relpath(pod)
    memory_max, hugetlb = _limits(pod.request, pod.booking.memory)
    return CgroupSpec(rel, pod.booking.cpus, pod.booking.mems or _all_mems(machine), memory_max, hugetlb,
                      # Members are found below it on recovery; left out, adding
                      # or releasing one does not rewrite the pod's cgroup.
                      record=replace_value(pod, members=()))


def runtime_enforced(state: AgentState, holder: Workload | Pod | None) -> bool:
    """A container its runtime enforces (NRI), or a pod of such containers (a
    pod's members are all or none of them): it has no cgroup of the agent's
    and the agent never writes one for it. Its exclusive CPUs still leave the
    shared pool (`shared_pool` reads every booking)."""
    if isinstance(holder, Workload):
        return holder.runtime is not None
    if holder is None or not holder.members:
        return False
    member = state.workload(holder.members[0])
    return member is not None and member.runtime is not None


def _follows_pool(w: Workload) -> bool:
    """Runs on the whole shared pool: its cgroup inherits the pool's CPUs."""
    return w.shared and w.pod is None and not w.cpunodebind and w.cgroup is None and w.pinned_in is None


def _workload_spec(machine: Machine, state: AgentState, w: Workload) -> CgroupSpec:
    rel = workload_relpath(w)
    memory_max, hugetlb = _limits(w.request, w.booking.memory)
    # A plain shared workload leaves cpuset.cpus empty and inherits shared/'s
    # CPUs (the pool). The others are explicit: a pod member's shared part
    # and a --cpunodebind restriction are narrower than their parent's set,
    # and an exclusive workload's set is its own.
    cpus = effective_cpus(machine, state, w)
    mems = w.booking.mems or _all_mems(machine)
    return CgroupSpec(rel, cpus, mems, memory_max, hugetlb, workload=w.name, pid=w.pid,
                      record=w, inherit=_follows_pool(w))


class CgroupLayout(Layered[str, CgroupSpec]):
    """A layout: the spec of every cgroup by path, immutable.

    A spec that inherits the pool (`inherit`) reads with the CPUs of the
    pool's spec (`shared/`), whatever the pool was when it was laid out: a
    change of the pool is one entry, not one per workload on it, as it is one
    write in the cgroup tree. The paths of the workloads bound to part of
    the pool (--cpunodebind), made again when it changes, are kept with it."""

    __slots__ = ("_bound",)

    def __init__(self, items: Mapping[str, CgroupSpec] | Iterable[tuple[str, CgroupSpec]] = ()) -> None:
        super().__init__(items)
        self._bound = frozenset(rel for rel, spec in Layered._items(self) if _bound_to_pool(spec))

    def _resolved(self, spec: CgroupSpec) -> CgroupSpec:
        if spec.inherit:
            pool = Layered.get(self, SHARED_CGROUP)
            if pool is not None and pool.cpus != spec.cpus:
                return _with_cpus(spec, pool.cpus)
        return spec

    def __getitem__(self, relpath: str) -> CgroupSpec:
        return self._resolved(Layered.__getitem__(self, relpath))

    def get(self, relpath: str, default: CgroupSpec | None = None) -> CgroupSpec | None:  # type: ignore[override]
        spec = Layered.get(self, relpath)
        return default if spec is None else self._resolved(spec)

    def _items(self) -> Iterator[tuple[str, CgroupSpec]]:
        for rel, spec in Layered._items(self):
            yield rel, self._resolved(spec)

    def bound(self) -> list[str]:
        """Names of the workloads on part of the pool (written explicitly)."""
        specs = (Layered.__getitem__(self, rel) for rel in sorted(self._bound))
        return [spec.workload for spec in specs if spec.workload]

    def followers(self) -> list[str]:
        """Paths of the cgroups that inherit the pool."""
        return [rel for rel, spec in Layered._items(self) if spec.inherit]

    def updated(self, changes: Mapping[str, CgroupSpec] = {}, removed: Iterable[str] = ()) -> "CgroupLayout":  # noqa: B006
        removed = list(removed)
        out = super().updated(changes, removed)
        assert isinstance(out, CgroupLayout)
        # Kept, not copied, unless this change adds or drops one: an admission that
        # leaves the pool alone costs nothing for a thousand shared containers.
        bound = self._bound
        drop = bound.intersection(removed).union(rel for rel, spec in changes.items()
                                                 if rel in bound and not _bound_to_pool(spec))
        add = [rel for rel, spec in changes.items() if rel not in bound and _bound_to_pool(spec)]
        out._bound = bound.difference(drop).union(add) if drop or add else bound
        return out


def _bound_to_pool(spec: CgroupSpec) -> bool:
    # A shared workload below the pool that does not inherit it (--cpunodebind),
    # or one in an engine's cgroup, which is not below shared/ (the pool is
    # written into it).
    if spec.workload is None or spec.inherit:
        return False
    if spec.relpath.startswith(SHARED_CGROUP + "/"):
        return True
    return is_engine_cgroup(spec.relpath) and isinstance(spec.record, Workload) and spec.record.shared


def desired_layout(machine: Machine, state: AgentState) -> CgroupLayout:
    out = _pool_specs(machine, state)
    for pod in state.pods:
        if not runtime_enforced(state, pod):
            spec = _pod_spec(machine, pod)
            out[spec.relpath] = spec
    for w in state.workloads:
        if w.runtime is None:
            spec = _workload_spec(machine, state, w)
            out[spec.relpath] = spec
    return CgroupLayout(out)


def pool_followers(old: Mapping[str, CgroupSpec], new: Mapping[str, CgroupSpec]) -> list[str]:
    """The cgroups of `new` that inherit the pool, when its CPUs differ from
    those of `old`: their specs changed with it, though `update_layout` does
    not name them (a cgroup tree moves them by itself; the affinity fallback
    must re-pin each)."""
    before, after = old.get(SHARED_CGROUP), new.get(SHARED_CGROUP)
    if before is not None and after is not None and before.cpus == after.cpus:
        return []
    if isinstance(new, CgroupLayout):
        return new.followers()
    return [rel for rel, spec in new.items() if spec.inherit]


def update_layout(machine: Machine, old_layout: Mapping[str, CgroupSpec], old_state: AgentState,
                  new_state: AgentState, workloads: Iterable[str], pods: Iterable[str] = (),
                  ) -> tuple[CgroupLayout, frozenset[str]]:
    """The layout of `new_state`, from `old_layout` (the layout of `old_state`
    on the same machine) and the names of the workloads and pods that differ
    between the two states; and the paths whose specs may differ, but for
    the cgroups that inherit the pool (see `pool_followers`).

    What depends on what: the pool-level cgroups on the pool; a pod's cgroup
    on the pod; an exclusive workload on itself; a pod's shared members on
    the pod's exclusive members; a plain shared workload on the pool (it
    inherits: its spec reads the pool's) and a --cpunodebind one on the pool
    too (made again)."""
    dirty_pods = set(pods)
    dirty = set(workloads)
    for name in list(dirty):
        for state in (old_state, new_state):
            w = state.workload(name)
            if w is not None and w.pod is not None:
                dirty_pods.add(w.pod)
    for pod_name in dirty_pods:
        for state in (old_state, new_state):
            pod = state.pod(pod_name)
            if pod is not None:
                dirty.update(pod.members)
    # Path -> its new spec, or None: gone. Laid on the old layout, not a copy of it.
    edits: dict[str, CgroupSpec | None] = {}
    base = old_layout if isinstance(old_layout, CgroupLayout) else CgroupLayout(old_layout)
    pool_specs = _pool_specs(machine, new_state)
    if pool_specs[SHARED_CGROUP].cpus != shared_pool(machine, old_state):
        # The workloads bound to part of the pool follow it by a write of
        # their own; those that inherit it by inheritance alone (their specs
        # read the pool's CPUs; the affinity fallback re-pins them from
        # pool_followers).
        dirty.update(base.bound())
    edits.update(pool_specs)
    for pod_name in dirty_pods:
        _replace_entry(edits, _enforced(old_state, old_state.pod(pod_name)),
                       _enforced(new_state, new_state.pod(pod_name)), pod_relpath, lambda p: _pod_spec(machine, p))
    for name in dirty:
        _replace_entry(edits, _enforced(old_state, old_state.workload(name)),
                       _enforced(new_state, new_state.workload(name)),
                       workload_relpath, lambda w: _workload_spec(machine, new_state, w))
    out = base.updated({rel: spec for rel, spec in edits.items() if spec is not None},
                       [rel for rel, spec in edits.items() if spec is None])
    return out, frozenset(edits)


_H = TypeVar("_H", Workload, Pod)


def _enforced(state: AgentState, holder: _H | None) -> _H | None:
    """`holder` when the agent enforces it with a cgroup of its tree, else None."""
    return None if holder is None or runtime_enforced(state, holder) else holder


def _with_cpus(spec: CgroupSpec, cpus: CpuSet) -> CgroupSpec:
    # A thousand of these per change of the pool: its fields copied as they
    # are (dataclasses.replace runs __init__ again, copy.copy goes through
    # __reduce_ex__; either costs several times this).
    out = object.__new__(CgroupSpec)
    out.__dict__.update(spec.__dict__, cpus=cpus)
    return out


def _replace_entry(edits: dict[str, CgroupSpec | None], before, after, relpath, spec_of) -> None:
    if before is not None:
        edits[relpath(before)] = None
    if after is not None:
        spec = spec_of(after)
        edits[spec.relpath] = spec


class Change(NamedTuple):  # (a thousand per change of the pool: made cheaply)
    kind: str  # "shrink" | "remove" | "create" | "update" | "grow"
    spec: CgroupSpec | None
    relpath: str


def cpu_steps(before: CpuSet, after: CpuSet) -> tuple[CpuSet | None, bool]:
    """How a cpuset goes from `before` to `after` without ever holding a CPU another
    cgroup gains meanwhile: the CPUs to shrink it to among the first steps (None:
    no shrink), and whether it grows to `after` among the last. A move does both,
    dropping what it loses first (unless it keeps nothing: then it only grows)."""
    if after.issubset(before):
        return after, False
    kept = after & before
    return (kept if kept and kept != before else None), True


def pool_steps(old: Mapping[str, CgroupSpec], new: Mapping[str, CgroupSpec]) -> tuple[CpuSet | None, CpuSet | None]:
    """What the pool's followers go through when the pool changes, as one plan for
    all of them (the affinity fallback re-pins each, a cgroup tree none): the CPUs
    to pin them to before every other step and those to pin them to after every
    other step (None: no such step)."""
    before, after = old.get(SHARED_CGROUP), new.get(SHARED_CGROUP)
    if before is None or after is None or before.cpus == after.cpus:
        return None, None
    shrink_to, grow = cpu_steps(before.cpus, after.cpus)
    return shrink_to, (after.cpus if grow else None)


def order_changes(old: Mapping[str, CgroupSpec], new: Mapping[str, CgroupSpec],
                  only: Collection[str] | None = None) -> list[Change]:
    """The steps from `old` to `new`, in an order that never lets two cgroups
    hold the same exclusive CPU: shrink existing cpusets first, remove gone
    cgroups (deepest first), create new ones (parents first, limits before
    cpus), then grow existing cpusets. `only`: the paths that may differ
    (from update_layout); the others are taken as equal and not compared."""
    shrinks, grows, updates, creates, removes = [], [], [], [], []
    if only is None:
        pairs: Iterable[tuple[str, CgroupSpec | None]] = new.items()
        gone: Iterable[str] = (rel for rel in old if rel not in new)
    else:
        pairs = [(rel, new.get(rel)) for rel in only]  # (one lookup each: a thousand when the pool changes)
        gone = [rel for rel, spec in pairs if spec is None and rel in old]
    for rel, spec in pairs:
        if spec is None:
            continue
        before = old.get(rel)
        if before is None:
            creates.append(Change("create", spec, rel))
            continue
        if before is spec:
            continue
        if spec.cpus != before.cpus:  # (compared first: cheaper than the whole spec)
            shrink_to, grow = cpu_steps(before.cpus, spec.cpus)
            if shrink_to is not None:
                shrinks.append(Change("shrink", spec if not grow else replace(spec, cpus=shrink_to), rel))
            if grow:
                grows.append(Change("grow", spec, rel))
        elif before != spec:
            updates.append(Change("update", spec, rel))
    removes = [Change("remove", None, rel) for rel in gone]
    depth = lambda c: c.relpath.count("/")  # noqa: E731
    removes.sort(key=lambda c: (-depth(c), c.relpath))
    creates.sort(key=lambda c: (depth(c), c.relpath))
    key = lambda c: c.relpath  # noqa: E731
    return [*sorted(shrinks, key=key), *removes, *sorted(updates, key=key), *creates,
            *sorted(grows, key=key)]
