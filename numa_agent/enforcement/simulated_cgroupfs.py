"""The simulated cgroup backend: a directory of regular files that behaves like a
cgroup v2 subtree.

The agent enforces into it when it simulates another machine (`--sysfs-root`), so
that admissions, releases, recovery and metrics run as on the kernel without pinning
anything here; the tests use it as their cgroup tree. `make_simulated_cgroup_root`
writes the tree and, in its root, the file `.numa-agent-fake-cgroupfs` (the name
earlier trees carry; JSON: the machine's CPUs, memory nodes and huge page sizes) that
`SimulatedCgroupfs` reads its settings from.
`SimulatedCgroupfs` is a `CgroupFiles` backend (see cgroup.py): whoever assembles
the driver passes it in, as `CgroupV2(root, SimulatedCgroupfs(root))`, instead of
`KernelFiles()`; the driver never looks for the marker, so on a real cgroupfs
nothing extra ever happens.

The emulation follows the kernel's rules that the agent depends on
(Documentation/admin-guide/cgroup-v2.rst):
- a child's interface files exist only for controllers enabled in its
  parent's `cgroup.subtree_control`; `cgroup.controllers` lists those;
- enabling a controller not in `cgroup.controllers` is ENOENT; enabling a
  domain controller (memory, hugetlb, io...) in a cgroup that has processes,
  or moving a process into a cgroup that has one enabled for its children, is
  EBUSY (the "no internal processes" rule); the threaded controllers (cpuset,
  cpu, pids, perf_event) are exempt while the cgroup could still become a
  thread root; disabling a controller a child still enables is EBUSY;
- `cpuset.cpus`/`cpuset.mems` must lie within the machine's CPUs/nodes
  (EINVAL); an empty value means "inherit the parent's"; the effective sets
  are requested & parent's effective, falling back to the parent's when that
  is empty; a valid partition takes its CPUs out of its parent's effective set;
- a partition request that breaks the rules is accepted but reads back as
  "<type> invalid (<reason>)";
- moving a process into a cgroup with no effective CPUs is ENOSPC; a process
  that does not exist is ESRCH; rmdir of a populated cgroup or one with
  children is EBUSY; writing a read-only file is EACCES;
- `cgroup.events` is rewritten only when `populated` changes, so inotify
  watchers see IN_MODIFY exactly when the kernel would notify;
- a process leaves the tree when it exits: the fake holds a pidfd of every
  process moved in and exposes them as one descriptor (`fds`, an epoll set)
  for the agent's event loop, which hands it back to `ready` when readable; a
  process already exiting when it is written to `cgroup.procs` is not moved
  (the kernel skips exiting tasks);
- a directory takes `user.*` extended attributes of at most XATTR_SIZE_MAX
  bytes (E2BIG), and loses them with rmdir. They are real extended
  attributes of the directory where the file system holding the tree takes
  them, else a sidecar file `.xattr.<name>` in the directory (a regular file:
  never listed as a cgroup, removed by rmdir like the interface files).

Like the kernel, a write costs what it changes, not what the tree holds.
The effective file of a cgroup that asks for nothing (no request of its own,
no partition carved out of it) is a symbolic link to its parent's, so it
reads as the parent's value whatever that becomes: a shared pool's change
writes the pool's files and those of the children with requests of their
own (an index per cgroup names them), never one per inheriting child. Effective cpusets are
recomputed below the written cgroup only, down to where they come out
unchanged, and `populated` from the moved process's cgroups up to where it
stays as it was, from a count of populated children per cgroup; nothing
walks the whole tree but the first use of an instance (which reads where
every process is, and recomputes every effective file) and `recompute`.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import select
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.enforcement.cgroup import CGROUP2_SUPER_MAGIC, XATTR_SIZE_MAX
from numa_agent.enforcement.processes import pidfd_exited, process_alive

log = logging.getLogger("numa_agent.enforcement")

FAKE_MARKER = ".numa-agent-fake-cgroupfs"

# The kernel lists controllers in its subsystem order, not in write order.
_CONTROLLER_ORDER = ("cpuset", "cpu", "io", "memory", "perf_event", "hugetlb", "pids", "rdma", "misc")
# Controllers that tolerate processes in a cgroup that also has children.
_THREADED = frozenset({"cpuset", "cpu", "perf_event", "pids"})
DEFAULT_CONTROLLERS = ("cpuset", "cpu", "memory", "hugetlb")
DEFAULT_HUGEPAGE_SIZES = ("2MB", "1GB")
_PAGE_SIZE = 4096

_READ_ONLY = {
    "cgroup.controllers", "cgroup.events", "cgroup.stat",
    "cpuset.cpus.effective", "cpuset.mems.effective", "cpuset.cpus.exclusive.effective",
    "memory.current", "memory.events", "memory.stat", "cpu.stat",
}
_PARTITION_TYPES = ("root", "isolated")
# Every cgroup's own files (besides cgroup.controllers), as mkdir makes them.
_CORE_FILES = {"cgroup.subtree_control": "", "cgroup.procs": "", "cgroup.threads": "", "cgroup.type": "domain",
               "cgroup.events": "populated 0\nfrozen 0", "cgroup.freeze": "0", "cgroup.max.depth": "max",
               "cgroup.max.descendants": "max"}
_SIDECAR_PREFIX = ".xattr."
# As cgroupfs makes them; at most these bits, whatever the umask.
_DIR_MODE, _FILE_MODE = 0o755, 0o644
# What a file system says when it cannot hold an attribute (or one this size).
_NO_XATTR_HERE = frozenset({errno.EOPNOTSUPP, errno.ENOSPC, errno.E2BIG, errno.EPERM})


def make_simulated_cgroup_root(path: str | os.PathLike, cpus: CpuSet, mems: Iterable[int], *,
                          controllers: Iterable[str] = DEFAULT_CONTROLLERS,
                          hugepage_sizes: Iterable[str] = DEFAULT_HUGEPAGE_SIZES,
                          machine_cpus: CpuSet | None = None,
                          machine_mems: Iterable[int] | None = None) -> Path:
    """Create (or refresh) a fake agent root cgroup at `path`.

    The root stands for a non-root cgroup such as `numa.slice` whose parent
    enabled `controllers` for it; `cpus`/`mems` are its `cpuset.cpus` and
    `cpuset.mems`. `machine_*` default to the same sets and bound what any
    cgroup in the tree may request.
    """
    root = Path(path)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, _DIR_MODE)
    except FileExistsError:
        pass
    mems_set = CpuSet(mems)
    enabled = _ordered(controllers)
    unknown = sorted(set(enabled) - set(_CONTROLLER_ORDER))
    if unknown:
        raise ValueError(f"unknown cgroup controller(s): {', '.join(unknown)}")
    marker = {
        "machine_cpus": (machine_cpus if machine_cpus is not None else cpus).format(),
        "machine_mems": (CpuSet(machine_mems) if machine_mems is not None else mems_set).format(),
        "hugepage_sizes": list(hugepage_sizes),
    }
    _put(root / FAKE_MARKER, json.dumps(marker, sort_keys=True))
    fake = SimulatedCgroupfs(root)
    fake._write_core_files(root, enabled)
    fake._write_controller_files(root, enabled)
    _put(root / "cpuset.cpus", cpus.format())
    _put(root / "cpuset.mems", mems_set.format())
    fake._make_whole()  # a tree a crash left half made is read whole, by this recompute too
    fake.recompute()
    return root


class SimulatedCgroupfs:
    """Kernel-like side effects for one fake tree (see module docstring): the
    simulated `CgroupFiles` backend of the driver.

    One instance drives a tree at a time, as one kernel does: it learns where
    every process is from the tree on first use and keeps that index (and a
    pidfd per process) from then on. Every method takes one lock, so the
    event loop and the API threads see each write whole."""

    simulated = True

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(root))
        marker = json.loads((self.root / FAKE_MARKER).read_text())
        self.machine_cpus = CpuSet.parse(marker["machine_cpus"])
        self.machine_mems = CpuSet.parse(marker["machine_mems"])
        self.hugepage_sizes = tuple(marker["hugepage_sizes"])
        self._lock = threading.RLock()
        # Built on first need (a throwaway instance reading an xattr opens nothing).
        self._where: dict[int, Path] | None = None  # pid -> its cgroup
        self._pidfds: dict[int, int] = {}            # pid -> pidfd
        self._by_fd: dict[int, int] = {}             # pidfd -> pid
        self._unfollowed: set[int] = set()           # listed, but no pidfd could be had
        self._epoll: select.epoll | None = None      # readable when a followed process exited
        # cgroup -> how many of its children are populated (kept with `_where`)
        self._populated_kids: dict[Path, int] = {}
        # cgroup -> its children that do not follow it by link (see _Dependents)
        self._deps: dict[Path, _Dependents] | None = None
        self._whole = False  # every cgroup checked for a crash's leftovers (_make_whole)

    # ---- entry points used by the driver (CgroupFiles) ---------------------
    def read(self, file: Path) -> bytes:
        with self._lock, open(file, "rb") as f:
            return f.read()

    def cgroup_of(self, pid: int) -> Path | None:
        with self._lock:
            return self._index().get(pid)

    def fs_type(self, path: Path) -> int | None:
        # The tree stands for a cgroup2 mount, whatever really holds it.
        return CGROUP2_SUPER_MAGIC

    def mkdir(self, cgroup_dir: Path) -> None:
        with self._lock:
            self._dependents()  # of the tree without it
            os.mkdir(cgroup_dir, _DIR_MODE)
            enabled = _words(_get(cgroup_dir.parent / "cgroup.subtree_control"))
            self._write_core_files(cgroup_dir, enabled)
            self._write_controller_files(cgroup_dir, enabled)
            if _has_cpuset(cgroup_dir):
                # A new cgroup asks for nothing: it gets what its parent hands down.
                self._settle(cgroup_dir, None, self._given(cgroup_dir))
                self._deps_of(cgroup_dir.parent).children += 1
                self._note(cgroup_dir.parent)  # it has a child to hand changes down to now

    def rmdir(self, cgroup_dir: Path) -> None:
        with self._lock:
            if not cgroup_dir.is_dir():
                raise _oserror(errno.ENOENT, cgroup_dir)
            self.reap()
            if _has_child_dirs(cgroup_dir) or _procs(cgroup_dir):
                raise _oserror(errno.EBUSY, cgroup_dir)

            counted = _has_cpuset(cgroup_dir)

            def remove() -> None:
                for entry in cgroup_dir.iterdir():
                    entry.unlink()
                os.rmdir(cgroup_dir)
                self._forget(cgroup_dir, counted)
                self._populated_kids.pop(cgroup_dir, None)  # none: it had no children

            if cgroup_dir != self.root and _is_partition(cgroup_dir):
                # A removed partition hands its CPUs back to its parent.
                self._dependents()
                self._recarve(cgroup_dir.parent, remove)
            else:
                remove()

    def write(self, file: Path, value: str) -> None:
        with self._lock:
            self._write(file, value)

    def _write(self, file: Path, value: str) -> None:
        name = file.name
        cgroup_dir = file.parent
        if not file.is_file():
            raise _oserror(errno.ENOENT, file)
        if name in _READ_ONLY or name.endswith(".current") or name.endswith(".events"):
            raise _oserror(errno.EACCES, file)
        text = value.strip()
        if name == "cgroup.subtree_control":
            self._write_subtree_control(cgroup_dir, text)
        elif name == "cgroup.procs":
            self._move_pid(cgroup_dir, text)
        elif name in ("cpuset.cpus", "cpuset.cpus.exclusive"):
            cpus = _parse_or_einval(text, file)
            if not cpus.issubset(self.machine_cpus):
                raise _oserror(errno.EINVAL, file)
            self._write_request(cgroup_dir, lambda: _put(file, cpus.format()),
                                carving=cgroup_dir != self.root and _is_partition(cgroup_dir))
        elif name == "cpuset.mems":
            mems = _parse_or_einval(text, file)
            if not mems.issubset(self.machine_mems):
                raise _oserror(errno.EINVAL, file)
            self._write_request(cgroup_dir, lambda: _put(file, mems.format()), carving=False)
        elif name == "cpuset.cpus.partition":
            self._write_partition(cgroup_dir, text)
        elif name in ("memory.max", "memory.high", "memory.low", "memory.min", "memory.swap.max"):
            _put(file, _limit(text, _PAGE_SIZE, file))
        elif name.startswith("hugetlb.") and name.endswith(".max"):
            page = _size_bytes(name.split(".")[1])
            _put(file, _limit(text, page, file))
        else:
            _put(file, text)

    def setxattr(self, cgroup_dir: Path, name: str, value: bytes) -> None:
        if not cgroup_dir.is_dir():
            raise _oserror(errno.ENOENT, cgroup_dir)
        if not name.startswith("user."):
            raise _oserror(errno.EOPNOTSUPP, cgroup_dir)  # kernfs takes user.* (and trusted.*) only
        if len(value) > XATTR_SIZE_MAX:
            raise _oserror(errno.E2BIG, cgroup_dir)
        sidecar = cgroup_dir / (_SIDECAR_PREFIX + name)
        try:
            os.setxattr(cgroup_dir, name, value)
        except OSError as exc:
            if exc.errno not in _NO_XATTR_HERE:
                raise
        else:
            sidecar.unlink(missing_ok=True)
            return
        temporary = sidecar.with_name(sidecar.name + ".tmp")
        _put_bytes(temporary, value)
        os.replace(temporary, sidecar)
        try:
            os.removexattr(cgroup_dir, name)  # an older value must not shadow the sidecar
        except OSError:
            pass

    def getxattr(self, cgroup_dir: Path, name: str) -> bytes | None:
        if not cgroup_dir.is_dir():
            raise _oserror(errno.ENOENT, cgroup_dir)
        try:
            return os.getxattr(cgroup_dir, name)
        except OSError as exc:
            if exc.errno != errno.ENODATA and exc.errno not in _NO_XATTR_HERE:
                raise
        try:
            return (cgroup_dir / (_SIDECAR_PREFIX + name)).read_bytes()
        except FileNotFoundError:
            return None

    def removexattr(self, cgroup_dir: Path, name: str) -> None:
        if not cgroup_dir.is_dir():
            raise _oserror(errno.ENOENT, cgroup_dir)
        (cgroup_dir / (_SIDECAR_PREFIX + name)).unlink(missing_ok=True)
        try:
            os.removexattr(cgroup_dir, name)
        except OSError as exc:
            if exc.errno != errno.ENODATA and exc.errno not in _NO_XATTR_HERE:
                raise

    # ---- process exits ---------------------------------------------------------
    def fds(self) -> list[int]:
        """One descriptor, readable when a process in the tree has exited
        (an epoll set of their pidfds): hand it to `ready` then."""
        with self._lock:
            self._index()
            assert self._epoll is not None
            return [self._epoll.fileno()]

    def ready(self, fds: Collection[int]) -> None:
        """Drop the processes that exited, as the kernel does at exit: their
        cgroups' `cgroup.procs` and `cgroup.events` change (inotify sees it)."""
        with self._lock:
            if self._epoll is not None and self._epoll.fileno() in fds:
                self._drop_exited()

    def reap(self) -> None:
        """Bring membership up to date before it is read: the exits the
        pidfds report, and those of processes no pidfd could be had for."""
        with self._lock:
            self._index()
            self._drop_exited()
            for pid in sorted(self._unfollowed):
                if not process_alive(pid):
                    self.process_exited(pid)

    def process_exited(self, pid: int) -> None:
        """What the kernel does when a process dies: drop it, update events."""
        with self._lock:
            where = self._index()
            self._unfollow(pid)
            cgroup_dir = where.pop(pid, None)
            if cgroup_dir is not None and pid in _procs(cgroup_dir):
                _remove_pid(cgroup_dir, pid)
                self._populated_changed(cgroup_dir)
                return
            # Not where this instance put it (the tree was changed behind its back).
            for directory in self._all_cgroups():
                if pid in _procs(directory):
                    _remove_pid(directory, pid)
                    self._populated_changed(directory)

    def close(self) -> None:
        """Close every pidfd; the next use builds the index again."""
        with self._lock:
            for fd in self._by_fd:
                os.close(fd)
            self._by_fd.clear()
            self._pidfds.clear()
            self._unfollowed.clear()
            if self._epoll is not None:
                self._epoll.close()
                self._epoll = None
            self._where = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to tidy
            pass

    def _index(self) -> dict[int, Path]:
        """pid -> cgroup, read from the tree once; processes that are gone
        are dropped, as the kernel would have."""
        if self._where is not None:
            return self._where
        self._make_whole()
        self._where = {}
        self._epoll = select.epoll()
        for cgroup_dir in self._all_cgroups():
            listed = _procs(cgroup_dir)
            kept = [pid for pid in listed if pid not in self._where and self._follow(pid)]
            for pid in kept:
                self._where[pid] = cgroup_dir
            if kept != listed:
                _put_procs(cgroup_dir, kept)
        self.refresh_populated()
        return self._where

    def _follow(self, pid: int) -> bool:
        """Follow `pid` to its exit; False if it has no live process."""
        try:
            fd = _open_pidfd(pid)
        except OSError:
            return False
        if fd is None:
            self._unfollowed.add(pid)
        elif pidfd_exited(fd):
            os.close(fd)
            return False
        else:
            self._adopt_fd(pid, fd)
        return True

    def _adopt_fd(self, pid: int, fd: int) -> None:
        assert self._epoll is not None
        self._pidfds[pid] = fd
        self._by_fd[fd] = pid
        self._epoll.register(fd, select.EPOLLIN)

    def _unfollow(self, pid: int) -> None:
        self._unfollowed.discard(pid)
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            self._by_fd.pop(fd, None)
            if self._epoll is not None:
                self._epoll.unregister(fd)
            os.close(fd)

    def _drop_exited(self) -> None:
        if self._epoll is None:
            return
        for fd, _ in self._epoll.poll(0):
            pid = self._by_fd.get(fd)
            if pid is not None:
                self.process_exited(pid)

    # ---- emulated writes -------------------------------------------------
    def _write_subtree_control(self, cgroup_dir: Path, text: str) -> None:
        file = cgroup_dir / "cgroup.subtree_control"
        available = set(_words(_get(cgroup_dir / "cgroup.controllers")))
        before = set(_words(_get(file)))
        enabled = set(before)
        for token in text.split():
            sign, name = token[:1], token[1:]
            if sign not in "+-" or not name:
                raise _oserror(errno.EINVAL, file)
            if sign == "+":
                if name not in available:
                    raise _oserror(errno.ENOENT, file)
                if name not in enabled and _procs(cgroup_dir) and (
                        name not in _THREADED or not self._can_be_thread_root(cgroup_dir)):
                    raise _oserror(errno.EBUSY, file)
                enabled.add(name)
            elif name in enabled:
                for child in _child_dirs(cgroup_dir):
                    if name in _words(_get(child / "cgroup.subtree_control")):
                        raise _oserror(errno.EBUSY, file)
                enabled.discard(name)
        if enabled == before:
            return  # nothing changes for the children
        self._dependents()
        ordered = _ordered(enabled)
        _put(file, " ".join(ordered))
        for child in _child_dirs(cgroup_dir):
            self._write_controller_files(child, ordered)
        if ("cpuset" in enabled) != ("cpuset" in before):
            # The children gain or lose their cpuset files (and a partition
            # child its carving): recompute below, then what its parent sees.
            self._settle_below(cgroup_dir, None, self._available(cgroup_dir), _requested(cgroup_dir))
            self._note(cgroup_dir)

    def _move_pid(self, target: Path, text: str) -> None:
        file = target / "cgroup.procs"
        if not text.isdigit() or int(text) == 0:
            raise _oserror(errno.EINVAL, file)
        pid = int(text)
        where = self._index()
        known = pid in where
        fd = None
        if not known:
            try:
                fd = _open_pidfd(pid)
            except OSError:
                raise _oserror(errno.ESRCH, file) from None
        try:
            # The fake root stands for a non-root cgroup, so the rule applies to it too.
            if _words(_get(target / "cgroup.subtree_control")) and not self._can_be_thread_root(target):
                raise _oserror(errno.EBUSY, file)
            effective = target / "cpuset.cpus.effective"
            if effective.is_file() and not CpuSet.parse(_get(effective)):
                raise _oserror(errno.ENOSPC, file)
        except OSError:
            if fd is not None:
                os.close(fd)
            raise
        if not known:
            if fd is not None and pidfd_exited(fd):
                # The kernel skips an exiting task: the write succeeds, nothing moves.
                os.close(fd)
                return
            if fd is None:
                self._unfollowed.add(pid)
            else:
                self._adopt_fd(pid, fd)
        source = where.get(pid)
        if source == target:
            return
        where[pid] = target
        if source is not None:
            _remove_pid(source, pid)
        _put_procs(target, [*_procs(target), pid])
        # Target first: a common ancestor then never flips to empty and back.
        self._populated_changed(target)
        if source is not None and source.is_dir():
            self._populated_changed(source)

    def _write_partition(self, cgroup_dir: Path, text: str) -> None:
        file = cgroup_dir / "cpuset.cpus.partition"
        if text not in ("root", "isolated", "member"):
            raise _oserror(errno.EINVAL, file)
        self._dependents()
        if text == "member":
            value = "member"
        else:
            reason = self._partition_problem(cgroup_dir)
            value = f"{text} invalid ({reason})" if reason else text
        if cgroup_dir == self.root:
            _put(file, value)  # what the root is given does not depend on it
            return
        if _is_partition(cgroup_dir) or value in _PARTITION_TYPES:
            self._recarve(cgroup_dir.parent, lambda: _put(file, value), changed=cgroup_dir)
        else:
            _put(file, value)

    def _partition_problem(self, cgroup_dir: Path) -> str:
        cpus = CpuSet.parse(_get(cgroup_dir / "cpuset.cpus"))
        exclusive_file = cgroup_dir / "cpuset.cpus.exclusive"
        exclusive = CpuSet.parse(_get(exclusive_file)) if exclusive_file.is_file() else CpuSet()
        if not cpus and not exclusive:
            return "cpuset.cpus and cpuset.cpus.exclusive are empty"
        if cgroup_dir == self.root:
            # Its parent and siblings lie outside the fake tree: assume the
            # machine's top cgroup with no competing siblings.
            return ""
        parent_state = _get(cgroup_dir.parent / "cpuset.cpus.partition")
        # A partition below a non-partition needs exclusive CPUs handed down
        # explicitly (a "remote" partition).
        if parent_state not in _PARTITION_TYPES and not exclusive:
            return "Parent is not a partition root"
        wanted = exclusive or cpus
        # A sibling not among the dependents asks for no CPUs: it cannot clash.
        for sibling in sorted(self._deps_of(cgroup_dir.parent).cpus):
            if sibling == cgroup_dir:
                continue
            theirs = CpuSet.parse(_get(sibling / "cpuset.cpus"))
            if not theirs.isdisjoint(wanted):
                return "Cpu list in cpuset.cpus not exclusive"
        return ""

    # ---- derived state: effective cpusets -----------------------------------
    # A cgroup's "available" sets are its request narrowed to what its parent
    # hands it (the whole request if that is empty or disjoint: the parent's).
    # Its cpuset.*.effective is that less the CPUs of its valid partition
    # children. A non-partition child is handed its parent's effective sets; a
    # partition child its own partition CPUs within the parent's available.
    #
    # A child that asks for nothing is handed exactly its parent's effective
    # value: its effective file is then a symbolic link to its parent's, so it
    # follows every change of the parent as the kernel's would, and nothing
    # writes it (a pool's thousand inheriting workloads cost nothing when the
    # pool changes). Only the children that do not simply follow (a request
    # of their own, a partition, children of their own) are looked at, from an
    # index of them per cgroup (`_Dependents`), and a write recomputes below
    # the cgroup it changed down to where a child comes out unchanged.
    def recompute(self) -> None:
        """Recompute every effective cpuset from the requested ones (and the
        index of dependents) over the whole tree."""
        with self._lock:
            self._deps = {}
            self._settle(self.root, None, self._given(self.root))

    def _dependents(self) -> dict[Path, _Dependents]:
        """The index of dependents, built with a whole recompute on an
        instance's first change to the tree (which also turns the effective
        files of a tree written by an older agent into links)."""
        if self._deps is None:
            self._make_whole()
        if self._deps is None:
            self.recompute()
        assert self._deps is not None
        return self._deps

    def _make_whole(self) -> None:
        """Once per instance, before the tree is first read or changed: give
        every cgroup that a crash left half made (a directory lacking some of
        its interface files, from inside `mkdir` or `rmdir` here) the files its
        mkdir would have made, as the kernel's mkdir and rmdir, being atomic,
        never leave one without them; then recompute every effective file.
        What it then holds (nothing asked, no record, no process) is the
        agent's to adopt or remove, as on the kernel's tree."""
        if self._whole:
            return
        self._whole = True
        completed = []
        for cgroup_dir in self._all_cgroups():  # parents before children
            if cgroup_dir == self.root:
                continue
            enabled = _ordered(_words(_get(cgroup_dir.parent / "cgroup.subtree_control")))
            wanted = {"cgroup.controllers", *_CORE_FILES, *self._controller_files(enabled)}
            if not wanted <= set(os.listdir(cgroup_dir)):
                self._write_core_files(cgroup_dir, enabled)
                self._write_controller_files(cgroup_dir, enabled)
                completed.append(cgroup_dir)
        if completed:
            log.warning("simulated cgroup(s) %s were left half made by a crash; given the files their "
                        "mkdir makes", ", ".join(str(d.relative_to(self.root)) for d in completed))
            self.recompute()

    def _deps_of(self, cgroup_dir: Path) -> _Dependents:
        deps = self._dependents()
        found = deps.get(cgroup_dir)
        if found is None:
            found = deps[cgroup_dir] = _Dependents()
        return found

    def _note(self, kid: Path, requested: _Sets | None = None) -> None:
        """Record what the parent of `kid` must look at on its behalf when
        what it hands down changes."""
        if kid == self.root or not _has_cpuset(kid):
            return
        requested = _requested(kid) if requested is None else requested
        interior = self._deps_of(kid).children > 0
        partition = _is_partition(kid)
        deps = self._deps_of(kid.parent)
        _mark(deps.parts, kid, partition)
        _mark(deps.cpus, kid, partition or bool(requested[0]) or interior)
        _mark(deps.mems, kid, bool(requested[1]) or interior)

    def _forget(self, cgroup_dir: Path, counted: bool) -> None:
        """`cgroup_dir` is gone (`counted`: it was a cpuset child)."""
        if self._deps is None:
            return
        self._deps.pop(cgroup_dir, None)
        deps = self._deps_of(cgroup_dir.parent)
        for kids in (deps.parts, deps.cpus, deps.mems):
            kids.discard(cgroup_dir)
        if counted:
            deps.children -= 1
            self._note(cgroup_dir.parent)

    def _parts(self, cgroup_dir: Path) -> dict[Path, CpuSet]:
        """The valid partition children and their CPUs."""
        return {kid: _partition_cpus(kid) for kid in sorted(self._deps_of(cgroup_dir).parts)}

    def _given(self, cgroup_dir: Path) -> _Sets:
        """What the parent hands `cgroup_dir` now, from its ancestors only."""
        if cgroup_dir == self.root:
            return self.machine_cpus, self.machine_mems
        parent = cgroup_dir.parent
        if _is_partition(cgroup_dir):
            return _partition_cpus(cgroup_dir) & self._available(parent)[0], _effective(parent)[1]
        return _effective(parent)

    def _available(self, cgroup_dir: Path) -> _Sets:
        return _narrow(_requested(cgroup_dir), self._given(cgroup_dir))

    def _write_request(self, cgroup_dir: Path, mutate: Callable[[], None], carving: bool) -> None:
        """Write one of the cgroup's requests and recompute what it changes."""
        self._dependents()
        if carving:
            # A partition's CPUs are carved out of its parent: all its siblings may change.
            self._recarve(cgroup_dir.parent, mutate, changed=cgroup_dir)
            return
        given = self._given(cgroup_dir)  # its own request does not change what it is handed
        before = _narrow(_requested(cgroup_dir), given)
        mutate()
        requested = _requested(cgroup_dir)
        self._note(cgroup_dir, requested)
        # Even when its sets come out the same: whether it follows its parent may have changed.
        self._settle_below(cgroup_dir, before, _narrow(requested, given), requested)

    def _recarve(self, parent: Path, mutate: Callable[[], None], changed: Path | None = None) -> None:
        """`mutate` changes which CPUs the children of `parent` carve out of it
        (and possibly the request or the partition state of the child `changed`)."""
        available = self._available(parent)
        old_parts = self._parts(parent)
        old_changed = self._available(changed) if changed is not None else None
        mutate()
        if changed is not None:
            self._note(changed)
        new_parts = self._parts(parent)
        old_carved, new_carved = _carved(available, old_parts), _carved(available, new_parts)
        self._put_effective(parent, available, new_carved, (available[0] - old_carved, available[1]))
        # What the others are handed changes with the carving only: the
        # children that follow by link need no look.
        kids = self._deps_of(parent).cpus | old_parts.keys() | ({changed} if changed is not None else set())
        for kid in sorted(kids):
            new = _handed(available, new_carved, new_parts, kid)
            if kid == changed:
                requested = _requested(kid)
                self._settle_below(kid, old_changed, _narrow(requested, new), requested)
            elif kid.is_dir():
                self._settle(kid, _handed(available, old_carved, old_parts, kid), new)

    def _settle(self, cgroup_dir: Path, old_given: _Sets | None, new_given: _Sets) -> None:
        """`cgroup_dir` is handed `new_given` instead of `old_given` (None:
        unknown, recompute)."""
        if old_given == new_given or not _has_cpuset(cgroup_dir):
            return
        requested = _requested(cgroup_dir)
        before = _narrow(requested, old_given) if old_given is not None else None
        after = _narrow(requested, new_given)
        if before != after:
            self._settle_below(cgroup_dir, before, after, requested)

    def _settle_below(self, cgroup_dir: Path, before: _Sets | None, after: _Sets,
                      requested: _Sets) -> None:
        """The available sets of `cgroup_dir` became `after` (from `before`;
        None: unknown, recompute it and everything below it): its effective
        files, then the children that do not follow it by link."""
        kids: set[Path] = set(self._index_children(cgroup_dir)) if before is None else set()
        parts = self._parts(cgroup_dir)
        carved_after = _carved(after, parts)
        carved_before = _carved(before, parts) if before is not None else CpuSet()
        self._put_effective(cgroup_dir, after, carved_after,
                            (before[0] - carved_before, before[1]) if before is not None else None,
                            requested)
        if before is not None:
            deps = self._deps_of(cgroup_dir)
            if before[0] != after[0] or carved_before != carved_after:
                kids |= deps.cpus
            if before[1] != after[1]:
                kids |= deps.mems
        for kid in sorted(kids):
            old = _handed(before, carved_before, parts, kid) if before is not None else None
            self._settle(kid, old, _handed(after, carved_after, parts, kid))

    def _index_children(self, cgroup_dir: Path) -> list[Path]:
        """List the cpuset children of `cgroup_dir` and index them afresh."""
        # Children have cpuset files only when this cgroup enables cpuset for them.
        kids = [kid for kid in _child_dirs(cgroup_dir) if _has_cpuset(kid)] if "cpuset" in _words(
            _get(cgroup_dir / "cgroup.subtree_control")) else []
        self._dependents()[cgroup_dir] = _Dependents(children=len(kids))
        for kid in kids:
            self._note(kid)
        self._note(cgroup_dir)  # noted by its parent before its children were counted
        return kids

    def _put_effective(self, cgroup_dir: Path, available: _Sets, carved: CpuSet,
                       before: _Sets | None = None, requested: _Sets | None = None) -> None:
        """Write the effective files: a link to the parent's where the
        cgroup is handed the parent's value as it is, else the value (only
        where it changed, when `before`, the effective sets as they were, is
        known)."""
        follows = (False, False)
        if cgroup_dir != self.root:
            requested = _requested(cgroup_dir) if requested is None else requested
            plain = not _is_partition(cgroup_dir) and not self._deps_of(cgroup_dir).parts
            follows = (plain and not requested[0], not requested[1])
        cpus = available[0] - carved
        _put_derived(cgroup_dir / "cpuset.cpus.effective", cpus.bits, follows[0],
                     before is None or cpus != before[0])
        _put_derived(cgroup_dir / "cpuset.mems.effective", available[1].bits, follows[1],
                     before is None or available[1] != before[1])

    # ---- derived state: populated ---------------------------------------------
    def _populated_changed(self, start: Path) -> None:
        """The processes of `start` changed: rewrite `cgroup.events` of it and
        of each ancestor whose populated flag flips, and no further (an
        unchanged flag leaves every ancestor's as it was)."""
        counts = self._populated_kids
        cgroup_dir = start
        while True:
            # As the kernel does: a count of populated children, not a look at each.
            now = counts.get(cgroup_dir, 0) > 0 or bool(_procs(cgroup_dir))
            if now == _is_populated(cgroup_dir):
                return
            _put_events(cgroup_dir, now)
            if cgroup_dir == self.root:
                return
            cgroup_dir = cgroup_dir.parent
            counts[cgroup_dir] = counts.get(cgroup_dir, 0) + (1 if now else -1)

    def refresh_populated(self) -> None:
        """Every `cgroup.events` from the processes listed (a tree written
        behind the fake's back): the whole tree, once."""
        with self._lock:
            self._populated_kids = {}
            self._refresh_populated(self.root)

    def _refresh_populated(self, cgroup_dir: Path) -> bool:
        kids = sum(self._refresh_populated(kid) for kid in _child_dirs(cgroup_dir))
        if kids:
            self._populated_kids[cgroup_dir] = kids
        now = bool(_procs(cgroup_dir)) or kids > 0
        if now != _is_populated(cgroup_dir):
            _put_events(cgroup_dir, now)
        return now

    def _can_be_thread_root(self, cgroup_dir: Path) -> bool:
        # The kernel's test: only threaded controllers enabled for the children
        # and no child domain holding processes.
        if set(_words(_get(cgroup_dir / "cgroup.subtree_control"))) - _THREADED:
            return False
        self._index()
        return not self._populated_kids.get(cgroup_dir, 0)

    def _all_cgroups(self) -> list[Path]:
        return _subtree(self.root)

    # ---- interface files -------------------------------------------------------
    def _write_core_files(self, cgroup_dir: Path, enabled: Iterable[str]) -> None:
        _put(cgroup_dir / "cgroup.controllers", " ".join(_ordered(enabled)))
        for name, value in _CORE_FILES.items():
            if not (cgroup_dir / name).exists():
                _put(cgroup_dir / name, value)

    def _write_controller_files(self, cgroup_dir: Path, enabled: Iterable[str]) -> None:
        """Make the controller files match `enabled`, as the kernel does when
        the parent's subtree_control changes."""
        enabled = _ordered(enabled)
        _put(cgroup_dir / "cgroup.controllers", " ".join(enabled))
        wanted = self._controller_files(enabled)
        for entry in sorted(cgroup_dir.iterdir()):
            prefix = entry.name.split(".", 1)[0]
            if entry.is_file() and prefix in _CONTROLLER_ORDER and entry.name not in wanted:
                entry.unlink()
        for name, value in wanted.items():
            if not (cgroup_dir / name).exists():
                _put(cgroup_dir / name, value)

    def _controller_files(self, enabled: tuple[str, ...]) -> dict[str, str]:
        files: dict[str, str] = {}
        if "cpuset" in enabled:
            files.update({"cpuset.cpus": "", "cpuset.mems": "", "cpuset.cpus.effective": "",
                          "cpuset.mems.effective": "", "cpuset.cpus.partition": "member",
                          "cpuset.cpus.exclusive": "", "cpuset.cpus.exclusive.effective": ""})
        if "cpu" in enabled:
            files.update({"cpu.weight": "100", "cpu.max": "max 100000", "cpu.stat": ""})
        if "memory" in enabled:
            files.update({"memory.max": "max", "memory.high": "max", "memory.low": "0",
                          "memory.min": "0", "memory.current": "0", "memory.events": ""})
        if "hugetlb" in enabled:
            for size in self.hugepage_sizes:
                files.update({f"hugetlb.{size}.max": "max", f"hugetlb.{size}.current": "0",
                              f"hugetlb.{size}.events": "max 0"})
        return files


