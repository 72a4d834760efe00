"""The interface between the service and the enforcement edge, in four roles.

`Applying` puts layouts on the machine, `Tracking` follows the workloads'
processes, and `Records` is what outlives the checkpoint beside them and where
a workload is enforced. `Enforcer` is those three: what the daemon assembles,
the service holds and start-up recovery uses; a caller that needs one role asks
for that one. Every implementation provides all of it, with real code (a test
holds each method to that), so callers never ask which one they hold: `mode`
and `reason` exist only to be reported (status, health, metrics, log lines),
never to branch on.

`EngineCgroups` (enforcing on an engine's cgroup: a container's, a Slurm
task's) is a capability, not a role: only a cgroup v2 enforcer has it, and a
caller that needs it asks explicitly (`engines_of(enforcer)`, None without).

Paths are the relative workload/pod paths of `plan.py` ("wl-web",
"pod-a/web"); a layout maps them to the `CgroupSpec` they must match.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Collection, Mapping, NamedTuple, Protocol, runtime_checkable

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.enforcement.marked import MarkedProcess
from numa_agent.enforcement.plan import CgroupSpec

Layout = Mapping[str, CgroupSpec]


class Grant(NamedTuple):
    """CPUs and memory nodes the enforcement root is granted from above, which
    the agent hands out instead of what its own process is allowed."""

    cpus: CpuSet
    mems: NumaMask
    source: str  # names the grantor in messages, e.g. "cgroup root /sys/fs/cgroup/numa"


class Limits(NamedTuple):
    """Limits found on a workload or pod, as the kernel holds them."""

    memory_max: int | None  # bytes; None: no limit
    hugetlb_max: Mapping[int, int]  # page size kB -> bytes, only sizes with a limit


NO_LIMITS = Limits(None, MappingProxyType({}))


class Applying(Protocol):
    """Puts layouts on the machine and takes released workloads off it: the service's
    admissions, releases and resizes, and start-up's first apply."""

    @property
    def mode(self) -> str:
        """Short name of the mechanism ("cgroup", "simulated", "affinity"), for reports."""
        ...

    @property
    def reason(self) -> str | None:
        """Why this mechanism, or what it leaves out; None when nothing to say."""
        ...

    def setup(self) -> None:
        """Prepare the mechanism once, before anything is restored or applied."""
        ...

    def apply(self, old: Layout, new: Layout, move: tuple[str, int] | None = None,
              changed: Collection[str] | None = None) -> None:
        """Change the machine from layout `old` to `new`; `move` is (path,
        pid) of a process to put into its workload; `changed`, when given,
        the only paths whose specs may differ (plan.update_layout), but for
        the cgroups that inherit the pool, which follow it when it changes
        (plan.pool_followers). Raises EnforcementError."""
        ...

    def evict(self, relpath: str | None, pid: int | None, identity: str | None, layout: Layout) -> None:
        """Hand what a released workload left running to the shared pool of
        `layout`: the processes of its cgroup `relpath` (the cgroup is then
        removed, an engine's handed back), and where nothing follows the pool
        by itself, the process `pid` (while it is still `identity`) with its
        descendants. None: nothing there. Raises EnforcementError."""
        ...

    def verify(self, layout: Layout, relpaths: Collection[str] | None = None) -> None:
        """Raise EnforcementError where the machine does not match `layout`
        (only at `relpaths`, when given)."""
        ...

    def close(self) -> None:
        ...


class Tracking(Protocol):
    """Follows the processes of the workloads: the event loop's descriptors, start-up's
    rebuild of the workloads a lost checkpoint no longer names."""

    def track(self, relpath: str, pid: int | None, identity: str | None = None) -> bool:
        """Start following a restored workload (`pid` as checkpointed, None if
        unknown; `identity` its process_identity when it was admitted); False
        when its processes are already gone, or `pid` now names another process."""
        ...

    def fds(self) -> list[int]:
        """Descriptors for the event loop to wait on for reading. The list
        changes only in ways announced by one of them becoming readable, so
        the loop asks again after each call of `released`."""
        ...

    def released(self, ready_fds: Collection[int]) -> list[str]:
        """Given the readable ones among `fds()`, the paths of workloads whose
        processes are all gone, each once."""
        ...

    def populated(self, relpath: str) -> bool:
        """The workload still has a live process."""
        ...

    def pids(self, relpath: str) -> list[int]:
        ...

    def subtree_pids(self, relpath: str) -> list[int]:
        """The processes of `relpath` and of every cgroup below it (what a
        cpuset or limit written there governs)."""
        ...

    def live_marked(self) -> list[MarkedProcess] | None:
        """The live processes numa-run marked with their workload's name, for
        start-up to rebuild the workloads a lost checkpoint no longer names;
        None when the mechanism keeps its own record of the workloads (the
        cgroup tree, which start-up adopts from instead)."""
        ...


