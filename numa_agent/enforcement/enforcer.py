"""Enforcers: make the machine match a planned layout.

Two implementations of the `Enforcer` protocol (protocol.py):

- CgroupEnforcer writes cgroup v2 files below the agent's root (the real thing).
- AffinityEnforcer, for machines without a writable cgroup v2 cpuset
  (containers, development boxes), pins the workload's processes with
  sched_setaffinity; numa-run binds its own memory policy before exec.
  Bookkeeping is identical; only the mechanism differs.

Both apply the changes of `plan.order_changes`, so CPUs leave the shared pool
before a workload gets them and come back only after it is gone.
"""

from __future__ import annotations

import logging
import os
import select
from typing import Collection

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.cgroup import CgroupV2, EventWatcher
from numa_agent.enforcement.errors import CgroupError, CgroupMissingError, EnforcementError
from numa_agent.enforcement.marked import MarkedProcess, scan_marked
from numa_agent.enforcement.plan import (
    AGENT_CGROUP,
    POD_PREFIX,
    RELEASED_CGROUP,
    SHARED_CGROUP,
    WORKLOAD_PREFIX,
    CgroupSpec,
    order_changes,
)
from numa_agent.enforcement.processes import process_alive, process_identity
from numa_agent.enforcement.protocol import NO_LIMITS, Grant, Layout, Limits
from numa_agent.enforcement.record import RECORD_XATTR, encode_record

log = logging.getLogger("numa_agent.enforcement")

THREADED_CONTROLLERS = ("cpuset", "cpu", "pids")
DOMAIN_CONTROLLERS = ("memory", "hugetlb")


