"""A stand-in irqbalance: a /proc entry named irqbalance and its unix socket,
speaking irqbalance 1.9's protocol (one request per connection; answered only
with SCM_CREDENTIALS of the allowed uid, else closed unanswered; `setup` ->
`SLEEP 10 BANNED <hex mask>`; `settings cpus <list>|NULL` replaces the set
from its environment or returns to it)."""

from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

from numa_agent.core.cpuset import CpuSet

_CREDS = struct.calcsize("3i")


class FakeIrqbalance:
    def __init__(self, proc: Path, run: Path, pid: int, env_banned: str = "",
                 allowed_uid: int | None = None) -> None:
        self.proc, self.run, self.pid = proc, run, pid
        self.env_banned = CpuSet.parse(env_banned)
        self.from_ui: CpuSet | None = None
        self.allowed_uid = allowed_uid if allowed_uid is not None else os.getuid()
        self.requests: list[str] = []
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "comm").write_text("irqbalance\n")
        (proc / str(pid) / "status").write_text("Name:\tirqbalance\nUid:\t0\t0\t0\t0\n")  # root's, as the daemon
        run.mkdir(parents=True, exist_ok=True)
        self.path = run / f"irqbalance{pid}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def banned(self) -> CpuSet:
        return self.from_ui if self.from_ui is not None else self.env_banned

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                msg, anc, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(_CREDS))
                uid = next((struct.unpack("3i", data[:_CREDS])[1] for level, kind, data in anc
                            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), None)
                if uid != self.allowed_uid:
                    continue  # as irqbalance: "Permission denied for user", closed unanswered
                text = msg.decode()
                self.requests.append(text)
                if text.startswith("settings cpus "):
                    arg = text[len("settings cpus "):].split(" ")[0]
                    self.from_ui = None if arg.startswith("NULL") else CpuSet.parse(arg)
                elif text.startswith("setup"):
                    conn.sendall(f"SLEEP 10 BANNED {self.banned.format_mask()}".encode())

    def stop(self, remove_comm: bool = True) -> None:
        """Exit: the socket closed and removed, the /proc entry gone."""
        self.sock.close()
        self.thread.join(2)
        self.path.unlink(missing_ok=True)
        if remove_comm:
            (self.proc / str(self.pid) / "comm").unlink()
            (self.proc / str(self.pid) / "status").unlink()
            (self.proc / str(self.pid)).rmdir()
