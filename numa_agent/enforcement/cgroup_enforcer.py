"""CgroupEnforcer: make the machine match a planned layout by writing cgroup v2
files below the agent's root (the real thing, or the simulated backend).

One of the two implementations of the `Enforcer` protocol (protocol.py); the other,
for machines without a writable cgroup v2 cpuset, is affinity_enforcer.py. Both
apply the changes of `plan.order_changes`, so CPUs leave the shared pool before a
workload gets them and come back only after it is gone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Collection, Iterable

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.hints import NumaMask
from numa_agent.core.names import engine_cgroup_parent, is_engine_cgroup
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.errors import CgroupError, CgroupMissingError, EnforcementError
from numa_agent.enforcement.marked import MarkedProcess, scan_marked
from numa_agent.enforcement.plan import (
    AGENT_CGROUP,
    POD_PREFIX,
    RELEASED_CGROUP,
    SHARED_CGROUP,
    WORKLOAD_PREFIX,
    CgroupSpec,
    is_pinned,
    order_changes,
)
from numa_agent.enforcement.polling import open_watcher
from numa_agent.enforcement.protocol import NO_LIMITS, Grant, Layout, Limits
from numa_agent.enforcement.record import RECORD_XATTR, encode_record
from numa_agent.state.model import Workload

log = logging.getLogger("numa_agent.enforcement")

THREADED_CONTROLLERS = ("cpuset", "cpu", "pids")
DOMAIN_CONTROLLERS = ("memory", "hugetlb")


_PATHS_KEPT = 16384


class CgroupEnforcer:
    def __init__(self, cgroup: CgroupV2, domain_controllers: bool = True,
                 partitions: str = "off") -> None:
        self.cgroup = cgroup
        # What reports call it: a simulated tree pins nothing for real.
        self.mode = "simulated" if cgroup.files.simulated else "cgroup"
        # "isolated" or "root": exclusive workloads become cpuset partitions,
        # when the agent's root is itself a partition root (see setup).
        self.partitions = partitions
        self.watcher = open_watcher(cgroup)  # inotify, or polling when none can be had
        caps = cgroup.probe()
        self.has_memory = caps.memory and domain_controllers
        self.has_hugetlb = caps.hugetlb and domain_controllers
        self.child_controllers = THREADED_CONTROLLERS + (DOMAIN_CONTROLLERS if domain_controllers else ())
        self.reason: str | None = (None if domain_controllers
                                   else "memory and hugetlb limits off (systemd < 254)")
        # relpath -> its directory, validated once: a scrape asks for every workload's.
        self._paths: dict[str, str] = {}
        # Workloads pinned inside an engine's cgroup they share (plan.is_pinned): their
        # processes' affinity holds the booking, followed by pidfd as in the fallback.
        # On a simulated tree nothing is pinned for real (its CPUs are another machine's):
        # each pin is recorded, by thread id, for the tests to read.
        self.simulated_pins: dict[int, CpuSet] = {}
        self.pins = AffinityEnforcer("pinned inside a shared engine cgroup", setaffinity=(
            self._record_pin if cgroup.files.simulated else os.sched_setaffinity))

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
        if is_pinned(relpath):
            return None  # no cgroup of its own
        path = self._paths.get(relpath)
        if path is None:
            if len(self._paths) >= _PATHS_KEPT:  # the released ones' too: start over now and then
                self._paths.clear()
            path = self._paths[relpath] = str(self.cgroup.path(relpath))
        return path

    # ---- apply ---------------------------------------------------------------
    def apply(self, old: Layout, new: Layout, move: tuple[str, int] | None = None,
              changed: Collection[str] | None = None) -> None:
        """Apply the changes from `old` to `new` (only at `changed`, when
        given), move the process in, then read back what was written."""
        cg = self.cgroup
        recorded: set[str] = set()
        written: set[str] = set()
        for change in order_changes(old, new, changed):
            spec = change.spec
            if is_pinned(change.relpath):
                self._apply_pinned(change.relpath, old.get(change.relpath), spec)
                continue
            if change.kind == "remove":
                self.watcher.unwatch(change.relpath)
                if is_engine_cgroup(change.relpath):
                    self._hand_back(change.relpath)
                elif cg.exists(change.relpath):
                    self._evict(change.relpath, new)
                    cg.remove(change.relpath)
                continue
            assert spec is not None
            if is_engine_cgroup(spec.relpath) and change.kind == "create":
                self._take_over(spec)
                written.add(spec.relpath)
                self._record(spec, None, recorded)
                self.watcher.watch(spec.relpath)
                continue
            if change.kind == "create":
                cg.create(spec.relpath, exist_ok=True)
                if spec.relpath == SHARED_CGROUP or (spec.relpath.startswith(POD_PREFIX)
                                                     and "/" not in spec.relpath):
                    # Parents of workload cgroups: they never hold processes.
                    cg.enable_controllers(spec.relpath, self.child_controllers)
                self._write_limits(spec)
                self._write_cpuset(spec, None)
                written.add(spec.relpath)
                self._record(spec, None, recorded)
                if self.partitions != "off" and spec.relpath.startswith(WORKLOAD_PREFIX):
                    self._make_partition(spec.relpath)
                if spec.workload is not None:
                    self.watcher.watch(spec.relpath)
            else:
                try:
                    self._update(spec, old.get(change.relpath), written, recorded)
                except CgroupMissingError:
                    if not self._engine_gone(spec.relpath):
                        raise
        if move is not None and is_pinned(move[0]):
            self._pin_caller(move[0], move[1], new[move[0]])
        elif move is not None:
            relpath, pid = move
            cg.move_pid(relpath, pid)
            self.watcher.occupied(relpath)
        # Everything after a full apply; after a change, what was written (a
        # cgroup that inherits the pool follows shared/, which is read back
        # whenever it changed).
        self.verify(new, None if changed is None else written)

    def _pin_caller(self, relpath: str, pid: int, spec: CgroupSpec) -> None:
        """The caller stays in its engine's cgroup: its threads are pinned and followed.
        Followed first, by a pidfd and only while `pid` is still the process admitted
        (the identity the API read when it connected): a PID another process took since
        is never pinned. A caller gone before or during its pin fails the change, which
        is taken back, as a move of a process gone does."""
        identity = spec.record.pid_identity if isinstance(spec.record, Workload) else None
        if not self.pins.track(relpath, pid, identity):
            raise ProcessLookupError(f"pid {pid} exited before it could be pinned")
        self.pins.apply({}, {relpath: spec}, (relpath, pid), changed=(relpath,))
        if not self.pins.populated(relpath):
            raise ProcessLookupError(f"pid {pid} exited while it was pinned")

    def _record_pin(self, tid: int, cpus: Iterable[int]) -> None:
        self.simulated_pins[tid] = CpuSet(cpus)

    def _apply_pinned(self, relpath: str, before: CgroupSpec | None, spec: CgroupSpec | None) -> None:
        """A pinned workload's change, in its place among the others: a new one is
        pinned when its process is given (the move), a resized one re-pinned, and a
        released one forgotten, what still runs of it handed back to its engine's
        cgroup (every CPU asked: the kernel bounds it by that cgroup's cpuset).
        One followed already when it is laid out anew (a restart) is pinned again
        unless its process runs within its CPUs: the agent may have died between
        a checkpoint and its pin. Within them it is left as it is (threads the
        workload pinned to CPUs of its own keep them)."""
        if spec is None:
            assert before is not None
            self.pins.apply({relpath: before}, _every_cpu_pool(), None, changed=(relpath,))
        elif before is not None:
            self.pins.apply({relpath: before}, {relpath: spec}, None, changed=(relpath,))
        elif self.pins.exists(relpath) and not self._runs_within(relpath, spec.cpus):
            log.info("%s: pid %s runs outside its CPUs %s (the agent stopped before its pin); pinned again",
                     relpath, spec.pid, spec.cpus.format())
            self.pins.apply({}, {relpath: spec}, None, changed=(relpath,))

    def _runs_within(self, relpath: str, cpus: CpuSet) -> bool:
        """Every thread of the followed process of `relpath` may run only on `cpus`
        (a power cut in the middle of a pin leaves some as they were)."""
        pids = self.pins.pids(relpath)
        try:
            tids = [int(t) for t in os.listdir(f"{self.pins.proc_root}/{pids[0]}/task")] if pids else []
        except (OSError, ValueError):
            tids = []
        for tid in tids:  # none: exited, nothing to pin (its release follows)
            if self.cgroup.files.simulated:
                now = self.simulated_pins.get(tid)
            else:
                try:
                    now = CpuSet(os.sched_getaffinity(tid))
                except OSError:
                    continue  # exited meanwhile
            if now is None or not now.issubset(cpus):
                return False
        return True

    def _update(self, spec: CgroupSpec, before: CgroupSpec | None, written: set[str],
                recorded: set[str]) -> None:
        if before is None or (before.memory_max, before.hugetlb_max) != (spec.memory_max, spec.hugetlb_max):
            if is_engine_cgroup(spec.relpath):
                self._tighten_limits(spec)  # the engine's own limits are never loosened
            else:
                self._write_limits(spec)
        if self._write_cpuset(spec, before):
            written.add(spec.relpath)
        self._record(spec, before, recorded)

    def _engine_gone(self, relpath: str) -> bool:
        """An engine's cgroup removed with its container before the agent saw it
        empty: nothing to write there, and its release follows (cgroup.events,
        or the start-up reconciliation). Not a reason to fail, and roll back,
        a change of the pool or of anybody else's booking."""
        if not is_engine_cgroup(relpath) or self.cgroup.exists(relpath):
            return False
        log.info("cgroup %s is gone (its container exited); its release follows", self.path_of(relpath))
        return True

    def _write_cpuset(self, spec: CgroupSpec, before: CgroupSpec | None) -> bool:
        """Write the cpuset of `spec`; False when there was nothing to write
        (a cgroup that inherits the pool's CPUs, whose memory nodes stay)."""
        if spec.inherit:
            if before is not None and before.inherit and before.mems == spec.mems:
                return False
            self.cgroup.write_cpuset_inherited(spec.relpath, spec.mems)
            return True
        self.cgroup.write_cpuset(spec.relpath, spec.cpus, spec.mems)
        return True

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

    def _take_over(self, spec: CgroupSpec) -> None:
        """Enforce a workload on the cgroup an engine made for it (a container's,
        a Slurm task's): never created here, so one that is gone is an error,
        not a cgroup to make again."""
        if not self.cgroup.exists(spec.relpath):
            raise CgroupMissingError(f"cgroup {self.path_of(spec.relpath)} does not exist (the engine "
                                     "removed it, or its process exited)", path=spec.relpath)
        self._tighten_limits(spec)
        self._write_cpuset(spec, None)

    def _tighten_limits(self, spec: CgroupSpec) -> None:
        """The booked limits on an engine's cgroup, where they are tighter than
        the engine's own (`podman run --memory`): never loosened."""
        cg = self.cgroup
        if spec.memory_max is not None:
            current = cg.read_memory_max(spec.relpath)
            if current is None or current > spec.memory_max:
                cg.write_memory_max(spec.relpath, spec.memory_max)
        for size_kb, limit in sorted(spec.hugetlb_max.items()):
            current = cg.read_hugetlb_max(spec.relpath, size_kb)
            if current is None or current > limit:
                cg.write_hugetlb_max(spec.relpath, size_kb, limit)

    def _hand_back(self, relpath: str) -> None:
        """Give an engine's cgroup back: its parent's CPUs and nodes again, no
        record. Its processes stay (they are the engine's), and so do its
        limits: which were the engine's is not known, and a limit is never
        loosened. A cgroup already gone needs nothing."""
        cg = self.cgroup
        try:
            cg.clear_cpuset(relpath)
        except CgroupMissingError:
            return
        try:
            cg.remove_xattr(relpath, RECORD_XATTR)
        except CgroupError:
            pass  # none was written, or it went with the cgroup
        log.info("handed %s back to its engine", self.path_of(relpath))

    def _evict(self, relpath: str, new: Layout) -> None:
        """Move processes still in a released workload's cgroup to the
        shared pool, so the cgroup can go and its CPUs return.

        `shared/_released` is one of the pool's cgroups: its CPUs are written
        only by the pool's writer (the commit unit, under its pool lock, with
        the latest pool). Made here where it is missing, it is left asking for
        nothing, so the kernel gives it `shared/`'s CPUs and nodes as they stand:
        never the pool of this change, which a change applied meanwhile may
        have replaced."""
        pids = self.pids(relpath)
        if not pids:
            return
        if RELEASED_CGROUP in new and not self.cgroup.exists(RELEASED_CGROUP):
            # Another release, applied at the same time, may make it first.
            self.cgroup.create(RELEASED_CGROUP, exist_ok=True)
        for pid in pids:
            try:
                self.cgroup.move_pid(RELEASED_CGROUP, pid)
            except CgroupMissingError:
                continue  # exited meanwhile
        log.info("released %s: %d process(es) moved to the shared pool", relpath, len(pids))

    def evict(self, relpath: str | None, pid: int | None, identity: str | None, layout: Layout) -> None:
        """The cgroup left by a release that was not enforced: emptied into
        `shared/_released` (which follows the pool: `pid` needs nothing) and
        removed, or an engine's handed back."""
        if relpath is None:
            return
        if is_pinned(relpath):
            self.pins.forget(relpath)
            self.pins.evict(relpath, pid, identity, _every_cpu_pool())
            return
        self.watcher.unwatch(relpath)
        if is_engine_cgroup(relpath):
            self._hand_back(relpath)
        elif self.cgroup.exists(relpath):
            self._evict(relpath, layout)
            self.cgroup.remove(relpath)

    def _write_limits(self, spec: CgroupSpec) -> None:
        # Limits go in before any process can be moved in.
        if self.has_memory:
            self.cgroup.write_memory_max(spec.relpath, spec.memory_max)
        if self.has_hugetlb:
            for size_kb, limit in sorted(spec.hugetlb_max.items()):
                self.cgroup.write_hugetlb_max(spec.relpath, size_kb, limit)

    def verify(self, layout: Layout, relpaths: Collection[str] | None = None) -> None:
        """Read the kernel's effective cpusets back (of every cgroup of the
        layout, or of `relpaths`): a difference means the kernel did not
        honour what we wrote (e.g. a parent narrowed it)."""
        specs = layout.values() if relpaths is None else [layout[rel] for rel in sorted(relpaths) if rel in layout]
        for spec in specs:
            rel = spec.relpath
            if is_pinned(rel):
                continue  # sched_setaffinity pinned it or raised
            try:
                cpus, mems = self.cgroup.read_effective(rel)
            except CgroupMissingError:
                if self._engine_gone(rel):
                    continue
                raise
            if is_engine_cgroup(rel) and cpus and cpus.issubset(spec.cpus):
                # The engine's parent may narrow a shared workload's pool to
                # what it granted (an exclusive one was booked inside it).
                continue
            if cpus != spec.cpus:
                raise EnforcementError(
                    f"cgroup {self.path_of(rel)}: cpuset.cpus.effective is {cpus.format() or 'empty'}, "
                    f"expected {spec.cpus.format()}")

    def cgroup_of(self, pid: int) -> str | None:
        return self.cgroup.cgroup_of(pid)

    def engine_grant(self, cgroup: str, own: bool = False) -> tuple[CpuSet, NumaMask]:
        try:
            path = self.cgroup.path(cgroup)
            if not self.cgroup.exists(cgroup):
                raise EnforcementError(f"cgroup {path} does not exist")
            parent = engine_cgroup_parent(cgroup)
            if parent == "/":
                raise EnforcementError(f"cgroup {path} is a child of the root; an engine's cgroup "
                                       "lies below a parent of the engine's")
            if own:
                try:
                    return self.cgroup.read_effective(cgroup)
                except CgroupMissingError:
                    if not self.cgroup.exists(cgroup):
                        raise
                    # No cpuset files there (its parent does not enable the controller):
                    # its tasks run on its parent's.
            return self.cgroup.read_effective(parent)
        except CgroupError as exc:
            raise EnforcementError(str(exc)) from None

    # ---- observation (restart, reconcile) ------------------------------------
    def exists(self, relpath: str) -> bool:
        return self.pins.exists(relpath) if is_pinned(relpath) else self.cgroup.exists(relpath)

    def populated(self, relpath: str) -> bool:
        if is_pinned(relpath):
            return self.pins.populated(relpath)
        try:
            return self.cgroup.populated(relpath)
        except CgroupMissingError:
            return False

    def pids(self, relpath: str) -> list[int]:
        if is_pinned(relpath):
            return self.pins.pids(relpath)
        try:
            return self.cgroup.procs(relpath)
        except CgroupMissingError:
            return []

    def subtree_pids(self, relpath: str) -> list[int]:
        if is_pinned(relpath):
            return self.pins.pids(relpath)
        out, todo = [], [relpath]
        while todo:
            rel = todo.pop()
            out += self.pids(rel)
            try:
                todo += self.cgroup.children(rel)
            except CgroupMissingError:
                continue  # gone meanwhile
        return sorted(out)

    def read_cpuset(self, relpath: str) -> tuple[CpuSet, tuple[int, ...]]:
        if is_pinned(relpath):
            return self.pins.read_cpuset(relpath)
        cpus, mems = self.cgroup.read_effective(relpath)
        return cpus, mems.nodes()

    def read_limits(self, relpath: str) -> Limits:
        """`memory.max` and every `hugetlb.<size>.max` that holds a limit;
        a controller that is not enabled there has no limit to read."""
        if is_pinned(relpath):
            return NO_LIMITS  # a cgroup it shares: its limits are not this workload's
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
        if is_pinned(relpath):
            return  # no cgroup of its own to keep it
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
        if is_pinned(relpath):
            return None
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

    def engine_cgroups(self) -> list[str]:
        cg = self.cgroup
        if cg.mount == cg.root:
            return []
        found = []
        for directory, dirs, _files in os.walk(cg.mount):
            here = Path(directory)
            if here == cg.root:
                dirs.clear()  # the agent's own tree: existing() lists it
                continue
            if here == cg.mount or here.parent == cg.mount or here in cg.root.parents:
                continue  # what no admission may name either (CgroupV2.path, engine_grant)
            try:
                if here.stat().st_uid != 0 or cg.files.getxattr(here, RECORD_XATTR) is None:
                    continue
            except OSError:
                continue  # gone meanwhile, or no attributes here
            found.append("/" + str(here.relative_to(cg.mount)))
        return found

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
        """The marked processes in an engine's cgroup, outside the agent's tree: the only
        trace a lost checkpoint leaves of a task pinned inside a cgroup it shares (the
        cgroup tree is the record of every other workload, adopted from it; a workload
        booked on a whole engine cgroup is adopted from its record first, and so known).
        One pass over /proc, at start-up only."""
        found = []
        for p in scan_marked(exclude=(os.getpid(),)):
            where = self.cgroup.cgroup_of(p.pid)
            if where is None:
                continue  # gone
            try:
                self.cgroup.path(where)  # the rule an admission's engine cgroup meets
            except CgroupError:
                continue  # the agent's own tree, above it, or the top: no engine's cgroup
            found.append(dataclasses.replace(p, cgroup=where))
        return found

    # ---- liveness: inotify on each workload's cgroup.events ---------------------
    def track(self, relpath: str, pid: int | None, identity: str | None = None) -> bool:
        """The cgroup knows its processes: `pid` is not needed. Its watch is
        set when the layout is applied. A pinned workload has only its process."""
        if is_pinned(relpath):
            return self.pins.track(relpath, pid, identity)
        return self.populated(relpath)

    def fds(self) -> list[int]:
        """The inotify watcher, and whatever the files backend needs to notice
        exits (a simulated tree's pidfds; nothing on the kernel's)."""
        return [self.watcher.fileno(), *self.cgroup.files.fds(), *self.pins.fds()]

    def released(self, ready_fds: Collection[int]) -> list[str]:
        """Watched cgroups whose `cgroup.events` changed and that are empty now
        (the change may as well have been a process moving in)."""
        gone = self.pins.released(ready_fds)
        return gone + self._released_cgroups(ready_fds)

    def _released_cgroups(self, ready_fds: Collection[int]) -> list[str]:
        backend = set(self.cgroup.files.fds()) & set(ready_fds)
        if backend:
            # The simulated tree drops the exited processes now; inotify
            # queues the resulting cgroup.events changes at once.
            self.cgroup.files.ready(backend)
        elif self.watcher.fileno() not in ready_fds:
            return []
        return [rel for rel in self.watcher.read_events() if not self.populated(rel)]

    def close(self) -> None:
        self.pins.close()
        self.watcher.close()
        self.cgroup.files.close()


def _every_cpu_pool() -> dict[str, CgroupSpec]:
    """A released pinned process's layout to go back to: every possible CPU, which the
    kernel bounds by the cpuset of the cgroup it is in (its engine's grant, as a
    handed-back engine cgroup's processes get)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            every = CpuSet.parse(f.read().strip())
    except (OSError, CpuSetParseError):
        every = CpuSet(range(os.cpu_count() or 1))
    return {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, every, ())}


__all__ = ["CgroupEnforcer", "CgroupError", "EnforcementError"]
