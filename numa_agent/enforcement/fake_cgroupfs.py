"""A directory of regular files that behaves like a cgroup v2 subtree.

Used by the tests and by the agent's dev mode on machines without a writable
cgroup2 cpuset controller. `make_fake_cgroup_root` writes the tree and, in its
root, the file `.numa-agent-fake-cgroupfs` (JSON: the machine's CPUs, memory
nodes and huge page sizes) that `FakeCgroupfs` reads its settings from.
`FakeCgroupfs` is a `CgroupFiles` backend (see cgroup.py): whoever assembles
the driver passes it in, as `CgroupV2(root, FakeCgroupfs(root))`, instead of
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
- a directory takes `user.*` extended attributes of at most XATTR_SIZE_MAX
  bytes (E2BIG), and loses them with rmdir. They are real extended
  attributes of the directory where the file system holding the tree takes
  them, else a sidecar file `.xattr.<name>` in the directory (a regular file:
  never listed as a cgroup, removed by rmdir like the interface files).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Iterable

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.enforcement.cgroup import CGROUP2_SUPER_MAGIC, XATTR_SIZE_MAX
from numa_agent.enforcement.processes import process_alive

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
_SIDECAR_PREFIX = ".xattr."
# What a file system says when it cannot hold an attribute (or one this size).
_NO_XATTR_HERE = frozenset({errno.EOPNOTSUPP, errno.ENOSPC, errno.E2BIG, errno.EPERM})


def make_fake_cgroup_root(path: str | os.PathLike, cpus: CpuSet, mems: Iterable[int], *,
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
    root.mkdir(parents=True, exist_ok=True)
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
    (root / FAKE_MARKER).write_text(json.dumps(marker, sort_keys=True) + "\n")
    fake = FakeCgroupfs(root)
    fake._write_core_files(root, enabled)
    fake._write_controller_files(root, enabled)
    _put(root / "cpuset.cpus", cpus.format())
    _put(root / "cpuset.mems", mems_set.format())
    fake.recompute()
    return root


class FakeCgroupfs:
    """Kernel-like side effects for one fake tree (see module docstring): the
    simulated `CgroupFiles` backend of the driver."""

    simulated = True

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.path.abspath(root))
        marker = json.loads((self.root / FAKE_MARKER).read_text())
        self.machine_cpus = CpuSet.parse(marker["machine_cpus"])
        self.machine_mems = CpuSet.parse(marker["machine_mems"])
        self.hugepage_sizes = tuple(marker["hugepage_sizes"])

    # ---- entry points used by the driver (CgroupFiles) ---------------------
    def read(self, file: Path) -> bytes:
        with open(file, "rb") as f:
            return f.read()

    def fs_type(self, path: Path) -> int | None:
        # The tree stands for a cgroup2 mount, whatever really holds it.
        return CGROUP2_SUPER_MAGIC

    def mkdir(self, cgroup_dir: Path) -> None:
        os.mkdir(cgroup_dir)
        enabled = _words(_get(cgroup_dir.parent / "cgroup.subtree_control"))
        self._write_core_files(cgroup_dir, enabled)
        self._write_controller_files(cgroup_dir, enabled)
        self.recompute()

    def rmdir(self, cgroup_dir: Path) -> None:
        if not cgroup_dir.is_dir():
            raise _oserror(errno.ENOENT, cgroup_dir)
        self.reap()
        if _child_dirs(cgroup_dir) or _procs(cgroup_dir):
            raise _oserror(errno.EBUSY, cgroup_dir)
        for entry in cgroup_dir.iterdir():
            entry.unlink()
        os.rmdir(cgroup_dir)
        # A removed partition hands its CPUs back to its parent.
        self.recompute()

    def write(self, file: Path, value: str) -> None:
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
            _put(file, cpus.format())
            self.recompute()
        elif name == "cpuset.mems":
            mems = _parse_or_einval(text, file)
            if not mems.issubset(self.machine_mems):
                raise _oserror(errno.EINVAL, file)
            _put(file, mems.format())
            self.recompute()
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
        temporary.write_bytes(value)
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

    def process_exited(self, pid: int) -> None:
        """What the kernel does when a process dies: drop it, update events."""
        for cgroup_dir in self._all_cgroups():
            pids = _procs(cgroup_dir)
            if pid in pids:
                pids.remove(pid)
                _put(cgroup_dir / "cgroup.procs", "".join(f"{p}\n" for p in pids))
        self._refresh_events()

    def reap(self) -> None:
        """Drop processes that no longer exist, as the kernel does at exit
        (a fake tree learns of exits only when someone looks)."""
        for cgroup_dir in self._all_cgroups():
            for pid in _procs(cgroup_dir):
                if not process_alive(pid):
                    self.process_exited(pid)

    # ---- emulated writes -------------------------------------------------
    def _write_subtree_control(self, cgroup_dir: Path, text: str) -> None:
        file = cgroup_dir / "cgroup.subtree_control"
        available = set(_words(_get(cgroup_dir / "cgroup.controllers")))
        enabled = set(_words(_get(file)))
        for token in text.split():
            sign, name = token[:1], token[1:]
            if sign not in "+-" or not name:
                raise _oserror(errno.EINVAL, file)
            if sign == "+":
                if name not in available:
                    raise _oserror(errno.ENOENT, file)
                if name not in enabled and _procs(cgroup_dir) and (
                        name not in _THREADED or not _can_be_thread_root(cgroup_dir)):
                    raise _oserror(errno.EBUSY, file)
                enabled.add(name)
            else:
                for child in _child_dirs(cgroup_dir):
                    if name in _words(_get(child / "cgroup.subtree_control")):
                        raise _oserror(errno.EBUSY, file)
                enabled.discard(name)
        ordered = _ordered(enabled)
        _put(file, " ".join(ordered))
        for child in _child_dirs(cgroup_dir):
            self._write_controller_files(child, ordered)
        self.recompute()

    def _move_pid(self, target: Path, text: str) -> None:
        file = target / "cgroup.procs"
        if not text.isdigit():
            raise _oserror(errno.EINVAL, file)
        pid = int(text)
        if not Path(f"/proc/{pid}").exists():
            raise _oserror(errno.ESRCH, file)
        # The fake root stands for a non-root cgroup, so the rule applies to it too.
        if _words(_get(target / "cgroup.subtree_control")) and not _can_be_thread_root(target):
            raise _oserror(errno.EBUSY, file)
        effective = target / "cpuset.cpus.effective"
        if effective.is_file() and not CpuSet.parse(_get(effective)):
            raise _oserror(errno.ENOSPC, file)
        for cgroup_dir in self._all_cgroups():
            pids = _procs(cgroup_dir)
            if pid in pids and cgroup_dir != target:
                pids.remove(pid)
                _put(cgroup_dir / "cgroup.procs", "".join(f"{p}\n" for p in pids))
        pids = _procs(target)
        if pid not in pids:
            pids.append(pid)
            _put(file, "".join(f"{p}\n" for p in pids))
        self._refresh_events()

    def _write_partition(self, cgroup_dir: Path, text: str) -> None:
        file = cgroup_dir / "cpuset.cpus.partition"
        if text not in ("root", "isolated", "member"):
            raise _oserror(errno.EINVAL, file)
        if text == "member":
            _put(file, "member")
        else:
            reason = self._partition_problem(cgroup_dir)
            _put(file, f"{text} invalid ({reason})" if reason else text)
        self.recompute()

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
        for sibling in _child_dirs(cgroup_dir.parent):
            if sibling == cgroup_dir:
                continue
            theirs = CpuSet.parse(_get(sibling / "cpuset.cpus"))
            if not theirs.isdisjoint(wanted):
                return "Cpu list in cpuset.cpus not exclusive"
        return ""

    # ---- derived state -----------------------------------------------------
    def recompute(self) -> None:
        """Recompute every effective cpuset from the requested ones."""
        self._recompute(self.root, self.machine_cpus, self.machine_mems)

    def _recompute(self, cgroup_dir: Path, given_cpus: CpuSet, given_mems: CpuSet) -> None:
        if not (cgroup_dir / "cpuset.cpus.effective").is_file():
            return
        eff_cpus = _narrow(CpuSet.parse(_get(cgroup_dir / "cpuset.cpus")), given_cpus)
        eff_mems = _narrow(CpuSet.parse(_get(cgroup_dir / "cpuset.mems")), given_mems)
        kids = _child_dirs(cgroup_dir)
        carved = CpuSet()
        for kid in kids:
            if _is_partition(kid):
                carved |= _partition_cpus(kid) & eff_cpus
        _put(cgroup_dir / "cpuset.cpus.effective", (eff_cpus - carved).format())
        _put(cgroup_dir / "cpuset.mems.effective", eff_mems.format())
        for kid in kids:
            if _is_partition(kid):
                self._recompute(kid, _partition_cpus(kid) & eff_cpus, eff_mems)
            else:
                self._recompute(kid, eff_cpus - carved, eff_mems)

    def _refresh_events(self) -> None:
        for cgroup_dir in self._all_cgroups():
            populated = any(_procs(d) for d in _subtree(cgroup_dir))
            events = cgroup_dir / "cgroup.events"
            old = _get(events)
            new = f"populated {int(populated)}\nfrozen 0"
            if old != new:
                _put(events, new)

    def _all_cgroups(self) -> list[Path]:
        return _subtree(self.root)

    # ---- interface files -------------------------------------------------------
    def _write_core_files(self, cgroup_dir: Path, enabled: Iterable[str]) -> None:
        _put(cgroup_dir / "cgroup.controllers", " ".join(_ordered(enabled)))
        for name, value in (("cgroup.subtree_control", ""), ("cgroup.procs", ""),
                            ("cgroup.threads", ""), ("cgroup.type", "domain"),
                            ("cgroup.events", "populated 0\nfrozen 0"),
                            ("cgroup.freeze", "0"), ("cgroup.max.depth", "max"),
                            ("cgroup.max.descendants", "max")):
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
def _get(file: Path) -> str:
    return file.read_text().strip()


def _put(file: Path, value: str) -> None:
    file.write_text(value + "\n" if value else "")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _ordered(names: Iterable[str]) -> tuple[str, ...]:
    names = set(names)
    known = tuple(n for n in _CONTROLLER_ORDER if n in names)
    return known + tuple(sorted(names - set(known)))


def _procs(cgroup_dir: Path) -> list[int]:
    return [int(line) for line in _get(cgroup_dir / "cgroup.procs").split()]


def _can_be_thread_root(cgroup_dir: Path) -> bool:
    # The kernel's test: only threaded controllers enabled for the children
    # and no child domain holding processes.
    if set(_words(_get(cgroup_dir / "cgroup.subtree_control"))) - _THREADED:
        return False
    return not any(_procs(d) for child in _child_dirs(cgroup_dir) for d in _subtree(child))


def _child_dirs(cgroup_dir: Path) -> list[Path]:
    return sorted(p for p in cgroup_dir.iterdir() if p.is_dir())


def _subtree(cgroup_dir: Path) -> list[Path]:
    out = [cgroup_dir]
    for child in _child_dirs(cgroup_dir):
        out.extend(_subtree(child))
    return out


def _narrow(requested: CpuSet, given: CpuSet) -> CpuSet:
    # cgroup v2: an empty or disjoint request falls back to the parent's set.
    return (requested & given) or given


def _is_partition(cgroup_dir: Path) -> bool:
    # A child whose parent did not enable cpuset has no partition file.
    file = cgroup_dir / "cpuset.cpus.partition"
    return file.is_file() and _get(file) in _PARTITION_TYPES


def _partition_cpus(cgroup_dir: Path) -> CpuSet:
    exclusive = cgroup_dir / "cpuset.cpus.exclusive"
    if exclusive.is_file() and _get(exclusive):
        return CpuSet.parse(_get(exclusive))
    return CpuSet.parse(_get(cgroup_dir / "cpuset.cpus"))


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
