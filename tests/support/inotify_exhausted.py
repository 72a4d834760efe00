"""A machine whose inotify instances ran out, for the agents a test run starts.

`NUMA_AGENT_TESTS_NO_INOTIFY=1 scripts/test tests/...` runs the tests with
every `inotify_init1` failing with EMFILE, as when another program took
the user's fs.inotify.max_user_instances: in the test process (an autouse
fixture, tests/conftest.py) and in every Python process it starts (the
`sitecustomize` of no_inotify/, put on PYTHONPATH). The agents must fall
back to polling and pass all the same. Only tests use this; the agent has
no such option.
"""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path

ENV = "NUMA_AGENT_TESTS_NO_INOTIFY"
SITE_DIR = Path(__file__).resolve().parent / "no_inotify"


class InotifyExhausted:
    """The C library, but inotify_init1 fails as when the instances ran out."""

    def __init__(self, real: ctypes.CDLL) -> None:
        self._real = real

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def inotify_init1(self, flags: int) -> int:
        ctypes.set_errno(errno.EMFILE)
        return -1


def exhausted_libc() -> InotifyExhausted:
    from numa_agent.enforcement import libc

    real = libc.libc()
    return real if isinstance(real, InotifyExhausted) else InotifyExhausted(real)