# ---- small file helpers (fake tree only) ----------------------------------------
_Sets = tuple[CpuSet, CpuSet]  # (cpus, memory nodes)


@dataclass
class _Dependents:
    """The children of one cgroup that do not simply follow it by link, so
    must be looked at when what it hands down changes. A superset does no
    harm (a child found unchanged costs a look); a missing one would."""

    cpus: set[Path] = field(default_factory=set)   # when the CPUs it hands down change
    mems: set[Path] = field(default_factory=set)   # when the memory nodes do
    parts: set[Path] = field(default_factory=set)  # its valid partition children
    children: int = 0  # how many cpuset children it has (one that has any is looked at)


def _mark(kids: set[Path], kid: Path, member: bool) -> None:
    if member:
        kids.add(kid)
    else:
        kids.discard(kid)


def _get(file: Path) -> str:
    return file.read_text().strip()


def _put(file: Path, value: str) -> None:
    # Overwrite in place, then cut to length: never open with O_TRUNC, on
    # which ext4 (auto_da_alloc) flushes the file at close, a millisecond a
    # write. In place also keeps the inode that inotify watches.
    _put_bytes(file, (value + "\n").encode() if value else b"")


def _put_bytes(file: Path, data: bytes) -> None:
    # Never through a link, and never writable by others whatever the umask:
    # the tree may lie in a state directory others can read, and the agent is root.
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE)
    try:
        if data:
            os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _ordered(names: Iterable[str]) -> tuple[str, ...]:
    names = set(names)
    known = tuple(n for n in _CONTROLLER_ORDER if n in names)
    return known + tuple(sorted(names - set(known)))


