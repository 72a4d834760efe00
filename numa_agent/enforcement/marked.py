"""Processes that numa-run started, found from /proc.

numa-run execs the workload's command with `NUMA_AGENT_WORKLOAD=<name>` (and
`NUMA_AGENT_CPUS`, `NUMA_AGENT_MEMS`, `NUMA_AGENT_DEVICES`, and
`NUMA_AGENT_MARK`, the agent's token for that process) in its environment; every process it forks inherits them. In the affinity fallback
nothing else of a workload outlives the agent, so when the checkpoint is lost
these marks are what the workloads can be rebuilt from
(`numa_agent.service.rebuild`).

`scan_marked` is the edge: it reads `/proc/PID/environ`, `stat` and `status`
of every process (root may read them all; another user only its own) and
returns plain values. Processes that exit during the scan are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.names import ENV_CPUS, ENV_DEVICES, ENV_EXCLUSIVE, ENV_MARK, ENV_MEMS, ENV_WORKLOAD
from numa_agent.enforcement.processes import boot_time, identity_of, started_unix, stat_fields

MARK = ENV_WORKLOAD
_ENV_KEYS = (MARK, ENV_CPUS, ENV_MEMS, ENV_DEVICES, ENV_EXCLUSIVE, ENV_MARK)


@dataclass(frozen=True)
class MarkedProcess:
    pid: int
    ppid: int
    name: str  # NUMA_AGENT_WORKLOAD
    uid: int  # effective uid (/proc/PID/status Uid), as the API's peer credentials give it
    start_time: int  # clock ticks after boot (/proc/PID/stat field 22): orders admissions
    identity: str | None  # process_identity, for the pidfd check when it is followed
    affinity: CpuSet  # Cpus_allowed_list: what sched_getaffinity(pid) returns
    env_cpus: str | None = None  # NUMA_AGENT_CPUS as numa-run set it, if present
    env_mems: str | None = None
    env_devices: str | None = None
    env_exclusive: bool | None = None  # NUMA_AGENT_EXCLUSIVE; None from a numa-run that did not set it
    mark: str | None = None  # NUMA_AGENT_MARK: the agent's token for (name, pid, start time)
    started_unix: float | None = None  # when it started, seconds since the epoch (None: not known)
    # The engine's cgroup it shares with other tasks, where the cgroup enforcer found it
    # (a task pinned inside it); None: the affinity fallback, which reads no cgroup.
    cgroup: str | None = None

    def describe(self) -> str:
        return f"pid {self.pid} ({MARK}={self.name}, CPUs {self.affinity.format() or 'none'})"


def scan_marked(proc_root: str = "/proc", exclude: tuple[int, ...] = ()) -> list[MarkedProcess]:
    """Every process under `proc_root` whose environment carries `MARK`,
    sorted by start time (oldest first), except the PIDs in `exclude`."""
    found = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    btime = boot_time(proc_root)
    for entry in entries:
        if not entry.isdigit() or int(entry) in exclude:
            continue
        process = read_marked(int(entry), proc_root, btime)
        if process is not None:
            found.append(process)
    return sorted(found, key=lambda p: (p.start_time, p.pid))


def read_marked(pid: int, proc_root: str = "/proc", btime: int | None = None) -> MarkedProcess | None:
    """`pid` as a MarkedProcess; None if it carries no mark, has exited or
    cannot be read. `btime`: the boot's (read here when not given)."""
    base = f"{proc_root}/{pid}"
    try:
        with open(f"{base}/environ", "rb") as f:
            environ = f.read()
        if f"{MARK}=".encode() not in environ:
            return None
        with open(f"{base}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        with open(f"{base}/status", "rb") as f:
            status = f.read().decode("ascii", "replace")
    except OSError:  # exited, a kernel thread, or not ours to read
        return None
    env = _environment(environ)
    name = env.get(MARK)
    fields = stat_fields(stat)
    lines = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        ppid, start_time = int(fields[1]), int(fields[19])
        uid = int(lines["Uid"].split()[1])
        affinity = CpuSet.parse(lines["Cpus_allowed_list"].strip())
    except (IndexError, KeyError, ValueError, CpuSetParseError):
        return None
    if not name:
        return None
    return MarkedProcess(pid=pid, ppid=ppid, name=name, uid=uid, start_time=start_time,
                         identity=identity_of(start_time, proc_root), affinity=affinity,
                         env_cpus=env.get(ENV_CPUS), env_mems=env.get(ENV_MEMS),
                         env_devices=env.get(ENV_DEVICES), env_exclusive=_flag(env.get(ENV_EXCLUSIVE)),
                         mark=env.get(ENV_MARK),
                         started_unix=started_unix(start_time, btime if btime is not None else boot_time(proc_root)))


def marked_pids(names: Collection[str], proc_root: str = "/proc", exclude: Collection[int] = ()) -> dict[str, list[int]]:
    """The PIDs whose `MARK` names one of `names`, by name: one pass over /proc reading
    only each process's environ. A process numa-run started passes the mark to all it
    forks, also to one that left the workload's process tree (a daemon's double fork:
    its parent exits, it is reparented to PID 1 or a subreaper), which a walk of the
    tree's children cannot find. Not a proof (anyone may set the variable): callers use
    it only to take CPUs away: towards the shared pool, or within a booking for its
    owner's own processes."""
    wanted = {f"{MARK}={name}".encode() for name in names}
    found: dict[str, list[int]] = {}
    if not wanted:
        return found
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return found
    prefix = f"{MARK}=".encode()
    for entry in entries:
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"{proc_root}/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # exited, a kernel thread, or not ours to read
            continue
        if prefix not in environ:
            continue
        item = next((i for i in environ.split(b"\0") if i in wanted), None)
        if item is not None:
            found.setdefault(item[len(prefix):].decode("utf-8", "replace"), []).append(int(entry))
    return found


def _environment(raw: bytes) -> dict[str, str]:
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        text = key.decode("ascii", "replace")
        if sep and text in _ENV_KEYS:
            out[text] = value.decode("utf-8", "replace")
    return out


def _flag(value: str | None) -> bool | None:
    return {"1": True, "0": False}.get(value.strip()) if value is not None else None


__all__ = ["MARK", "MarkedProcess", "marked_pids", "read_marked", "scan_marked"]
