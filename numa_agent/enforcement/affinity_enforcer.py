"""AffinityEnforcer, for machines without a writable cgroup v2 cpuset (containers,
development boxes): pins the workloads' processes with sched_setaffinity; numa-run
binds its own memory policy before exec. Bookkeeping is the cgroup enforcer's
(cgroup_enforcer.py); only the mechanism differs. Both apply the changes of
`plan.order_changes`, so CPUs leave the shared pool before a workload gets them
and come back only after it is gone.
"""

from __future__ import annotations

import logging
import os
import resource
import select
import threading
from typing import Callable, Collection, Iterable, NamedTuple

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.errors import EnforcementError
from numa_agent.enforcement.marked import MarkedProcess, marked_pids, read_marked, scan_marked
from numa_agent.enforcement.plan import (
    SHARED_CGROUP,
    order_changes,
    pool_followers,
    pool_steps,
)
from numa_agent.enforcement.processes import exited_among, pidfd_exited, process_identity
from numa_agent.enforcement.protocol import Layout

log = logging.getLogger("numa_agent.enforcement")


class AffinityEnforcer:
    """Pins processes with sched_setaffinity where cgroups cannot be used.

    Release is detected through a pidfd of the workload's process: it becomes
    readable when the process exits (no polling). The pidfds are watched
    through one epoll instance, the only descriptor the event loop waits on:
    following a workload or forgetting one costs the loop nothing, where a
    list of every pidfd had to be handed to poll(2) again after each change."""

    mode = "affinity"

    def __init__(self, reason: str, proc_root: str = "/proc",
                 setaffinity: Callable[[int, Iterable[int]], None] = os.sched_setaffinity) -> None:
        self.reason: str | None = reason
        self.proc_root = proc_root
        # The kernel's call; a cgroup enforcer on a simulated tree pins nothing for real.
        self._setaffinity = setaffinity
        self._followed: dict[str, _Followed] = {}  # relpath -> its process's descriptors
        self._by_fd: dict[int, str] = {}  # pidfd -> relpath
        # The event loop's thread reads these while the API's change them, and
        # changes applied at once (service/commit.py) each read and forget them.
        self._fds_lock = threading.Lock()
        # Readable while a watched pidfd is; one added meanwhile wakes a poll
        # of it too. A pidfd leaves it when its exit is reported (once, as an
        # inotify event is: the event loop retries a release that failed).
        self._epoll = select.epoll()

    def setup(self) -> None:
        pass

    def path_of(self, relpath: str) -> str | None:
        return None

    def apply(self, old: Layout, new: Layout, move: tuple[str, int] | None = None,
              changed: Collection[str] | None = None) -> None:
        # A shared admission leaves the pool as it is: only the new workload
        # is pinned. When the pool changes every workload on it is re-pinned
        # (no inheritance here): those that inherit it in a cgroup tree are
        # not in `changed` (update_layout), but in pool_followers. They move
        # as one (pool_steps): pinned before every other change when the pool
        # loses CPUs, after every other when it gains some; only `changed` is planned.
        lease = _Lease(self)
        try:
            self._apply(lease, old, new, move, changed)
        finally:
            lease.give_back()

    def _apply(self, lease: "_Lease", old: Layout, new: Layout, move: tuple[str, int] | None,
               changed: Collection[str] | None) -> None:
        pins = _Pins(self._setaffinity)
        followers: list[str] = []
        shrink_to = grow_to = None
        if changed is not None:
            followers = [rel for rel in pool_followers(old, new) if rel not in changed]
            shrink_to, grow_to = pool_steps(old, new)
        changes = list(order_changes(old, new, changed))
        strays = self._strays(old, new, changes, followers if shrink_to is not None else [])
        if shrink_to is not None:
            self._pin_followers(lease, pins, new, followers, shrink_to)
            self._pin_strays(strays, followers, new, shrink_to)
        for change in changes:
            if change.kind == "remove":
                gone = lease.get(change.relpath)
                pid = gone.pid if gone is not None else None
                alive = gone is not None and not pidfd_exited(gone.pidfd)
                self._forget(change.relpath)
                if pid is not None and alive and SHARED_CGROUP in new:
                    pins.add(pid, new[SHARED_CGROUP].cpus)  # back to the shared pool
                if SHARED_CGROUP in new:
                    self._pin_strays(strays, [change.relpath], old, new[SHARED_CGROUP].cpus)
                continue
            spec = change.spec
            assert spec is not None
            if move is not None and move[0] == spec.relpath:
                continue  # pinned below, with the pid the caller's pidfd vouches for
            if change.kind == "shrink" and spec.workload is not None and spec.record is not None:
                # A resize gives CPUs back: its strays keep only the owner's (the mark is
                # anyone's, so into a booking go only the owner's own processes).
                self._pin_strays(strays, [spec.relpath], {spec.relpath: spec}, spec.cpus,
                                 owner=spec.record.owner_uid)
            # Only a process whose pidfd says it is still the same one: its PID
            # may already be another process's if it exited a moment ago.
            if spec.workload is None or spec.pid is None:
                continue
            followed = lease.get(spec.relpath)
            if followed is None or pidfd_exited(followed.pidfd):
                continue
            pins.add(spec.pid, spec.cpus, followed.held_for(spec.pid))
        if grow_to is not None:
            self._pin_followers(lease, pins, new, followers, grow_to)
        pins.flush()
        if move is not None:
            relpath, pid = move
            spec = new[relpath]
            # The caller's own threads, as writing cgroup.procs moves a
            # process: no search for descendants on the admission path (what
            # it forks from now on inherits the mask; a re-pin takes the tree).
            _pin_trees((pid,), spec.cpus, descendants=False, setaffinity=self._setaffinity)
            self.track(relpath, pid)

    def _strays(self, old: Layout, new: Layout, changes: list, followers: list[str]) -> dict[str, list[int]]:
        """The processes that left a workload's tree but carry its mark (a daemon's
        double fork), by workload name, for the workloads whose CPUs go to the pool or
        shrink with it: the removed ones, those a resize shrinks and, when the pool
        shrinks, its followers. One pass over /proc, only when there is such a workload."""
        names = [spec.workload for c in changes if c.kind == "remove" and (spec := old.get(c.relpath))
                 is not None and spec.workload is not None and SHARED_CGROUP in new]
        names += [spec.workload for rel in followers if (spec := new.get(rel)) is not None
                  and spec.workload is not None]
        names += [c.spec.workload for c in changes if c.kind == "shrink" and c.spec is not None
                  and c.spec.workload is not None and c.spec.record is not None]
        return marked_pids(names, self.proc_root, exclude=(os.getpid(),)) if names else {}

    def _pin_strays(self, strays: dict[str, list[int]], relpaths: list[str], layout: Layout, cpus: CpuSet,
                    owner: int | None = None) -> None:
        """Pin the marked processes of the workloads at `relpaths` (of `layout`) to
        `cpus` (the pool's; with `owner`, of that uid's own booking: only its processes),
        each with its own descendants. Each is pinned only while a pidfd holds it and it
        still carries the mark (its PID not another's meanwhile); one that cannot be
        pinned is logged, not a failure of the change: the mark is anyone's to set, and
        cannot make an admission or release fail."""
        for rel in relpaths:
            spec = layout.get(rel)
            name = spec.workload if spec is not None else None
            if name is None:
                continue
            for pid in strays.get(name, ()):
                try:
                    fd = os.pidfd_open(pid)
                except OSError:
                    continue  # exited meanwhile
                try:
                    marked = read_marked(pid, self.proc_root)
                    if marked is not None and marked.name == name and owner in (None, marked.uid):
                        _pin_trees((pid,), cpus, setaffinity=self._setaffinity)
                        log.info("%s: pid %d left the workload's process tree; pinned to CPUs %s",
                                 rel, pid, cpus.format())
                except EnforcementError as exc:
                    log.warning("%s: cannot pin pid %d, which carries its mark, to CPUs %s: %s",
                                rel, pid, cpus.format(), exc)
                finally:
                    os.close(fd)

    def _pin_followers(self, lease: "_Lease", pins: "_Pins", new: Layout, followers: list[str],
                       cpus: CpuSet) -> None:
        """Queue the pool's followers whose processes are still the admitted ones:
        one poll of their pidfds together, not one each."""
        followed = lease.many(followers)
        exited = exited_among(f.pidfd for f in followed.values())
        for rel in followers:
            spec = new.get(rel)
            f = followed.get(rel)
            if spec is not None and spec.workload is not None and spec.pid is not None and f is not None \
                    and f.pidfd not in exited:
                pins.add(spec.pid, cpus, f.held_for(spec.pid))

    def evict(self, relpath: str | None, pid: int | None, identity: str | None, layout: Layout) -> None:
        """Re-pin a released workload's process and its descendants to the
        shared pool, while its pidfd vouches that it is still `identity`."""
        if pid is None or SHARED_CGROUP not in layout:
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            if identity is None or process_identity(pid) == identity:
                _pin_trees((pid,), layout[SHARED_CGROUP].cpus, setaffinity=self._setaffinity)
        finally:
            os.close(fd)

    def verify(self, layout: Layout, relpaths: Collection[str] | None = None) -> None:
        """Nothing to read back: sched_setaffinity either pinned a task or
        raised, and tasks created later inherit the mask."""

    def track(self, relpath: str, pid: int | None, identity: str | None = None) -> bool:
        """Watch `pid` for exit; False if it is already gone or unknown, or if
        it is no longer the process that was admitted (a recycled PID)."""
        if relpath in self._followed:
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
        held = _open_held(pid, fd, self.proc_root)
        with self._fds_lock:
            self._followed[relpath] = _Followed(pid, fd, held)
            self._by_fd[fd] = relpath
            self._epoll.register(fd, select.EPOLLIN)
        return True

    def _alive(self, relpath: str) -> bool:
        """The followed process has not exited (its pidfd is not readable);
        asked under the lock, so that the pidfd is not closed meanwhile."""
        with self._fds_lock:
            f = self._followed.get(relpath)
            return f is not None and not pidfd_exited(f.pidfd)

    def _borrow(self, relpaths: Iterable[str]) -> "dict[str, _Followed]":
        """The records of those of `relpaths` that are followed, each kept open
        until given back (`_give_back`), whatever forgets it meanwhile."""
        with self._fds_lock:
            out = {rel: f for rel in relpaths if (f := self._followed.get(rel)) is not None}
            for f in out.values():
                f.users += 1
        return out

    def _give_back(self, borrowed: "Iterable[_Followed]") -> None:
        with self._fds_lock:
            for f in borrowed:
                f.users -= 1
                if f.forgotten and not f.users:
                    f.close()

    def forget(self, relpath: str) -> None:
        """Stop following `relpath`, its process left as it is."""
        self._forget(relpath)

    def _forget(self, relpath: str) -> None:
        """Stop following `relpath`: its descriptors are closed now, or by the
        last apply still reading them (a number closed may be reused at once by
        any open: see released, and _Lease)."""
        with self._fds_lock:
            f = self._followed.pop(relpath, None)
            if f is None:
                return
            self._by_fd.pop(f.pidfd, None)
            _unwatch(self._epoll, f.pidfd)
            f.forgotten = True
            if not f.users:
                f.close()

    def exists(self, relpath: str) -> bool:
        return relpath in self._followed

    def populated(self, relpath: str) -> bool:
        """Its process has not exited: asked of its pidfd (a signal of 0 would
        still reach an exited process its parent has not reaped)."""
        return self._alive(relpath)

    def pids(self, relpath: str) -> list[int]:
        with self._fds_lock:
            f = self._followed.get(relpath)
            return [f.pid] if f is not None and not pidfd_exited(f.pidfd) else []

    def subtree_pids(self, relpath: str) -> list[int]:
        return self.pids(relpath)

    def read_cpuset(self, relpath: str) -> tuple[CpuSet, tuple[int, ...]]:
        """The tracked process's CPU affinity; its memory policy cannot be
        read from outside, so no memory nodes."""
        f = self._followed.get(relpath)
        if f is None:
            raise EnforcementError(f"no process is tracked for {relpath}")
        pid = f.pid
        try:
            return CpuSet(os.sched_getaffinity(pid)), ()
        except OSError as exc:
            raise EnforcementError(f"cannot read the affinity of pid {pid} ({relpath}): "
                                   f"{exc.strerror}") from None

    def existing(self) -> list[str]:
        """Only the tracked workloads: nothing of a workload outlives the
        agent but its process, so there is never anything to adopt."""
        return sorted(self._followed)

    def live_marked(self) -> list[MarkedProcess] | None:
        """Processes carrying NUMA_AGENT_WORKLOAD (numa_agent.enforcement.marked):
        the only trace of a workload the checkpoint lost."""
        return scan_marked(self.proc_root, exclude=(os.getpid(),))

    def fds(self) -> list[int]:
        """The epoll instance: readable when a followed process exited."""
        return [self._epoll.fileno()]

    def released(self, ready_fds: Collection[int]) -> list[str]:
        """Workload paths whose process exited, each reported once."""
        if self._epoll.fileno() not in ready_fds:
            return []
        out = []
        with self._fds_lock:
            for fd, _ in self._epoll.poll(0):
                rel = self._by_fd.get(fd)
                # Only a pidfd that reports the exit now, still of a followed workload.
                if rel is not None and pidfd_exited(fd):
                    out.append(rel)
                    _unwatch(self._epoll, fd)
        return sorted(out)

    def close(self) -> None:
        for rel in list(self._followed):
            self._forget(rel)
        self._epoll.close()