def _procs(cgroup_dir: Path) -> list[int]:
    return [int(line) for line in _get(cgroup_dir / "cgroup.procs").split()]


def _put_procs(cgroup_dir: Path, pids: Iterable[int]) -> None:
    _put(cgroup_dir / "cgroup.procs", "".join(f"{p}\n" for p in pids).strip())


def _remove_pid(cgroup_dir: Path, pid: int) -> None:
    pids = _procs(cgroup_dir)
    if pid in pids:
        _put_procs(cgroup_dir, (p for p in pids if p != pid))


def _is_populated(cgroup_dir: Path) -> bool:
    try:
        return "populated 1" in _get(cgroup_dir / "cgroup.events").splitlines()
    except FileNotFoundError:
        return False


def _put_events(cgroup_dir: Path, populated: bool) -> None:
    # Rewritten in place, never replaced: inotify watches this very inode.
    _put(cgroup_dir / "cgroup.events", f"populated {int(populated)}\nfrozen 0")


def _child_dirs(cgroup_dir: Path) -> list[Path]:
    return sorted(_iter_child_dirs(cgroup_dir))


def _iter_child_dirs(cgroup_dir: Path) -> Iterator[Path]:
    with os.scandir(cgroup_dir) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)


def _has_child_dirs(cgroup_dir: Path) -> bool:
    return any(True for _ in _iter_child_dirs(cgroup_dir))


