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
        with open(f"{proc_root}/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().decode("ascii", "replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return f"{boot}:{fields[19]}"
