"""Writing the kubelet-shaped state files (numa_agent.kubelet.state_files).

Each file is replaced whole: written to a private temporary name in the same
directory, then renamed over the old one, so a reader sees the previous
document or the next, never a part. No fsync: the files are a view of the
checkpoint, not a record; the agent writes them again from the state it
restores at every start.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from numa_agent.admission.machine import Machine
from numa_agent.kubelet.state_files import CPU_MANAGER_STATE, MEMORY_MANAGER_STATE, StateDocuments
from numa_agent.state.model import AgentState

log = logging.getLogger("numa_agent.kubelet")

FILE_MODE = 0o644  # read by node tools, as the kubelet's are; they hold no secret


class StateFilesError(Exception):
    pass


class StateFiles:
    """The two files in `directory`; `publish` after every change of state."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._documents = StateDocuments()
        self._lock = threading.Lock()
        self._failing: str | None = None
        self.last: dict[str, bytes] = {}

    def check(self) -> None:
        """At start: the directory exists (made 0755 if missing) and takes files."""
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            probe = self.directory / f".{CPU_MANAGER_STATE}.{os.getpid()}.probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StateFilesError(f"cannot write the kubelet state files in {self.directory}: "
                                  f"{exc.strerror or exc}") from None

    def publish(self, machine: Machine, state: AgentState) -> None:
        """Write both documents for `state`, each only if it changed. A
        failure is logged (once until writes work again) and never fails the
        change that caused it: the checkpoint, not these files, is the
        agent's record."""
        with self._lock:
            cpu, memory = self._documents.update(machine, state)
            written, self.last = self.last, {CPU_MANAGER_STATE: cpu, MEMORY_MANAGER_STATE: memory}
            try:
                for name, data in self.last.items():
                    # A change that leaves a document as it was (a shared workload
                    # without memory leaves both) writes nothing: the file holds it.
                    if self._failing is not None or written.get(name) != data:
                        self._replace(name, data)
            except OSError as exc:
                if self._failing is None:
                    log.error("cannot write the kubelet state files in %s: %s; retried with the next "
                              "change", self.directory, exc)
                self._failing = str(exc)
                return
            if self._failing is not None:
                log.warning("kubelet state files in %s written again", self.directory)
                self._failing = None

    def _replace(self, name: str, data: bytes) -> None:
        tmp = self.directory / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, FILE_MODE)  # whatever the umask
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / name)