class CgroupEnforcer:
    def __init__(self, cgroup: CgroupV2, domain_controllers: bool = True,
                 partitions: str = "off") -> None:
        self.cgroup = cgroup
        # What reports call it: a simulated tree pins nothing for real.
        self.mode = "simulated" if cgroup.files.simulated else "cgroup"
        # "isolated" or "root": exclusive workloads become cpuset partitions,
        # when the agent's root is itself a partition root (see setup).
        self.partitions = partitions
        self.watcher = EventWatcher(cgroup)
        caps = cgroup.probe()
        self.has_memory = caps.memory and domain_controllers
        self.has_hugetlb = caps.hugetlb and domain_controllers
        self.child_controllers = THREADED_CONTROLLERS + (DOMAIN_CONTROLLERS if domain_controllers else ())
        self.reason: str | None = (None if domain_controllers
                                   else "memory and hugetlb limits off (systemd < 254)")

    # ---- set-up ---------------------------------------------------------
    def setup(self) -> None:
        """Move the agent out of the root (the no-internal-process rule: a
        cgroup that delegates controllers to children cannot hold processes)
        and enable the controllers for the children."""
        cg = self.cgroup
        own = os.getpid()
        if own in cg.procs(""):
            cg.create(AGENT_CGROUP, exist_ok=True)
            cg.move_pid(AGENT_CGROUP, own)
        for pid in cg.procs(""):
            # Anything else left in the root would block subtree_control.
            cg.create(AGENT_CGROUP, exist_ok=True)
            cg.move_pid(AGENT_CGROUP, pid)
        cg.enable_controllers("", self.child_controllers)
        if self.partitions != "off":
            self.partitions = self._check_partitions()

    def _check_partitions(self) -> str:
        """Partitions are offered only where the hierarchy allows them: the
        agent's root must already be a partition root. The agent never makes
        it one itself, since that takes its CPUs away from the whole system:
        that is the administrator's decision."""
        try:
            state = self.cgroup.partition("")
        except CgroupError as exc:
            log.warning("cpuset partitions unavailable (%s); exclusive workloads stay members", exc)
            return "off"
        if state.split()[0] not in ("root", "isolated") or "invalid" in state:
            log.warning("cpuset partitions unavailable: %s is not a partition root (its "
                        "cpuset.cpus.partition reads %r); exclusive workloads stay members",
                        self.cgroup.root, state)
            return "off"
        log.info("exclusive workloads become %s cpuset partitions", self.partitions)
        return self.partitions

    def path_of(self, relpath: str) -> str | None:
        return str(self.cgroup.path(relpath))

    # ---- apply ---------------------------------------------------------------
    def apply(self, old: Layout, new: Layout, move: tuple[str, int] | None = None) -> None:
        cg = self.cgroup
        recorded: set[str] = set()
        for change in order_changes(old, new):
            spec = change.spec
            if change.kind == "remove":
                self.watcher.unwatch(change.relpath)
                if cg.exists(change.relpath):
                    self._evict(change.relpath, new)
                    cg.remove(change.relpath)
                continue
            assert spec is not None
            if change.kind == "create":
                cg.create(spec.relpath, exist_ok=True)
                if spec.relpath == SHARED_CGROUP or (spec.relpath.startswith(POD_PREFIX)
                                                     and "/" not in spec.relpath):
                    # Parents of workload cgroups: they never hold processes.
                    cg.enable_controllers(spec.relpath, self.child_controllers)
                self._write_limits(spec)
                cg.write_cpuset(spec.relpath, spec.cpus, spec.mems)
                self._record(spec, None, recorded)
                if self.partitions != "off" and spec.relpath.startswith(WORKLOAD_PREFIX):
                    self._make_partition(spec.relpath)
                if spec.workload is not None:
                    self.watcher.watch(spec.relpath)
            else:
                self._write_limits(spec)
                cg.write_cpuset(spec.relpath, spec.cpus, spec.mems)
                self._record(spec, old.get(change.relpath), recorded)
        if move is not None:
            relpath, pid = move
            cg.move_pid(relpath, pid)
        self.verify(new)

    def _record(self, spec: CgroupSpec, before: CgroupSpec | None, recorded: set[str]) -> None:
        """The booking record of a created cgroup, or of one whose booking
        changed; in either case before any process is moved in."""
        if spec.record is None or spec.relpath in recorded:
            return
        if before is not None and before.record == spec.record:
            return
        recorded.add(spec.relpath)
        self.write_record(spec.relpath, encode_record(spec.record))

    def _make_partition(self, relpath: str) -> None:
        try:
            self.cgroup.set_partition(relpath, self.partitions)
        except CgroupError as exc:
            # Still exclusive among the agent's cgroups; only the scheduler
            # isolation is missing. Say so rather than refuse the workload.
            log.warning("workload cgroup %s stays a member, not a partition: %s",
                        self.path_of(relpath), exc)

    def _evict(self, relpath: str, new: Layout) -> None:
        """Move processes still in a released workload's cgroup to the
        shared pool, so the cgroup can go and its CPUs return."""
        pids = self.pids(relpath)
        if not pids:
            return
        if RELEASED_CGROUP in new and not self.cgroup.exists(RELEASED_CGROUP):
            spec = new[RELEASED_CGROUP]
            self.cgroup.create(RELEASED_CGROUP)
            self.cgroup.write_cpuset(RELEASED_CGROUP, spec.cpus, spec.mems)
        for pid in pids:
            try:
                self.cgroup.move_pid(RELEASED_CGROUP, pid)
            except CgroupMissingError:
                continue  # exited meanwhile
        log.info("released %s: %d process(es) moved to the shared pool", relpath, len(pids))

    def _write_limits(self, spec: CgroupSpec) -> None:
        # Limits go in before any process can be moved in.
        if self.has_memory:
            self.cgroup.write_memory_max(spec.relpath, spec.memory_max)
        if self.has_hugetlb:
            for size_kb, limit in sorted(spec.hugetlb_max.items()):
                self.cgroup.write_hugetlb_max(spec.relpath, size_kb, limit)

    def verify(self, layout: Layout) -> None:
        """Read the kernel's effective cpusets back: a difference means the
        kernel did not honour what we wrote (e.g. a parent narrowed it)."""
        for rel, spec in layout.items():
            cpus, mems = self.cgroup.read_effective(rel)
            if cpus != spec.cpus:
                raise EnforcementError(
                    f"cgroup {self.path_of(rel)}: cpuset.cpus.effective is {cpus.format() or 'empty'}, "
                    f"expected {spec.cpus.format()}")

    # ---- observation (restart, reconcile) ------------------------------------
    def exists(self, relpath: str) -> bool:
        return self.cgroup.exists(relpath)

    def populated(self, relpath: str) -> bool:
        try:
            return self.cgroup.populated(relpath)
        except CgroupMissingError:
            return False

    def pids(self, relpath: str) -> list[int]:
        try:
            return self.cgroup.procs(relpath)
        except CgroupMissingError:
            return []

    def read_cpuset(self, relpath: str) -> tuple[CpuSet, tuple[int, ...]]:
        cpus, mems = self.cgroup.read_effective(relpath)
        return cpus, mems.nodes()

    def read_limits(self, relpath: str) -> Limits:
        """`memory.max` and every `hugetlb.<size>.max` that holds a limit;
        a controller that is not enabled there has no limit to read."""
        cg = self.cgroup
        try:
            memory_max = cg.read_memory_max(relpath)
        except CgroupMissingError:
            memory_max = None
        try:
            sizes = cg.hugetlb_sizes(relpath)
        except CgroupMissingError:
            return NO_LIMITS
        hugetlb = {}
        for size_kb in sizes:
            limit = cg.read_hugetlb_max(relpath, size_kb)
            if limit is not None:
                hugetlb[size_kb] = limit
        return Limits(memory_max, hugetlb)

    # ---- the booking record: an extended attribute of the cgroup directory -------
    def write_record(self, relpath: str, data: bytes) -> None:
        try:
            self.cgroup.write_xattr(relpath, RECORD_XATTR, data)
            return
        except CgroupError as exc:
            log.warning("cgroup %s keeps no booking record (%s); should the checkpoint be lost, "
                        "recovery falls back to its cpuset and limits", self.path_of(relpath), exc)
        try:
            self.cgroup.remove_xattr(relpath, RECORD_XATTR)  # an older one would be wrong now
        except CgroupError:
            pass

    def read_record(self, relpath: str) -> bytes | None:
        try:
            return self.cgroup.read_xattr(relpath, RECORD_XATTR)
        except CgroupError as exc:
            log.warning("cannot read the booking record of cgroup %s: %s", self.path_of(relpath), exc)
            return None

    def existing(self) -> list[str]:
        """Every cgroup below the root, parents before children."""
        out, todo = [], self.cgroup.children("")
        while todo:
            rel = todo.pop(0)
            out.append(rel)
            todo[0:0] = self.cgroup.children(rel)
        return out

    def prune(self, layout: Layout) -> list[str]:
        """Remove empty cgroups below the root that the layout does not name
        (left by workloads released while the agent was down)."""
        removed = []
        for rel in reversed(self.existing()):
            if rel in layout or self.populated(rel) or self.cgroup.children(rel):
                continue
            try:
                self.cgroup.remove(rel)
                removed.append(rel)
            except CgroupError as exc:
                log.warning("cannot remove stale cgroup %s: %s", self.path_of(rel), exc)
        return removed

    def granted(self) -> Grant | None:
        """What the root cgroup is granted (`cpuset.*.effective`): the agent
        hands out that, not what its own process happens to be allowed (the
        two differ when the root is a partition the agent was not started in,
        or when the agent runs outside the subtree it manages). None on a
        simulated tree, which was made from the machine's own view."""
        if self.cgroup.files.simulated:
            return None
        cpus, mems = self.cgroup.read_effective("")
        return Grant(cpus, mems, f"cgroup root {self.cgroup.root}")

    def live_marked(self) -> list[MarkedProcess] | None:
        return None  # the cgroup tree is the record; start-up adopts from it

    # ---- liveness: inotify on each workload's cgroup.events ---------------------
    def track(self, relpath: str, pid: int | None, identity: str | None = None) -> bool:
        """The cgroup knows its processes: `pid` is not needed. Its watch is
        set when the layout is applied."""
        return self.populated(relpath)

    def fds(self) -> list[int]:
        """The inotify watcher, and whatever the files backend needs to notice
        exits (a simulated tree's pidfds; nothing on the kernel's)."""
        return [self.watcher.fileno(), *self.cgroup.files.fds()]

    def released(self, ready_fds: Collection[int]) -> list[str]:
        """Watched cgroups whose `cgroup.events` changed and that are empty now
        (the change may as well have been a process moving in)."""
        backend = set(self.cgroup.files.fds()) & set(ready_fds)
        if backend:
            # The simulated tree drops the exited processes now; inotify
            # queues the resulting cgroup.events changes at once.
            self.cgroup.files.ready(backend)
        elif self.watcher.fileno() not in ready_fds:
            return []
        return [rel for rel in self.watcher.read_events() if not self.populated(rel)]

    def close(self) -> None:
        self.watcher.close()
        self.cgroup.files.close()