class _Held(NamedTuple):
    """Descriptors of a followed process's /proc/PID/task (its threads) and
    /proc/PID/task/PID/children (its main thread's children)."""

    task: int
    children: int


class _Followed:
    """A followed process: its PID, its pidfd and the files held for it. Closed
    when it is forgotten, or, if an apply is reading them then (borrowed, `users`),
    when the last one gives it back: never while a reader may still use a number."""

    __slots__ = ("pid", "pidfd", "held", "users", "forgotten")

    def __init__(self, pid: int, pidfd: int, held: _Held | None) -> None:
        self.pid, self.pidfd, self.held = pid, pidfd, held
        self.users = 0
        self.forgotten = False

    def held_for(self, pid: int) -> _Held | None:
        """The files held for its process, if that is `pid`."""
        return self.held if self.pid == pid else None

    def close(self) -> None:
        if self.held is not None:
            os.close(self.held.task)
            os.close(self.held.children)
        os.close(self.pidfd)


class _Lease:
    """The followed processes one apply reads (their pidfds polled, their held
    files listed and read when it pins), borrowed as it first asks for each and
    given back when it is done: a release applied meanwhile from another thread
    cannot close them under it, and so cannot let an open elsewhere take the
    number and the re-pin act on that file. No lock is held while it pins."""

    def __init__(self, enforcer: AffinityEnforcer) -> None:
        self._enforcer = enforcer
        self._taken: dict[str, _Followed | None] = {}

    def get(self, relpath: str) -> _Followed | None:
        return self.many((relpath,)).get(relpath)

    def many(self, relpaths: Iterable[str]) -> dict[str, _Followed]:
        wanted = [rel for rel in relpaths if rel not in self._taken]
        if wanted:
            borrowed = self._enforcer._borrow(wanted)
            self._taken.update({rel: borrowed.get(rel) for rel in wanted})
        return {rel: f for rel in relpaths if (f := self._taken.get(rel)) is not None}

    def give_back(self) -> None:
        self._enforcer._give_back(f for f in self._taken.values() if f is not None)
        self._taken = {}


