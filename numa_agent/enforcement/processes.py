"""Facts about processes that the enforcement edge needs."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True while `pid` names a process (even one we may not signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def identity_of(start_time: int, proc_root: str = "/proc") -> str | None:
    """process_identity for a process whose start time is known; None if the
    boot id cannot be read."""
    try:
        with open(f"{proc_root}/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None
    return f"{boot}:{start_time}"
