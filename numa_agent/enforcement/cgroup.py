"""cgroup v2 driver: plain file I/O below the agent's own cgroup.

`CgroupV2(root, files)` never touches anything outside `root`: every relative
path is validated first. Every OSError becomes a typed `CgroupError` (see
errors.py) whose message names the file, the value written and the errno.

The operations whose effects the kernel produces (reading and writing
interface files, mkdir, rmdir, noticing exited processes, the filesystem
type) go through `files`, a `CgroupFiles` chosen once by whoever assembles the
agent: `KernelFiles` on a real cgroupfs, or `SimulatedCgroupfs` (simulated_cgroupfs.py),
which reproduces the kernel's side effects on a tree of regular files. The
driver itself never asks which one it has.

Kernel rules this driver relies on (Documentation/admin-guide/cgroup-v2.rst):
- a controller can be enabled in `cgroup.subtree_control` only if it is listed
  in the same cgroup's `cgroup.controllers`;
- a non-root cgroup with a domain controller (memory, hugetlb, io) enabled
  for its children cannot hold processes (EBUSY), so workloads live in leaf
  cgroups;
- an empty `cpuset.cpus` or `cpuset.mems` means "inherit the parent's", which
  would silently give a workload every CPU: this driver refuses to write one;
- a partition request the kernel cannot honour is accepted and reads back as
  "<type> invalid (<reason>)": `set_partition` reads back and raises;
- cgroup2 directories take `user.*` extended attributes since Linux 5.7
  (kernfs: at most 128 KiB of them per inode; one value is at most
  XATTR_SIZE_MAX, 64 KiB, or E2BIG); older kernels answer EOPNOTSUPP.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterable, Protocol, runtime_checkable

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.hints import NumaMask
from numa_agent.core.names import is_engine_cgroup
from numa_agent.core.units import page_size_kb
from numa_agent.enforcement.errors import (
    CgroupError,
    CgroupInvalidError,
    CgroupPathError,
    CgroupRangeError,
    CgroupUnsupportedError,
    cgroup_error_from_oserror,
)
from numa_agent.enforcement.libc import libc
from numa_agent.enforcement.processes import parse_cgroup

CGROUP2_SUPER_MAGIC = 0x63677270
PARTITION_TYPES = ("root", "isolated", "member")
# The mode of the cgroup directories the agent makes, as systemd makes its own.
CGROUP_DIR_MODE = 0o755
# The largest value one setxattr(2) accepts (include/uapi/linux/limits.h).
XATTR_SIZE_MAX = 64 * 1024

_COMPONENT = re.compile(r"[A-Za-z0-9_.:@-]+")
_HUGETLB_MAX = re.compile(r"hugetlb\.(\d+[KMG]B)\.max")
# A cgroup named like an interface file ("memory.max") would collide with one.
_INTERFACE_PREFIXES = ("cgroup.", "cpuset.", "cpu.", "io.", "memory.", "hugetlb.",
                       "pids.", "rdma.", "misc.", "perf_event.")


@dataclass(frozen=True)
class CgroupCapabilities:
    """What the agent can do with its root cgroup. `reason` says why not."""

    root: str
    mounted: bool                 # root is a cgroup2 directory (or a fake tree)
    fake: bool                    # the files backend is a simulated tree
    writable: bool
    controllers: tuple[str, ...]  # from root/cgroup.controllers, kernel order
    cpuset: bool
    memory: bool
    hugetlb: bool
    partition: bool               # root/cpuset.cpus.partition exists
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.mounted and self.writable and self.cpuset


def hugetlb_size_name(size: int | str) -> str:
    """The kernel's hugetlb cgroup file infix for a huge page size.

    Accepts a size in kB (2048) or any name of one (core.units.page_size_kb:
    "2048kB", "hugepages-1048576kB", the cgroup form itself "2MB", "2Mi"). The kernel names
    files with the largest whole unit: KB below 1 MiB (upper-case K), then MB,
    then GB, so 2048kB -> "2MB" and 1048576kB -> "1GB".
    """
    kb = _size_kb(size)
    if kb <= 0:
        raise ValueError(f"huge page size must be positive, got {size!r}")
    if kb >= 1 << 20:
        return f"{kb >> 20}GB"
    if kb >= 1 << 10:
        return f"{kb >> 10}MB"
    return f"{kb}KB"


def _size_kb(size: int | str) -> int:
    return size if isinstance(size, int) else page_size_kb(size)


@runtime_checkable
class CgroupFiles(Protocol):
    """The cgroupfs operations whose effects the kernel produces.

    Paths are absolute and already validated by the driver; failures raise
    OSError with the kernel's errno (the driver turns them into CgroupError).
    """

    # True when the tree is a simulation, not the kernel's (for reports).
    simulated: bool

    def read(self, file: Path) -> bytes:
        """The whole content of an interface file."""
        ...

    def write(self, file: Path, value: str) -> None:
        """Write `value` to an existing interface file in one write()."""
        ...

    def mkdir(self, cgroup_dir: Path) -> None:
        ...

    def rmdir(self, cgroup_dir: Path) -> None:
        ...

    def reap(self) -> None:
        """Bring process membership up to date before it is read."""
        ...

    def fs_type(self, path: Path) -> int | None:
        """statfs f_type of the filesystem holding `path`, None if unknown."""
        ...

    def setxattr(self, cgroup_dir: Path, name: str, value: bytes) -> None:
        """Set the extended attribute `name` of a cgroup directory."""
        ...

    def getxattr(self, cgroup_dir: Path, name: str) -> bytes | None:
        """The value of `name`, None when the directory has no such attribute."""
        ...

    def removexattr(self, cgroup_dir: Path, name: str) -> None:
        """Remove `name`; nothing happens when it is not set."""
        ...

    def cgroup_of(self, pid: int) -> Path | None:
        """The cgroup directory process `pid` is in; None when it is gone."""
        ...

    def fds(self) -> list[int]:
        """Descriptors the agent's event loop must wait on for this backend
        to notice process exits (none on the kernel's tree, which notices
        them itself)."""
        ...

    def ready(self, fds: Collection[int]) -> None:
        """Some of `fds()` are readable: bring the tree up to date (its
        `cgroup.events` change as the kernel's would)."""
        ...

    def close(self) -> None:
        """Release the descriptors of `fds()`."""
        ...


class KernelFiles:
    """The real cgroupfs: plain file I/O; the kernel does the rest."""

    simulated = False

    def read(self, file: Path) -> bytes:
        with open(file, "rb") as f:
            return f.read()

    def write(self, file: Path, value: str) -> None:
        # No O_CREAT: a missing interface file means a missing controller,
        # which must surface as ENOENT rather than create a regular file.
        fd = os.open(file, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = value.encode("ascii")
            # cgroupfs parses one write() as one value; never split it.
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")
        finally:
            os.close(fd)

    def mkdir(self, cgroup_dir: Path) -> None:
        os.mkdir(cgroup_dir, CGROUP_DIR_MODE)  # never more, not even until the chmod below
        # 0755 whatever the umask (the unit's is 0077): a workload's own processes
        # and monitoring read their cgroup's files (memory.max, cpu.max, ...).
        # Through the directory's own descriptor: chmod by name follows a link.
        fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, CGROUP_DIR_MODE)
        finally:
            os.close(fd)

    def rmdir(self, cgroup_dir: Path) -> None:
        os.rmdir(cgroup_dir)

    def reap(self) -> None:
        pass  # the kernel drops exited processes itself

    def fs_type(self, path: Path) -> int | None:
        return _statfs_type(path)

    def setxattr(self, cgroup_dir: Path, name: str, value: bytes) -> None:
        os.setxattr(cgroup_dir, name, value, follow_symlinks=False)

    def getxattr(self, cgroup_dir: Path, name: str) -> bytes | None:
        try:
            return os.getxattr(cgroup_dir, name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                return None
            raise

    def removexattr(self, cgroup_dir: Path, name: str) -> None:
        try:
            os.removexattr(cgroup_dir, name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno != errno.ENODATA:
                raise

    def cgroup_of(self, pid: int) -> Path | None:
        # "0::<path>" is cgroup v2's line; the path is relative to the
        # reader's cgroup namespace, which is the mount's for the agent.
        try:
            with open(f"/proc/{pid}/cgroup", "rb") as f:
                path = parse_cgroup(f.read().decode("utf-8", "replace"))
        except (FileNotFoundError, ProcessLookupError):
            return None
        return None if path is None else Path(path)

    def fds(self) -> list[int]:
        return []  # the kernel drops exited processes and rewrites cgroup.events itself

    def ready(self, fds: Collection[int]) -> None:
        pass

    def close(self) -> None:
        pass


class CgroupV2:
    """Small typed driver for one cgroup v2 subtree rooted at `root`."""

    def __init__(self, root: str | os.PathLike, files: CgroupFiles) -> None:
        self.root = Path(os.path.abspath(root))
        self.files = files
        self.mount = _mount_of(self.root)

    # ---- paths -----------------------------------------------------------
    def path(self, relpath: str = "") -> Path:
        """Absolute directory of `relpath` ("" is the root), validated. A path
        that starts with "/" is an engine's cgroup (a container's, a Slurm
        task's): below the cgroup2 mount, as /proc/PID/cgroup names it, and
        outside the agent's own tree."""
        if not isinstance(relpath, str):
            raise CgroupPathError(f"cgroup path must be a string, got {type(relpath).__name__}")
        if relpath == "":
            return self.root
        if is_engine_cgroup(relpath):
            return self._engine_path(relpath)
        self._check_components(relpath)
        full = self.root.joinpath(*relpath.split("/"))
        # Belt and braces: the checks above already rule out escaping.
        if os.path.commonpath([self.root, full]) != str(self.root):
            raise CgroupPathError(f"cgroup path {relpath!r} escapes {self.root}", path=relpath)
        return full

    def _engine_path(self, cgroup: str) -> Path:
        inner = cgroup[1:]
        if self.mount == self.root:
            raise CgroupPathError(f"cgroup path {cgroup!r}: the agent's root {self.root} is the top of its "
                                  "hierarchy, so no engine's cgroup lies beside it", path=cgroup)
        if not inner:
            raise CgroupPathError("the cgroup root itself cannot hold a workload", path=cgroup)
        self._check_components(inner)
        full = self.mount.joinpath(*inner.split("/"))
        if full == self.root or self.root in full.parents or full in self.root.parents:
            raise CgroupPathError(f"cgroup {cgroup} is the agent's own tree ({self.root}) or "
                                  "above it, not an engine's cgroup", path=cgroup)
        return full

    def _check_components(self, relpath: str) -> None:
        for part in relpath.split("/"):
            if part == "":
                raise CgroupPathError(f"cgroup path {relpath!r} has an empty component",
                                      path=relpath)
            if part in (".", ".."):
                raise CgroupPathError(f"cgroup path {relpath!r} may not contain {part!r}",
                                      path=relpath)
            if not _COMPONENT.fullmatch(part):
                raise CgroupPathError(
                    f"cgroup path component {part!r} in {relpath!r} has characters "
                    "outside [A-Za-z0-9_.:@-]", path=relpath)
            if len(part.encode()) > 255:
                raise CgroupPathError(f"cgroup path component in {relpath!r} is longer "
                                      "than 255 bytes", path=relpath)
            if part.startswith(_INTERFACE_PREFIXES):
                raise CgroupPathError(f"cgroup name {part!r} in {relpath!r} would collide "
                                      "with a cgroup interface file", path=relpath)

    def _file(self, relpath: str, name: str) -> Path:
        return self.path(relpath) / name

    def _child(self, relpath: str) -> Path:
        if relpath == "":
            raise CgroupPathError("this operation needs a child cgroup, not the root itself")
        return self.path(relpath)

    # ---- raw I/O -----------------------------------------------------------
    def _read(self, file: Path) -> str:
        try:
            data = self.files.read(file)
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, "read", str(file)) from None
        return data.decode("ascii", errors="replace").replace("\x00", "").strip()

    def _write(self, file: Path, value: str) -> None:
        try:
            self.files.write(file, value)
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, "write", str(file), value) from None

    # ---- capabilities ---------------------------------------------------------
    def probe(self) -> CgroupCapabilities:
        root = self.root
        reasons: list[str] = []
        mounted = root.is_dir()
        if not mounted:
            reasons.append(f"no cgroup2 mounted at {root} (directory does not exist)")
        else:
            fs_type = self.files.fs_type(root)
            if fs_type is not None and fs_type != CGROUP2_SUPER_MAGIC:
                mounted = False
                reasons.append(f"no cgroup2 mounted at {root} (filesystem type {fs_type:#x})")
        controllers: tuple[str, ...] = ()
        if mounted:
            try:
                controllers = tuple(self._read(root / "cgroup.controllers").split())
            except CgroupError:
                mounted = False
                reasons.append(f"no cgroup2 mounted at {root} (no cgroup.controllers)")
        if mounted and "cpuset" not in controllers:
            reasons.append(f"cpuset controller not available in {root}/cgroup.controllers "
                           "(bound to cgroup v1?)")
        writable = mounted and os.access(root, os.W_OK | os.X_OK) and os.access(
            root / "cgroup.subtree_control", os.W_OK)
        if mounted and not writable:
            reasons.append(f"not writable: {root} (needs root or a delegated cgroup)")
        return CgroupCapabilities(
            root=str(root), mounted=mounted, fake=self.files.simulated, writable=writable,
            controllers=controllers, cpuset="cpuset" in controllers,
            memory="memory" in controllers, hugetlb="hugetlb" in controllers,
            partition=mounted and (root / "cpuset.cpus.partition").is_file(),
            reason="; ".join(reasons))

    def controllers(self, relpath: str = "") -> tuple[str, ...]:
        return tuple(self._read(self._file(relpath, "cgroup.controllers")).split())

    def subtree_control(self, relpath: str = "") -> tuple[str, ...]:
        return tuple(self._read(self._file(relpath, "cgroup.subtree_control")).split())

    def enable_controllers(self, relpath: str, names: Iterable[str]) -> tuple[str, ...]:
        """Enable `names` for the children of `relpath`, skipping those the
        cgroup does not offer. Returns the controllers actually requested."""
        available = self.controllers(relpath)
        wanted = [n for n in available if n in set(names)]
        if wanted:
            self._write(self._file(relpath, "cgroup.subtree_control"),
                        " ".join(f"+{n}" for n in wanted))
        return tuple(wanted)

    # ---- cgroups -----------------------------------------------------------------
    def exists(self, relpath: str) -> bool:
        return self.path(relpath).is_dir()

    def create(self, relpath: str, exist_ok: bool = False) -> Path:
        """mkdir one cgroup; its parent must exist (the kernel has no -p)."""
        directory = self._child(relpath)
        if exist_ok and directory.is_dir():
            return directory
        try:
            self.files.mkdir(directory)
        except OSError as exc:
            if exist_ok and exc.errno == errno.EEXIST:
                return directory  # made meanwhile (another thread's change): as good
            raise cgroup_error_from_oserror(exc, "mkdir", str(directory)) from None
        return directory

    def remove(self, relpath: str) -> None:
        """rmdir one cgroup. EBUSY (processes or children left) raises
        CgroupBusyError."""
        directory = self._child(relpath)
        try:
            self.files.rmdir(directory)
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, "rmdir", str(directory)) from None

    def children(self, relpath: str = "") -> list[str]:
        """Relative paths of the direct child cgroups, sorted."""
        directory = self.path(relpath)
        try:
            names = sorted(e.name for e in os.scandir(directory) if e.is_dir(follow_symlinks=False))
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, "list", str(directory)) from None
        return [f"{relpath}/{n}" if relpath else n for n in names]

    # ---- cpuset --------------------------------------------------------------------
    def write_cpuset(self, relpath: str, cpus: CpuSet, mems: Iterable[int]) -> None:
        """Write `cpuset.mems`, then `cpuset.cpus`.

        cgroup v2 accepts the two files in either order for one cgroup; the
        order that matters is between siblings (shrink the donor first, then
        grow the receiver), which the caller owns. Memory goes first so that,
        whenever the cgroup is allowed onto new CPUs, its allocations are
        already constrained to (and migrated onto) the nodes meant for them.
        """
        mem_set = CpuSet(mems)
        if not cpus:
            raise CgroupInvalidError(
                f"refusing to write an empty cpuset.cpus for {relpath!r}: cgroup v2 treats it "
                "as 'inherit every CPU of the parent'", path=relpath, value="")
        if not mem_set:
            raise CgroupInvalidError(
                f"refusing to write an empty cpuset.mems for {relpath!r}: cgroup v2 treats it "
                "as 'inherit every node of the parent'", path=relpath, value="")
        self._write(self._file(relpath, "cpuset.mems"), mem_set.format())
        self._write(self._file(relpath, "cpuset.cpus"), cpus.format())

    def write_cpuset_inherited(self, relpath: str, mems: Iterable[int]) -> None:
        """Write `cpuset.mems`, then clear `cpuset.cpus`: the cgroup then runs
        on its parent's effective CPUs and follows them as they change."""
        mem_set = CpuSet(mems)
        if not mem_set:
            raise CgroupInvalidError(
                f"refusing to write an empty cpuset.mems for {relpath!r}: cgroup v2 treats it "
                "as 'inherit every node of the parent'", path=relpath, value="")
        self._write(self._file(relpath, "cpuset.mems"), mem_set.format())
        self._write(self._file(relpath, "cpuset.cpus"), "\n")

    def clear_cpuset(self, relpath: str) -> None:
        """Empty `cpuset.cpus` and `cpuset.mems`: the cgroup runs on its
        parent's effective CPUs and nodes again, as one nobody wrote."""
        self._write(self._file(relpath, "cpuset.cpus"), "\n")
        self._write(self._file(relpath, "cpuset.mems"), "\n")

    def read_effective(self, relpath: str = "") -> tuple[CpuSet, NumaMask]:
        """(CPUs, memory nodes) the kernel actually grants; the requested
        files are read when a (fake) tree has no `*.effective` ones."""
        return (self._read_list(relpath, "cpuset.cpus"),
                NumaMask.from_bits(self._read_list(relpath, "cpuset.mems").bits))

    def _read_list(self, relpath: str, base: str) -> CpuSet:
        effective = self._file(relpath, base + ".effective")
        file = effective if effective.is_file() else self._file(relpath, base)
        text = self._read(file)
        try:
            return CpuSet.parse(text)
        except CpuSetParseError:
            raise CgroupInvalidError(f"unexpected content {text!r} in {file}",
                                     path=str(file)) from None

    def set_partition(self, relpath: str, kind: str) -> None:
        """Write `cpuset.cpus.partition` and check the kernel honoured it."""
        if kind not in PARTITION_TYPES:
            raise CgroupInvalidError(
                f"partition type must be one of {', '.join(PARTITION_TYPES)}, got {kind!r}",
                path=relpath, value=kind)
        file = self._file(relpath, "cpuset.cpus.partition")
        self._write(file, kind)
        state = self.partition(relpath)
        if state != kind:
            raise CgroupInvalidError(f"wrote {kind!r} to {file} but the kernel reports "
                                     f"{state!r}", path=str(file), value=kind)

    def partition(self, relpath: str) -> str:
        return self._read(self._file(relpath, "cpuset.cpus.partition"))

    # ---- limits ----------------------------------------------------------------------
    def write_memory_max(self, relpath: str, limit_bytes: int | None) -> None:
        """`memory.max`; None removes the limit ("max")."""
        self._write(self._file(relpath, "memory.max"), _limit_text(limit_bytes, "memory.max"))

    def write_hugetlb_max(self, relpath: str, size: int | str, limit_bytes: int | None) -> None:
        """`hugetlb.<size>.max`. `size` is a kB count or label (see
        hugetlb_size_name). The kernel silently rounds a limit down to whole
        huge pages, so a limit that is not a multiple is refused here."""
        name = hugetlb_size_name(size)
        page_bytes = _size_kb(size) * 1024
        if limit_bytes is not None and limit_bytes % page_bytes:
            raise CgroupInvalidError(
                f"hugetlb limit {limit_bytes} is not a multiple of the {name} page size "
                f"({page_bytes} bytes) for {relpath!r}", path=relpath, value=str(limit_bytes))
        file = self._file(relpath, f"hugetlb.{name}.max")
        self._write(file, _limit_text(limit_bytes, file.name))

    def read_memory_max(self, relpath: str) -> int | None:
        """`memory.max` in bytes; None for "max" (no limit)."""
        return _limit_value(self._read(self._file(relpath, "memory.max")), "memory.max", relpath)

    def hugetlb_sizes(self, relpath: str) -> tuple[int, ...]:
        """Huge page sizes (kB) that have a `hugetlb.<size>.max` in `relpath`."""
        directory = self.path(relpath)
        try:
            names = [e.name for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, "list", str(directory)) from None
        return tuple(sorted(_size_kb(m.group(1)) for m in map(_HUGETLB_MAX.fullmatch, names) if m))

    def read_hugetlb_max(self, relpath: str, size: int | str) -> int | None:
        """`hugetlb.<size>.max` in bytes; None for "max" (no limit)."""
        file = self._file(relpath, f"hugetlb.{hugetlb_size_name(size)}.max")
        return _limit_value(self._read(file), file.name, relpath)

    # ---- extended attributes -------------------------------------------------------------
    def write_xattr(self, relpath: str, name: str, value: bytes) -> None:
        """Set the `user.*` attribute `name` of a cgroup directory. A value
        longer than XATTR_SIZE_MAX raises CgroupRangeError (E2BIG) without a
        call; a kernel before 5.7 raises CgroupUnsupportedError."""
        directory = self._child(relpath)
        _check_xattr_name(name, relpath)
        if len(value) > XATTR_SIZE_MAX:
            raise CgroupRangeError(
                f"setxattr {name} of {directory} failed: E2BIG (the value is {len(value)} bytes, "
                f"more than the {XATTR_SIZE_MAX} one attribute may hold)", path=str(directory),
                errno=errno.E2BIG)
        try:
            self.files.setxattr(directory, name, value)
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, f"setxattr {name} of", str(directory)) from None

    def read_xattr(self, relpath: str, name: str) -> bytes | None:
        """The attribute's value, None when it is not set."""
        directory = self._child(relpath)
        _check_xattr_name(name, relpath)
        try:
            return self.files.getxattr(directory, name)
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, f"getxattr {name} of", str(directory)) from None

    def remove_xattr(self, relpath: str, name: str) -> None:
        directory = self._child(relpath)
        _check_xattr_name(name, relpath)
        try:
            self.files.removexattr(directory, name)
        except OSError as exc:
            raise cgroup_error_from_oserror(exc, f"removexattr {name} of", str(directory)) from None

    # ---- processes ---------------------------------------------------------------------
    def cgroup_of(self, pid: int) -> str | None:
        """The cgroup of process `pid` as /proc/PID/cgroup names it ("/a/b",
        below the mount); None when the process is gone."""
        where = self.files.cgroup_of(pid)
        if where is None:
            return None
        if where.is_absolute() and self.mount in (where, *where.parents):
            where = where.relative_to(self.mount)  # a simulated tree names its directory
        return "/" + str(where).strip("/")

    def move_pid(self, relpath: str, pid: int) -> None:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise CgroupInvalidError(f"pid must be a positive integer, got {pid!r}",
                                     path=relpath, value=str(pid))
        self._write(self._file(relpath, "cgroup.procs"), str(pid))

    def procs(self, relpath: str = "") -> list[int]:
        self.files.reap()
        text = self._read(self._file(relpath, "cgroup.procs"))
        return sorted(int(line) for line in text.split())

    def populated(self, relpath: str = "") -> bool:
        self.files.reap()
        file = self._file(relpath, "cgroup.events")
        for line in self._read(file).splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
        raise CgroupInvalidError(f"no 'populated' key in {file}", path=str(file))


