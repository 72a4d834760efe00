"""A running irqbalance told which CPUs to keep interrupts off (its banned set).

irqbalance 1.8+ (Debian 12 ships 1.9.2) listens on a unix stream socket
`/run/irqbalance/irqbalance<PID>.sock` (the directory is systemd's
RuntimeDirectory; without it 1.9.2 binds an anonymous abstract address no
client can name). One request per connection, answered only when the
message carries SCM_CREDENTIALS of uid 0 (else closed unanswered):

- `setup` -> `SLEEP <s> [IRQ ...] BANNED <hex mask>`: the banned set in use;
- `settings cpus <cpulist>` / `settings cpus NULL` -> no answer: the list
  *replaces* the set from IRQBALANCE_BANNED_CPULIST/_CPUS (or isolcpus and
  nohz_full) until NULL returns to that one. It takes effect at the next
  rescan (one interval, `-t`, 10 s by default) and lives in the daemon's
  memory only: a restarted irqbalance (a new pid) has forgotten it.

So the set told is remembered with the pid told: until that pid exits it is
what the daemon holds (its `setup` lags by one interval), and a new pid is
asked again (`lost`).
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
from pathlib import Path

from numa_agent.core.cpuset import CpuSet, CpuSetParseError

RUN_DIR = "/run/irqbalance"
_BANNED = re.compile(rb"BANNED\s+([0-9a-fA-F,]+)")


class IrqbalanceError(OSError):
    """irqbalance runs but cannot be asked (no socket, not root): its message says which."""


class IrqbalanceSocket:
    def __init__(self, proc: str | os.PathLike = "/proc", run_dir: str | os.PathLike = RUN_DIR,
                 timeout: float = 2.0) -> None:
        self.proc, self.run_dir, self.timeout = Path(proc), Path(run_dir), timeout
        self.told: tuple[int, str] | None = None  # (pid, cpu list) last sent
        self._found: int | None = None  # the pid pid() last found

    def pid(self) -> int | None:
        """The pid of the running irqbalance (one runs per machine): the one
        found last while it is still that, else the lowest pid whose comm is
        irqbalance and that runs as root. One plan asks several times (its knobs, read, write):
        /proc is listed again only when that daemon is gone."""
        if self._found is not None and self._is_irqbalance(self._found):
            return self._found
        try:
            entries = sorted((int(e.name) for e in self.proc.iterdir() if e.name.isdigit()))
        except OSError:
            entries = []
        self._found = next((p for p in entries if self._is_irqbalance(p)), None)
        return self._found

    def _is_irqbalance(self, pid: int) -> bool:
        """Named irqbalance and root's: anyone can run a program of that name."""
        try:
            return ((self.proc / str(pid) / "comm").read_text().strip() == "irqbalance"
                    and _real_uid((self.proc / str(pid) / "status").read_text()) == 0)
        except OSError:
            return False

    def lost(self) -> bool:
        """The irqbalance told a set has exited (restarted: it no longer holds it)."""
        return self.told is not None and not self._is_irqbalance(self.told[0])

    def read(self) -> str:
        """The banned CPUs as a list ("" for none); ENOENT when no irqbalance runs."""
        pid = self._running()
        if self.told is not None and self.told[0] == pid:
            return self.told[1]
        return _banned(self._ask(pid, "setup"))

    def write(self, value: str) -> None:
        """Ban the CPUs of list `value`; "" returns irqbalance to its own set."""
        pid = self._running()
        _banned(self._ask(pid, "setup"))  # a refusal is silent for settings: ask first
        cpus = CpuSet.parse(value)
        self._ask(pid, f"settings cpus {cpus.format() if cpus else 'NULL'}")
        self.told = (pid, cpus.format())

    def _running(self) -> int:
        pid = self.pid()
        if pid is None:
            self.told = None
            raise OSError(errno.ENOENT, "irqbalance is not running")
        return pid

    def _ask(self, pid: int, command: str) -> bytes:
        path = self.run_dir / f"irqbalance{pid}.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
            s.settimeout(self.timeout)
            try:
                s.connect(str(path))
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise IrqbalanceError(errno.ECONNREFUSED, f"irqbalance (pid {pid}) has no socket at {path}: "
                                                  f"{exc.strerror}") from None
            creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
            s.sendmsg([command.encode()], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            return reply


def _real_uid(status: str) -> int | None:
    """The real uid in /proc/PID/status text (its `Uid:` line), or None."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _banned(reply: bytes) -> str:
    m = _BANNED.search(reply)
    if not m:
        # It closes without a word when the credentials are not root's.
        raise IrqbalanceError(errno.EPERM, "irqbalance did not answer (it answers root only)" if not reply
                      else f"irqbalance answered {reply[:80]!r}, no BANNED set")
    try:
        return CpuSet.parse_mask(m.group(1).decode()).format()
    except CpuSetParseError as exc:
        raise IrqbalanceError(errno.EPROTO, f"irqbalance's banned mask {m.group(1)!r}: {exc}") from None
