"""A real process that gets its NUMA_AGENT_MARK after admission, as with
numa-run: admitted under its pid, then it execs its command (same pid, same
start time) with the mark the agent answered in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

_EXEC_WITH_MARK = ("import os,sys\n"
                   "mark = sys.stdin.readline().strip()\n"
                   "if mark: os.environ['NUMA_AGENT_MARK'] = mark\n"
                   "os.execvp(sys.argv[1], sys.argv[1:])\n")


def spawn_awaiting_mark(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`argv` not yet exec'd: its pid waits for `give_mark`."""
    return subprocess.Popen([sys.executable, "-c", _EXEC_WITH_MARK, *argv], stdin=subprocess.PIPE,
                            env={**os.environ, **env}, text=True)


def give_mark(proc: subprocess.Popen, mark: str | None, timeout: float = 10.0) -> None:
    """Hand `proc` its mark and wait until it exec'd its command with it."""
    assert proc.stdin is not None
    proc.stdin.write((mark or "") + "\n")
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                environ = f.read()
        except FileNotFoundError:
            return
        # No longer the wrapper (whose script names the variable), and not mid-exec (empty).
        if cmdline and b"NUMA_AGENT_MARK" not in cmdline and (not mark or b"NUMA_AGENT_MARK=" in environ):
            return
        time.sleep(0.02)
    raise TimeoutError(f"pid {proc.pid} did not exec its command")