class Records(Protocol):
    """What the mechanism holds now: where a workload is, what it is confined to,
    and what start-up finds to adopt. What it keeps beside the checkpoint (a
    booking record, leftovers to prune) is the KeptRecords capability."""

    def path_of(self, relpath: str) -> str | None:
        """What to show a user as where the workload is enforced (the cgroup
        directory), None when there is no such place."""
        ...

    def exists(self, relpath: str) -> bool:
        ...

    def read_cpuset(self, relpath: str) -> tuple[CpuSet, tuple[int, ...]]:
        """(CPUs, memory nodes) `relpath` is confined to, as found."""
        ...

    def existing(self) -> list[str]:
        """Every path the mechanism holds, parents before children; start-up
        adopts those the checkpoint does not know."""
        ...


@runtime_checkable
class KeptRecords(Protocol):
    """What a mechanism keeps beside the checkpoint and outliving it: a booking
    record with each cgroup, the limits set on it, the leftovers start-up
    prunes, and the grant of the tree above the agent. An optional capability,
    held only by an enforcer with a place to keep them (cgroup v2): with
    sched_setaffinity nothing outlives the agent but the process. Ask with
    `kept_records`."""

    def read_limits(self, relpath: str) -> Limits:
        """The memory and hugetlb limits `relpath` has now (NO_LIMITS where
        it has none)."""
        ...

    def write_record(self, relpath: str, data: bytes) -> None:
        """Store `data` with the workload or pod at `relpath` so that it
        outlives the checkpoint. Best effort: a record that cannot be stored
        is logged and any older one removed; never raises."""
        ...

    def read_record(self, relpath: str) -> bytes | None:
        """What `write_record` stored, None when there is nothing."""
        ...

    def prune(self, layout: Layout) -> list[str]:
        """Remove empty leftovers that `layout` does not name; returns them."""
        ...

    def granted(self) -> Grant | None:
        """What the agent may hand out, when something above it decides that;
        None: the machine's view of the agent's own process stands."""
        ...


@runtime_checkable
class EngineCgroups(Protocol):
    """The engines' cgroups (containers', Slurm tasks') a workload may be enforced
    on: an optional capability, held only by an enforcer that writes cgroup v2
    cpusets. Ask with `engines_of`."""

    def engine_grant(self, cgroup: str, own: bool = False) -> tuple[CpuSet, NumaMask]:
        """What an engine's cgroup (`cgroup`, as /proc/PID/cgroup names it: a
        container's, a Slurm task's) may be given: its parent's effective CPUs
        and memory nodes, which the engine decided; with `own`, its own (within
        those): what its tasks run on while the agent leaves its cpuset alone
        (tasks pinned inside it). Raises EnforcementError when the cgroup does
        not exist or is not an engine's."""
        ...

    def cgroup_of(self, pid: int) -> str | None:
        """The cgroup process `pid` is in, as /proc/PID/cgroup names it; None
        when it is gone."""
        ...

    def engine_cgroups(self) -> list[str]:
        """Engines' cgroups (outside the agent's tree) holding a booking record
        the agent wrote there, owned by root (a delegated cgroup's owner could
        write one of its own): start-up adopts those the checkpoint lost. A
        walk of the whole hierarchy: for start-up only."""
        ...


@runtime_checkable
class Enforcer(Applying, Tracking, Records, Protocol):
    """Every role at once: what the daemon assembles, the service holds and start-up
    recovery uses. The other callers ask for the role they use (a revocation's
    record: Records and KeptRecords; the rebuild from live processes: Tracking)."""


def engines_of(enforcer: object) -> EngineCgroups | None:
    """`enforcer`'s engine cgroups, None when it cannot enforce on an engine's
    cgroup (it pins with sched_setaffinity)."""
    return enforcer if isinstance(enforcer, EngineCgroups) else None


def kept_records(enforcer: object) -> KeptRecords | None:
    """What `enforcer` keeps beside the checkpoint, None when it keeps nothing
    beyond its processes (it pins with sched_setaffinity): no record to read
    or write, no limits, nothing to prune, no grant above the agent."""
    return enforcer if isinstance(enforcer, KeptRecords) else None


__all__ = ["NO_LIMITS", "Applying", "EngineCgroups", "Enforcer", "Grant", "KeptRecords", "Layout", "Limits",
           "Records", "Tracking", "engines_of", "kept_records"]
