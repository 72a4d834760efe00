"""Process helpers for the tests' clean-up."""

from __future__ import annotations

import os
import signal
from typing import Iterable


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each of `pids`; one already gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
