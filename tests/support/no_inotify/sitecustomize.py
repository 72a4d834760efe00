"""Run by Python at start-up in the processes of a test run with
NUMA_AGENT_TESTS_NO_INOTIFY set (tests/support/inotify_exhausted.py)."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[3]))  # the repository, for tests.support

from numa_agent.enforcement import libc  # noqa: E402
from tests.support.inotify_exhausted import exhausted_libc  # noqa: E402

libc._handle = exhausted_libc()  # type: ignore[assignment]
