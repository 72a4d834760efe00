"""Facts about processes that the enforcement edge needs."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterable

# Linux capabilities by bit number (include/uapi/linux/capability.h).
CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)
# What the affinity fallback needs to act on other users' processes: pin them, and read
# their /proc/PID/environ (mode 0400, behind the ptrace access check) to rebuild
# workloads after a restart.
AFFINITY_CAPABILITIES = ("CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE", "CAP_SYS_NICE")


def parse_cgroup(text: str) -> str | None:
    """The cgroup v2 path ("0::/a/b") of /proc/PID/cgroup's text; None without one."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def process_alive(pid: int) -> bool:
    """True while `pid` names a process (even one we may not signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pidfd_alive(pidfd: int) -> bool:
    """True until the process behind `pidfd` has exited. Signal 0 only checks;
    EPERM (another user's process, and no CAP_KILL, which the unit does not
    grant) still means the process exists."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exited_among(pidfds: Iterable[int]) -> set[int]:
    """The pidfds among `pidfds` whose processes have exited (a pidfd is readable
    from then on, zombie or not): one poll for one process or many."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, events in poller.poll(0) if events & select.POLLIN}


def pidfd_exited(pidfd: int) -> bool:
    return bool(exited_among((pidfd,)))


def capability_set(status: str, field: str = "CapEff") -> frozenset[str] | None:
    """The capabilities named by one mask line (CapEff, CapBnd, ...) of a
    /proc/PID/status text; None when the line is absent. A bit newer than
    CAPABILITIES is named by its number (cap_41)."""
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            mask = int(value.strip(), 16)
            return frozenset(CAPABILITIES[bit] if bit < len(CAPABILITIES) else f"cap_{bit}"
                             for bit in range(mask.bit_length()) if mask >> bit & 1)
    return None


def missing_capabilities(status: str, wanted: Iterable[str]) -> list[str]:
    """The capabilities of `wanted` not in the effective set of a /proc/PID/status
    text (all of them when it has no CapEff line)."""
    have = capability_set(status) or frozenset()
    return [name for name in wanted if name not in have]


def process_identity(pid: int, proc_root: str = "/proc") -> str | None:
    """Who `pid` is, in a form that a recycled PID cannot repeat: the boot's
    id and the process's start time (clock ticks since boot, field 22 of
    /proc/PID/stat). None if there is no such process."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat_fields(stat)
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return identity_of(int(fields[19]), proc_root)


def stat_fields(stat: str) -> list[str]:
    """/proc/PID/stat's fields from the third on (state, ppid, ...; the start
    time is index 19). The command name (field 2) is in parentheses and may
    hold spaces or ')', so the split starts after the last ')'."""
    return stat[stat.rfind(")") + 2:].split()


def boot_id(proc_root: str = "/proc") -> str | None:
    """This boot's id (a new one at every boot), or None if it cannot be read."""
    try:
        with open(f"{proc_root}/sys/kernel/random/boot_id", "rb") as f:
            return f.read().decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None


def boot_time(proc_root: str = "/proc") -> int | None:
    """When this boot began, in seconds since the epoch (the `btime` line of
    /proc/stat); None if it cannot be read."""
    try:
        with open(f"{proc_root}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isdigit():
            return int(value)
    return None


def started_unix(start_time: int, btime: int | None) -> float | None:
    """A process's start in seconds since the epoch, from its start time
    (clock ticks after boot, /proc/PID/stat field 22) and the boot's btime."""
    if btime is None:
        return None
    return btime + start_time / os.sysconf("SC_CLK_TCK")


def identity_of(start_time: int, proc_root: str = "/proc") -> str | None:
    """process_identity for a process whose start time is known; None if the
    boot id cannot be read."""
    boot = boot_id(proc_root)
    return None if boot is None else f"{boot}:{start_time}"