def _open_held(pid: int, pidfd: int, proc: str = "/proc") -> _Held | None:
    """`pid`'s task directory and main thread's children file, or None. Opened
    by PID, they are the pidfd's process's only if that one has not exited
    since (its PID cannot be reused before): asked of the pidfd after the opens.

    Only in the lower half of the open-files limit (a new descriptor takes the
    lowest free number: one above that half means half the table is in use):
    the rest is kept for what cannot do without one, as each followed
    workload's pidfd and the API's clients. Without them, both are read by path."""
    try:
        task = os.open(f"{proc}/{pid}/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # gone, or out of descriptors
    try:
        children = os.open(f"{proc}/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(task)
        return None  # no such file on this kernel, gone, or out of descriptors
    if children >= _held_limit() or pidfd_exited(pidfd):
        os.close(children)
        os.close(task)
        return None
    return _Held(task, children)


def _held_limit() -> int:
    """Held children files stay below this descriptor number."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (1 << 20) if soft == resource.RLIM_INFINITY else soft // 2


def _unwatch(epoll: select.epoll, fd: int) -> None:
    try:
        epoll.unregister(fd)
    except (FileNotFoundError, OSError):
        pass  # no longer watched: its exit was reported


def _pin_trees(pids: Iterable[int], cpus: CpuSet, descendants: bool = True,
               finder: "_Tasks | None" = None,
               setaffinity: Callable[[int, Iterable[int]], None] = os.sched_setaffinity) -> int:
    """Pin every thread of each of `pids` and (unless not `descendants`) of
    their descendants (threads each carry their own affinity mask); returns
    how many threads were pinned. An empty set cannot be pinned to (the shared
    pool is empty only while CPUs are held for an operator): tasks stay where
    they are.

    Whole against a process that makes threads or children meanwhile (what
    a thread makes after its pin inherits the new mask): a process's main
    thread is pinned before its threads are listed, a thread before its
    children are read, and the threads are listed again only while a listing
    finds some not yet pinned (made before their maker's pin). A fork or clone
    in flight at its maker's pin has copied the old mask but is listed only
    once done, so once the whole tree is pinned each process's threads are
    listed and each thread's children read once more, and what is new is
    pinned (with its tree). One still in flight then escapes: only a cpuset
    cgroup closes that. A process of one thread and no children costs one
    pin, two listings, two reads."""
    if not cpus:
        log.error("no CPU to pin pid(s) %s to (the shared pool is empty); they keep their affinity",
                  ",".join(map(str, pids)))
        return 0
    ids = cpus.ids()
    finder = finder or _Tasks()
    pinned: set[int] = set()

    def pin(pid: int, tid: int) -> bool:
        """Pin `tid` of `pid`; False if it exited meanwhile (its threads may live on)."""
        pinned.add(tid)
        try:
            setaffinity(tid, ids)
        except ProcessLookupError:
            return False
        except OSError as exc:
            raise EnforcementError(f"cannot pin task {tid} of pid {pid} to CPUs "
                                   f"{cpus.format()}: {exc.strerror}") from None
        return True

    todo, seen, settled = list(pids), set[int](), set[int]()
    while todo:
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            new = [pid]
            while new:
                for tid in new:
                    if pin(pid, tid) and descendants:
                        todo.extend(finder.children(pid, tid))
                new = [tid for tid in finder.threads(pid) if tid not in pinned]
        for pid in seen - settled:  # the tree as found is pinned: the second look
            settled.add(pid)
            for tid in finder.threads(pid):
                if (tid in pinned or pin(pid, tid)) and descendants:
                    todo.extend(finder.children(pid, tid))
    return len(pinned)


class _Pins:
    """The pins of one apply, in its order: consecutive processes bound for
    the same CPUs (the shared pool's workloads when it changes) pinned as one
    batch, sharing one finder."""

    def __init__(self, setaffinity: Callable[[int, Iterable[int]], None] = os.sched_setaffinity) -> None:
        self.setaffinity = setaffinity
        self.finder = _Tasks()
        self.pids: list[int] = []
        self.cpus: CpuSet | None = None

    def add(self, pid: int, cpus: CpuSet, held: "_Held | None" = None) -> None:
        """Queue `pid`, vouched for by its pidfd; `held`: its files held since
        it was followed."""
        if self.cpus is not None and cpus is not self.cpus and cpus != self.cpus:
            self.flush()
        self.cpus = cpus
        self.pids.append(pid)
        if held is not None:
            self.finder.held[pid] = held

    def flush(self) -> None:
        if self.cpus is not None and self.pids:
            _pin_trees(self.pids, self.cpus, finder=self.finder, setaffinity=self.setaffinity)
        self.pids, self.cpus = [], None


def _read_proc(path: str) -> bytes:
    """A small /proc file in a few system calls (no buffered file object)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _Tasks:
    """Finds threads (/proc/PID/task) and children (/proc/PID/task/TID/children),
    for a followed process through the descriptors its enforcer holds: what a
    tree holds, not a scan of every process on the machine (a node runs
    thousands). A kernel without the children files (CONFIG_PROC_CHILDREN) gets one scan of /proc for the parent of every process, shared by every
    tree looked up through this finder (one apply re-pins a whole shared pool)."""

    def __init__(self, proc: str = "/proc", held: "dict[int, _Held] | None" = None) -> None:
        self.proc = proc
        self._by_parent: dict[int, list[int]] | None = None  # after a scan
        # PID -> the files held for it, for the processes the caller vouches
        # for (never one found as a descendant: its PID may be a reused one of
        # a followed process that has exited; a tree visits each PID once).
        self.held: dict[int, _Held] = dict(held or {})

    def threads(self, pid: int) -> list[int]:
        if (held := self.held.get(pid)) is not None:
            try:
                return [int(t) for t in os.listdir(held.task)]
            except (OSError, ValueError):
                pass  # listed by path below
        try:
            return [int(t) for t in os.listdir(f"{self.proc}/{pid}/task")]
        except (FileNotFoundError, ProcessLookupError):
            return []  # exited meanwhile
        except OSError:
            return [pid]

    def children(self, pid: int, tid: int) -> list[int]:
        """Children of thread `tid` of `pid` (of the whole process after a scan)."""
        if self._by_parent is not None:
            return self._by_parent.pop(pid, [])  # the process's, once: not again for each thread
        if tid == pid and (held := self.held.get(pid)) is not None:
            try:
                data = os.pread(held.children, _CHILDREN_READ, 0)
                if len(data) < _CHILDREN_READ:  # the whole file
                    return [int(c) for c in data.split()] if data else []
            except (OSError, ValueError):
                pass  # read by path below
        try:
            return [int(c) for c in _read_proc(f"{self.proc}/{pid}/task/{tid}/children").split()]
        except FileNotFoundError:
            if os.path.exists(f"{self.proc}/{pid}/task/{tid}"):  # alive: no such file here
                self._by_parent = _scan_parents(self.proc)
                return self._by_parent.pop(pid, [])
        except OSError:
            pass
        return []


# One read of a held children file: a shorter answer is the whole file.
_CHILDREN_READ = 4096


def _scan_parents(proc: str = "/proc") -> dict[int, list[int]]:
    """Parent PID -> child PIDs, from /proc/*/stat (the field after the
    command name, which may itself hold spaces and parentheses)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            stat = _read_proc(f"{proc}/{entry}/stat")
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


__all__ = ["AffinityEnforcer", "EnforcementError"]