def _subtree(cgroup_dir: Path) -> list[Path]:
    out = [cgroup_dir]
    for child in _child_dirs(cgroup_dir):
        out.extend(_subtree(child))
    return out


def _has_cpuset(cgroup_dir: Path) -> bool:
    return (cgroup_dir / "cpuset.cpus.effective").is_file()


def _requested(cgroup_dir: Path) -> _Sets:
    return (CpuSet.parse(_get(cgroup_dir / "cpuset.cpus")),
            CpuSet.parse(_get(cgroup_dir / "cpuset.mems")))


def _effective(cgroup_dir: Path) -> _Sets:
    return (CpuSet.parse(_get(cgroup_dir / "cpuset.cpus.effective")),
            CpuSet.parse(_get(cgroup_dir / "cpuset.mems.effective")))


def _narrow(requested: _Sets, given: _Sets) -> _Sets:
    # cgroup v2: an empty request means the parent's sets, and so does one
    # disjoint from them.
    return (requested[0] & given[0]) or given[0], (requested[1] & given[1]) or given[1]


def _carved(available: _Sets | None, parts: dict[Path, CpuSet]) -> CpuSet:
    if available is None:
        return CpuSet()
    return CpuSet.union_of(cpus & available[0] for cpus in parts.values())


def _handed(available: _Sets, carved: CpuSet, parts: dict[Path, CpuSet], kid: Path) -> _Sets:
    """What a cgroup with these available sets hands its child `kid`."""
    if kid in parts:
        return parts[kid] & available[0], available[1]
    return available[0] - carved, available[1]