class AffinityEnforcer:
    """Pins processes with sched_setaffinity where cgroups cannot be used.

    Release is detected through a pidfd of the workload's process: it becomes
    readable when the process exits (no polling)."""

    mode = "affinity"

    def __init__(self, reason: str, proc_root: str = "/proc") -> None:
        self.reason: str | None = reason
        self.proc_root = proc_root
        self._pidfds: dict[str, int] = {}  # relpath -> pidfd
        self._by_fd: dict[int, str] = {}
        self._pids: dict[str, int] = {}
        # A pipe that wakes the event loop when the set of pidfds changes.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def setup(self) -> None:
        pass

    def path_of(self, relpath: str) -> str | None:
        return None

    def apply(self, old: Layout, new: Layout, move: tuple[str, int] | None = None) -> None:
        for change in order_changes(old, new):
            if change.kind == "remove":
                pid = self._pids.get(change.relpath)
                alive = self._alive(change.relpath)
                self._forget(change.relpath)
                if pid is not None and alive and SHARED_CGROUP in new:
                    _pin_tree(pid, new[SHARED_CGROUP].cpus)  # back to the shared pool
                continue
            spec = change.spec
            assert spec is not None
            if move is not None and move[0] == spec.relpath:
                continue  # pinned below, with the pid the caller's pidfd vouches for
            # Only a process whose pidfd says it is still the same one: its PID
            # may already be another process's if it exited a moment ago.
            if spec.workload is None or spec.pid is None or not self._alive(spec.relpath):
                continue
            _pin_tree(spec.pid, spec.cpus)
        if move is not None:
            relpath, pid = move
            spec = new[relpath]
            _pin_tree(pid, spec.cpus)
            self.track(relpath, pid)

    def verify(self, layout: Layout) -> None:
        """Nothing to read back: sched_setaffinity either pinned a task or
        raised, and tasks created later inherit the mask."""

    def track(self, relpath: str, pid: int | None, identity: str | None = None) -> bool:
        """Watch `pid` for exit; False if it is already gone or unknown, or if
        it is no longer the process that was admitted (a recycled PID)."""
        if relpath in self._pidfds:
            return True
        if pid is None:
            return False
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        # Read after the pidfd pinned the process: a match means this very
        # process is the one admitted. A workload admitted before identities
        # were recorded has none and is taken on its PID alone.
        if identity is not None and process_identity(pid) != identity:
            os.close(fd)
            log.warning("%s: pid %d now belongs to another process; not following it", relpath, pid)
            return False
        self._pidfds[relpath] = fd
        self._by_fd[fd] = relpath
        self._pids[relpath] = pid
        os.write(self._wake_w, b"x")
        return True

    def _alive(self, relpath: str) -> bool:
        """The followed process has not exited (its pidfd is not readable)."""
        fd = self._pidfds.get(relpath)
        if fd is None:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return not poller.poll(0)

    def _forget(self, relpath: str) -> None:
        fd = self._pidfds.pop(relpath, None)
        self._pids.pop(relpath, None)
        if fd is not None:
            self._by_fd.pop(fd, None)
            os.close(fd)
            os.write(self._wake_w, b"x")

    def exists(self, relpath: str) -> bool:
        return relpath in self._pidfds

    def populated(self, relpath: str) -> bool:
        pid = self._pids.get(relpath)
        return pid is not None and process_alive(pid)

    def pids(self, relpath: str) -> list[int]:
        pid = self._pids.get(relpath)
        return [pid] if pid is not None and process_alive(pid) else []

    def read_cpuset(self, relpath: str) -> tuple[CpuSet, tuple[int, ...]]:
        """The tracked process's CPU affinity; its memory policy cannot be
        read from outside, so no memory nodes."""
        pid = self._pids.get(relpath)
        if pid is None:
            raise EnforcementError(f"no process is tracked for {relpath}")
        try:
            return CpuSet(os.sched_getaffinity(pid)), ()
        except OSError as exc:
            raise EnforcementError(f"cannot read the affinity of pid {pid} ({relpath}): "
                                   f"{exc.strerror}") from None

    def read_limits(self, relpath: str) -> Limits:
        return NO_LIMITS  # numa-run binds memory nodes; nothing limits amounts

    def write_record(self, relpath: str, data: bytes) -> None:
        pass  # nothing outlives the agent but the process: no place for a record

    def read_record(self, relpath: str) -> bytes | None:
        return None

    def existing(self) -> list[str]:
        """Only the tracked workloads: nothing of a workload outlives the
        agent but its process, so there is never anything to adopt."""
        return sorted(self._pidfds)

    def prune(self, layout: Layout) -> list[str]:
        return []  # nothing is left behind by a released workload

    def granted(self) -> Grant | None:
        return None  # the agent hands out what its own process may use

    def live_marked(self) -> list[MarkedProcess] | None:
        """Processes carrying NUMA_AGENT_WORKLOAD (numa_agent.enforcement.marked):
        the only trace of a workload the checkpoint lost."""
        return scan_marked(self.proc_root, exclude=(os.getpid(),))

    def fds(self) -> list[int]:
        """The wake pipe (readable when the set of pidfds changed) and one
        pidfd per workload (readable when its process exited)."""
        return [self._wake_r, *sorted(self._by_fd)]

    def released(self, ready_fds: Collection[int]) -> list[str]:
        """Workload paths whose process exited, from readable pidfds."""
        if self._wake_r in ready_fds:
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
        return [self._by_fd[fd] for fd in sorted(ready_fds) if fd in self._by_fd]

    def close(self) -> None:
        for rel in list(self._pidfds):
            self._forget(rel)
        os.close(self._wake_r)
        os.close(self._wake_w)


def _pin_tree(pid: int, cpus: CpuSet) -> None:
    """Pin every thread of `pid` and of its descendants (threads each carry
    their own affinity mask). An empty set cannot be pinned to (the shared
    pool is empty only while CPUs are held for an operator): tasks stay where
    they are."""
    if not cpus:
        log.error("no CPU to pin pid %d to (the shared pool is empty); it keeps its affinity", pid)
        return
    import psutil  # only the daemon pays for this import

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            tids = [t.id for t in proc.threads()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            tids = [proc.pid]
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus.ids())
            except ProcessLookupError:
                continue
            except OSError as exc:
                raise EnforcementError(f"cannot pin task {tid} of pid {pid} to CPUs "
                                       f"{cpus.format()}: {exc.strerror}") from None


__all__ = ["CgroupEnforcer", "AffinityEnforcer", "CgroupError", "EnforcementError"]
