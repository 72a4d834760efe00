"""The reading edge of observation: /proc and the cgroup tree, behind `TaskSource`.

`ProcReader(proc_root)` is the real one (`proc_root` is `<sysfs_root>/proc`, so
a captured tree without task directories simply shows no tasks). Every read
tolerates the task or file vanishing meanwhile: a missing answer is None.
"""

from __future__ import annotations

import os
from typing import Iterator, Protocol

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.processes import parse_cgroup
from numa_agent.observe.model import parse_allowed, parse_numa_maps, parse_numa_stat, parse_uid

WORKLOAD_ENV = b"NUMA_AGENT_WORKLOAD="  # numa-run's mark, inherited by what a workload forks


class TaskSource(Protocol):
    def stats(self) -> Iterator[tuple[int, int, str]]:
        """(pid, tid, stat line) of every task."""

    def allowed(self, pid: int, tid: int) -> CpuSet | None: ...

    def cgroup(self, pid: int) -> str | None: ...

    def marked(self, pid: int) -> str | None:
        """The workload name numa-run left in the process's environment."""

    def owner(self, pid: int) -> int | None:
        """The process's effective uid."""

    def numa_stat(self, cgroup_dir: str) -> dict[int, int] | None: ...

    def numa_maps(self, pid: int) -> dict[int, int] | None: ...


def _read(path: str, limit: int = 65536) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


class ProcReader:
    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = proc_root.rstrip("/") or "/"
        self.page_size = os.sysconf("SC_PAGE_SIZE")

    def stats(self) -> Iterator[tuple[int, int, str]]:
        root = self.root
        try:
            pids = [name for name in os.listdir(root) if name.isdigit()]
        except OSError:
            return
        for pid in pids:
            try:
                tids = os.listdir(f"{root}/{pid}/task")
            except OSError:
                continue  # gone, or no task directory in a written tree
            for tid in tids:
                raw = _read(f"{root}/{pid}/task/{tid}/stat", 4096)
                if raw:
                    yield int(pid), int(tid), raw.decode("utf-8", "replace")

    def allowed(self, pid: int, tid: int) -> CpuSet | None:
        if self.root == "/proc":
            # The system call, not status: the kernel formats all of status
            # (memory figures included) for one line of it.
            try:
                return CpuSet(os.sched_getaffinity(tid))
            except OSError:
                return None
        raw = _read(f"{self.root}/{pid}/task/{tid}/status")
        return parse_allowed(raw.decode("utf-8", "replace")) if raw else None

    def cgroup(self, pid: int) -> str | None:
        raw = _read(f"{self.root}/{pid}/cgroup")
        return parse_cgroup(raw.decode("utf-8", "replace")) if raw else None

    def marked(self, pid: int) -> str | None:
        raw = _read(f"{self.root}/{pid}/environ", 1 << 20)
        for item in (raw or b"").split(b"\0"):
            if item.startswith(WORKLOAD_ENV):
                return item[len(WORKLOAD_ENV):].decode("utf-8", "replace")
        return None

    def owner(self, pid: int) -> int | None:
        raw = _read(f"{self.root}/{pid}/status")
        return parse_uid(raw.decode("utf-8", "replace")) if raw else None

    def numa_stat(self, cgroup_dir: str) -> dict[int, int] | None:
        raw = _read(os.path.join(cgroup_dir, "memory.numa_stat"))
        return parse_numa_stat(raw.decode("ascii", "replace")) if raw is not None else None

    def numa_maps(self, pid: int) -> dict[int, int] | None:
        try:
            with open(f"{self.root}/{pid}/numa_maps", encoding="utf-8", errors="replace") as f:
                return parse_numa_maps(f.read(), self.page_size)
        except OSError:
            return None