def _put_derived(file: Path, bits: int, follows: bool, changed: bool) -> None:
    """An effective file: a link to the same file of the parent when
    `follows`, else its value (written when `changed`, or when it was a link)."""
    if follows:
        if not os.path.islink(file):
            # Replaced in one step: a reader never finds the file missing.
            temporary = file.with_name(f".{file.name}.link")
            temporary.unlink(missing_ok=True)
            os.symlink(f"../{file.name}", temporary)
            os.replace(temporary, file)
        return
    if os.path.islink(file):
        os.unlink(file)  # never written through: that would be the parent's file
        changed = True
    if changed:
        _put(file, _format(bits))


@functools.lru_cache(maxsize=256)
def _format(bits: int) -> str:
    # The children that inherit a pool all get the same list: format it once.
    return CpuSet.from_bits(bits).format()


def _is_partition(cgroup_dir: Path) -> bool:
    # A child whose parent did not enable cpuset has no partition file.
    file = cgroup_dir / "cpuset.cpus.partition"
    return file.is_file() and _get(file) in _PARTITION_TYPES


def _partition_cpus(cgroup_dir: Path) -> CpuSet:
    exclusive = cgroup_dir / "cpuset.cpus.exclusive"
    if exclusive.is_file() and _get(exclusive):
        return CpuSet.parse(_get(exclusive))
    return CpuSet.parse(_get(cgroup_dir / "cpuset.cpus"))


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of `pid`; None when the process exists but no pidfd can be had
    (descriptor limit, a kernel before 5.3). OSError ESRCH when it does not."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise OSError(errno.ESRCH, os.strerror(errno.ESRCH)) from None
    except OSError as exc:
        if not process_alive(pid):
            raise OSError(errno.ESRCH, os.strerror(errno.ESRCH)) from None
        global _warned_no_pidfd
        if not _warned_no_pidfd:
            _warned_no_pidfd = True
            log.warning("simulated cgroup tree: no pidfd for pid %d (%s); exits of such "
                        "processes are noticed only when the tree is read", pid, exc.strerror)
        return None


_warned_no_pidfd = False


def _parse_or_einval(text: str, file: Path) -> CpuSet:
    try:
        return CpuSet.parse(text)
    except CpuSetParseError:
        raise _oserror(errno.EINVAL, file) from None


def _limit(text: str, granule: int, file: Path) -> str:
    if text == "max":
        return "max"
    if not text.isdigit():
        raise _oserror(errno.EINVAL, file)
    # The kernel keeps limits in pages and rounds down.
    return str(int(text) // granule * granule)


def _size_bytes(label: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    return int(label[:-2]) * units[label[-2:]]


def _oserror(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))
