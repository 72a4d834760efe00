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