def _mount_of(root: Path) -> Path:
    """The top of the cgroup2 hierarchy `root` lies in: its highest ancestor
    that is still a cgroup (has `cgroup.controllers`); `root` itself when its
    parent is not one."""
    top = root
    while top.parent != top and (top.parent / "cgroup.controllers").is_file():
        top = top.parent
    return top


def _limit_value(text: str, what: str, relpath: str) -> int | None:
    if text == "max":
        return None
    if not text.isdigit():
        raise CgroupInvalidError(f"unexpected content {text!r} in {what} of {relpath!r}",
                                 path=relpath, value=text)
    return int(text)


def _check_xattr_name(name: str, relpath: str) -> None:
    # Only the unprivileged namespace: trusted.* and security.* are not the agent's.
    if not name.startswith("user.") or len(name) == len("user."):
        raise CgroupInvalidError(f"extended attribute name {name!r} for {relpath!r} must be "
                                 "user.<something>", path=relpath, value=name)


def _limit_text(limit_bytes: int | None, what: str) -> str:
    if limit_bytes is None:
        return "max"
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise CgroupInvalidError(f"{what} must be a byte count >= 0 or None, got {limit_bytes!r}",
                                 value=str(limit_bytes))
    return str(limit_bytes)


# ---- libc through ctypes ----------------------------------------------------------------


