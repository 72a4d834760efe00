"""What a guest asks of QEMU itself, through the job share: plug a DIMM into a
NUMA node (memory hotplug) and the like, which nothing inside the guest can do.

Shapes with hotplug memory boot with a QMP socket in the job folder. The guest
writes a JSON list of QMP commands to `monitor-request` (written aside and
renamed, so the host never reads half of it); the host's boot loop runs them
in order and answers in `monitor-reply` the same way, one `{"return": ...}` or
`{"error": ...}` per command, then removes the request. One request at a time.

Standard library only: the host runs it without the project's virtualenv, and
the guest imports `ask` from here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

REQUEST, REPLY, SOCKET = "monitor-request", "monitor-reply", "qmp.sock"
QMP_TIMEOUT = 60.0  # a device_add under emulation answers within a second or two


class MonitorError(RuntimeError):
    """QEMU's monitor could not be reached or did not answer."""


def _write_aside(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def qmp_run(sock_path: str | os.PathLike, commands: list[dict], timeout: float = QMP_TIMEOUT) -> list[dict]:
    """Run QMP commands in order; each reply is {"return": ...} or {"error": ...}.
    Events QEMU sends meanwhile (ACPI_DEVICE_OST after a device_add) are skipped."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(os.fspath(sock_path))
        except OSError as exc:
            raise MonitorError(f"cannot connect to QEMU's monitor at {sock_path}: {exc}") from None
        lines = s.makefile("r", encoding="utf-8")

        def answer() -> dict:
            while True:
                line = lines.readline()
                if not line:
                    raise MonitorError("QEMU's monitor closed the connection")
                message = json.loads(line)
                if "return" in message or "error" in message:
                    return message

        if "QMP" not in json.loads(lines.readline() or "{}"):
            raise MonitorError("QEMU's monitor sent no greeting")
        replies = []
        for command in [{"execute": "qmp_capabilities"}, *commands]:
            s.sendall((json.dumps(command) + "\n").encode())
            replies.append(answer())
        return replies[1:]


def serve_request(job_dir: Path) -> bool:
    """Answer the guest's pending request, if any (called from the boot loop)."""
    request = job_dir / REQUEST
    try:
        commands = json.loads(request.read_text())
    except FileNotFoundError:
        return False
    except ValueError as exc:
        commands, replies = [], [{"error": {"class": "HarnessError", "desc": f"bad request: {exc}"}}]
    else:
        try:
            replies = qmp_run(job_dir / SOCKET, commands)
        except (MonitorError, OSError, ValueError) as exc:
            replies = [{"error": {"class": "HarnessError", "desc": str(exc)}}]
    request.unlink(missing_ok=True)
    _write_aside(job_dir / REPLY, replies)
    return True


def ask(job_dir: str | os.PathLike, commands: list[dict], timeout: float = QMP_TIMEOUT + 30) -> list[dict]:
    """The guest's side: hand `commands` to the host and wait for the replies."""
    job_dir = Path(job_dir)
    (job_dir / REPLY).unlink(missing_ok=True)
    _write_aside(job_dir / REQUEST, commands)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            replies = json.loads((job_dir / REPLY).read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.2)
            continue
        (job_dir / REPLY).unlink(missing_ok=True)
        return replies
    raise MonitorError(f"the host did not answer the monitor request within {timeout:g} s "
                       "(does this shape boot with hotplug memory?)")
