"""Pure rules of observation: parsing what /proc and the cgroup tree say, and
judging it. No file is opened here (see procfs.py for the reading edge).

An intruder is a task outside a workload that is allowed on, and last ran on
(field 39 of /proc/PID/task/TID/stat), one of that workload's exclusive CPUs.
Per-CPU kernel threads bound to exactly that CPU (ksoftirqd/N, kworker/N:M,
migration/N, cpuhp/N) are left out: they are part of the CPU, nobody can move
them. Other kernel threads found there (unbound kworkers, kswapd) are flagged
`kernel` and reported apart from the intruders: nearly every machine has some,
and counted with the user tasks they would keep the intruder gauge from ever
reading 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.enforcement.processes import stat_fields

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread

# Indexes into stat_fields() (which starts at field 3, the state).
_PPID, _FLAGS, _START_TIME, _PROCESSOR = 4 - 3, 9 - 3, 22 - 3, 39 - 3


class TaskStat(NamedTuple):
    """What one /proc/PID/task/TID/stat says that the intruder rule needs."""

    pid: int
    tid: int
    comm: str
    flags: int
    start_time: int  # clock ticks since boot: with pid and tid, names one task for good
    cpu: int  # the CPU it last ran on

    @property
    def kernel(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def parse_stat(pid: int, tid: int, text: str) -> TaskStat | None:
    """A task's stat line, or None when it is cut short (a task exiting)."""
    fields = stat_fields(text)
    if len(fields) <= _PROCESSOR:
        return None
    try:
        return TaskStat(pid, tid, text[text.find("(") + 1:text.rfind(")")], int(fields[_FLAGS]),
                        int(fields[_START_TIME]), int(fields[_PROCESSOR]))
    except ValueError:
        return None


def last_cpu(text: str) -> int | None:
    """Field 39 alone: the scan's first cut, before anything else is parsed."""
    fields = stat_fields(text)
    if len(fields) <= _PROCESSOR:
        return None
    value = fields[_PROCESSOR]
    return int(value) if value.isdigit() else None


def parse_allowed(status_text: str) -> CpuSet | None:
    """Cpus_allowed_list of /proc/PID/task/TID/status."""
    at = status_text.find("Cpus_allowed_list:")
    if at < 0:
        return None
    end = status_text.find("\n", at)
    try:
        return CpuSet.parse(status_text[at + len("Cpus_allowed_list:"):end if end >= 0 else None].strip())
    except CpuSetParseError:
        return None


def parse_uid(status_text: str) -> int | None:
    """The effective uid (the second of the Uid line) of /proc/PID/status."""
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            ids = line[4:].split()
            return int(ids[1]) if len(ids) > 1 and ids[1].isdigit() else None
    return None


@dataclass(frozen=True)
class Guarded:
    """One workload holding exclusive CPUs, and how its own tasks are known:
    by cgroup (the cgroup v2 path as /proc/PID/cgroup shows it) or, without
    one, by its tracked process (and that process's threads)."""

    name: str
    cpus: CpuSet
    cgroup: str | None = None
    pid: int | None = None
    owner_uid: int | None = None  # whose the workload is (None: not known)

    def holds(self, pid: int, cgroup: str | None, marked: str | None, uid: int | None = None) -> bool:
        """Is a task of process `pid` (in `cgroup`, its environment naming
        workload `marked`, running as `uid`) this workload's own?"""
        if self.cgroup is not None:
            return cgroup is not None and (cgroup == self.cgroup or cgroup.startswith(self.cgroup + "/"))
        # Affinity mode: the tracked process and what it forked (numa-run's
        # environment mark is inherited). Anyone can put the mark in their own
        # environment, so it counts only for the workload's owner (or root):
        # another user cannot hide a process on these CPUs behind it.
        if pid == self.pid:
            return True
        return marked == self.name and (self.owner_uid is None or uid in (self.owner_uid, 0))


def cpu_owners(guarded: Iterable[Guarded]) -> dict[int, Guarded]:
    """Exclusive CPU -> the workload holding it."""
    return {cpu: g for g in guarded for cpu in g.cpus.ids()}


class Intruder(NamedTuple):
    workload: str
    pid: int
    tid: int
    command: str
    cpu: int
    start_time: int
    kernel: bool

    @property
    def key(self) -> tuple[int, int, int]:
        """A reused pid is a new intruder: the start time tells them apart."""
        return (self.pid, self.tid, self.start_time)

    def to_json(self) -> dict:
        return {"pid": self.pid, "tid": self.tid, "command": self.command, "cpu": self.cpu}


def judge(task: TaskStat, allowed: CpuSet | None, owner: Guarded) -> Intruder | None:
    """A task outside `owner` last ran on one of its exclusive CPUs: is it
    an intruder (allowed there, and not a per-CPU kernel thread)?"""
    if allowed is None or task.cpu not in allowed:
        return None
    if task.kernel and allowed == CpuSet([task.cpu]):
        return None  # a per-CPU kernel thread: part of the CPU
    return Intruder(owner.name, task.pid, task.tid, task.comm, task.cpu, task.start_time, task.kernel)


def by_workload(intruders: Iterable[Intruder]) -> dict[str, tuple[Intruder, ...]]:
    out: dict[str, list[Intruder]] = {}
    for i in intruders:
        out.setdefault(i.workload, []).append(i)
    return {name: tuple(sorted(found, key=lambda i: (i.pid, i.tid))) for name, found in out.items()}


# ---- memory locality -------------------------------------------------------------
NUMA_STAT_KINDS = ("anon", "file")  # what memory.numa_stat adds up to the workload's memory


def parse_numa_stat(text: str) -> dict[int, int]:
    """Bytes per NUMA node (anon + file) from a cgroup's memory.numa_stat
    ("anon N0=123 N1=0" lines)."""
    per_node: dict[int, int] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        if kind not in NUMA_STAT_KINDS:
            continue
        for node, amount in _node_pairs(pairs):
            per_node[node] = per_node.get(node, 0) + amount
    return per_node


def parse_numa_maps(text: str, page_size: int) -> dict[int, int]:
    """Bytes per NUMA node from /proc/PID/numa_maps: each mapping's "N0=pages"
    times its page size (kernelpagesize_kB when given, else `page_size`)."""
    per_node: dict[int, int] = {}
    for line in text.splitlines():
        words = line.split()
        size = page_size
        for word in words:
            if word.startswith("kernelpagesize_kB="):
                try:
                    size = int(word.split("=", 1)[1]) << 10
                except ValueError:
                    pass
        for node, pages in _node_pairs(words[2:]):
            per_node[node] = per_node.get(node, 0) + pages * size
    return per_node


def _node_pairs(words: Iterable[str]) -> Iterable[tuple[int, int]]:
    for word in words:
        key, sep, value = word.partition("=")
        if sep and key[:1] == "N" and key[1:].isdigit() and value.isdigit():
            yield int(key[1:]), int(value)


def locality(per_node: Mapping[int, int], booked_nodes: Iterable[int], source: str) -> dict:
    """Memory per node and what lies outside the booked nodes (None for a
    workload that booked no node: nothing is outside what it never had)."""
    booked = set(booked_nodes)
    total = sum(per_node.values())
    outside = sum(v for node, v in per_node.items() if node not in booked) if booked else None
    return {"source": source, "bytes": {str(n): v for n, v in sorted(per_node.items())},
            "total_bytes": total, "outside_bytes": outside,
            "outside_ratio": (round(outside / total, 6) if total else 0.0) if outside is not None else None}