def _statfs_type(path: Path) -> int | None:
    """f_type of statfs(2) (the first field on every Linux ABI), or None."""
    buf = ctypes.create_string_buffer(512)
    try:
        rc = libc().statfs(os.fsencode(path), buf)
    except (OSError, AttributeError):
        return None
    if rc != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


_IN_MODIFY = 0x00000002
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


class EventWatcher:
    """Tells which watched cgroups' `cgroup.events` changed, without polling.

    The kernel signals a change of `populated` as a modification of
    `cgroup.events` (inotify IN_MODIFY; also POLLPRI). Register `fileno()`
    with a selector or asyncio loop and call `read_events()` when readable;
    then ask `CgroupV2.populated()` for the new state.

    API threads watch and unwatch while the event loop reads: a watch is added
    and mapped to its cgroup under `_lock`, and the events are read and
    decoded under it too, so that an event of a watch just added is never read
    before the watch is mapped (dropped as unknown, or taken for the cgroup
    a reused number named before).
    """

    def __init__(self, cgroup: CgroupV2) -> None:
        self._cgroup = cgroup
        self._wd_to_rel: dict[int, str] = {}
        self._rel_to_wd: dict[str, int] = {}
        self._lock = threading.Lock()
        try:
            init = libc().inotify_init1
        except AttributeError:
            raise CgroupUnsupportedError("inotify_init1 is not available in this libc") from None
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise cgroup_error_from_oserror(_last_oserror(), "inotify_init1", "(inotify)")
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def watch(self, relpath: str) -> None:
        # Always asked of the kernel (the same file gives the same wd): a cgroup
        # removed and made again under this name has a new one, and the old
        # one's removal may not have been read yet.
        file = self._cgroup.path(relpath) / "cgroup.events"
        with self._lock:
            wd = libc().inotify_add_watch(self._fd, os.fsencode(file), _IN_MODIFY)
            if wd < 0:
                raise cgroup_error_from_oserror(_last_oserror(), "watch", str(file))
            old = self._rel_to_wd.get(relpath)
            if old is not None and old != wd:
                self._wd_to_rel.pop(old, None)
            self._wd_to_rel[wd] = relpath
            self._rel_to_wd[relpath] = wd

    def occupied(self, relpath: str) -> None:
        """A process was moved in: inotify saw the change itself."""

    def unwatch(self, relpath: str) -> None:
        with self._lock:
            wd = self._rel_to_wd.pop(relpath, None)
            if wd is not None:
                self._wd_to_rel.pop(wd, None)
                # Fails harmlessly when the cgroup (and so the watch) is gone.
                libc().inotify_rm_watch(self._fd, wd)

    def watched(self) -> list[str]:
        with self._lock:
            return sorted(self._rel_to_wd)

    def read_events(self) -> list[str]:
        """Relative paths whose `cgroup.events` changed since the last call,
        each once, in arrival order; [] when nothing is pending. On queue
        overflow every watched path is returned, since any may have changed."""
        with self._lock:
            return self._read_events()

    def _read_events(self) -> list[str]:
        changed: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                break
            if not data:
                break
            offset = 0
            while offset + _EVENT_HEADER.size <= len(data):
                wd, mask, _cookie, name_len = _EVENT_HEADER.unpack_from(data, offset)
                offset += _EVENT_HEADER.size + name_len
                if mask & _IN_Q_OVERFLOW:
                    changed.extend(sorted(self._rel_to_wd))
                    continue
                relpath = self._wd_to_rel.get(wd)
                if relpath is None:
                    continue
                if mask & _IN_IGNORED:
                    # The cgroup was removed; its watch is gone.
                    self._wd_to_rel.pop(wd, None)
                    if self._rel_to_wd.get(relpath) == wd:
                        del self._rel_to_wd[relpath]
                    continue
                if mask & _IN_MODIFY:
                    changed.append(relpath)
        return list(dict.fromkeys(changed))

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                self._wd_to_rel.clear()
                self._rel_to_wd.clear()

    def __enter__(self) -> "EventWatcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _last_oserror() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))
