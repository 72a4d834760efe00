"""Writing the kubelet-shaped state files (numa_agent.kubelet.state_files).

Each file is replaced whole: written to a new, unpredictably named temporary
file in the same directory, then renamed over the old one, so a reader sees
the previous document or the next, never a part. The directory is checked and
held open at start (state/trusted_dir.py): a root agent writing in a
directory another user can change could be made to overwrite any file. No fsync: the files are a view of the
checkpoint, not a record; the agent writes them again from the state it
restores at every start.

The documents are built on the admission path (they cost the change), the
files are written by a thread of their own: a rename over an existing file
can wait for the filesystem's journal for milliseconds, and an admission
must not. A document changed again before its file was written is written
once, in its latest form; `last` always holds the latest, so the API shows
it at once.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import msgspec

from numa_agent.admission.machine import Machine
from numa_agent.kubelet.state_files import CPU_MANAGER_STATE, MEMORY_MANAGER_STATE, StateDocuments, documents
from numa_agent.state.model import AgentState
from numa_agent.state.trusted_dir import TrustedDir, UntrustedDirectory, open_directory

log = logging.getLogger("numa_agent.kubelet")

FILE_MODE = 0o644  # read by node tools, as the kubelet's are; they hold no secret


class StateFilesError(Exception):
    pass


class StateFilesUntrusted(StateFilesError):
    """The directory could be changed by someone but root or the agent's user."""


class StateFiles:
    """The two files in `directory`; `publish` after every change of state."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._held: TrustedDir | None = None
        self._documents = StateDocuments()
        self._cond = threading.Condition()
        self._pending: dict[str, bytes] = {}  # file name -> the document it is to hold next
        self._busy = False  # the writer holds documents taken from _pending
        self._failing: str | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last: dict[str, bytes] = {}

    def check(self) -> None:
        """At start: the directory exists (made 0755 if missing), nobody but
        root or the agent's user can change it, and it takes files."""
        try:
            held = open_directory(self.directory, "kubelet state directory", create_mode=0o755)
        except UntrustedDirectory as exc:
            raise StateFilesUntrusted(str(exc)) from None
        except OSError as exc:
            raise StateFilesError(f"cannot write the kubelet state files in {self.directory}: "
                                  f"{exc.strerror or exc}") from None
        try:
            fd, probe = held.create_temporary(CPU_MANAGER_STATE, FILE_MODE)
            os.close(fd)
            held.unlink(probe)
        except OSError as exc:
            held.close()
            raise StateFilesError(f"cannot write the kubelet state files in {self.directory}: "
                                  f"{exc.strerror or exc}") from None
        self._held = held

    def publish(self, machine: Machine, state: AgentState) -> None:
        """The documents for `state`; each that changed is handed to the
        writer. A failed write is logged (once until writes work again),
        never fails the change that caused it (the checkpoint, not these
        files, is the agent's record) and is made good by the next change."""
        cpu, memory = self._documents.update(machine, state)
        latest = {CPU_MANAGER_STATE: cpu, MEMORY_MANAGER_STATE: memory}
        with self._cond:
            # A change that leaves a document as it was (a shared workload
            # without memory leaves both) writes nothing: the file holds it.
            changed = {name: data for name, data in latest.items()
                       if self._failing is not None or self.last.get(name) != data}
            self.last = latest
            if not changed:
                return
            self._pending.update(changed)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_loop, name="numa-agent-kubelet-files",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every document handed over is written (or failed)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        """Write what is pending, then end the writer."""
        self.flush()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5)
        if self._held is not None:
            self._held.close()

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping)
                if not self._pending:
                    return
                batch, self._pending, self._busy = self._pending, {}, True
            failure = None
            try:
                for name, data in batch.items():
                    self._replace(name, data)
            except OSError as exc:
                failure = str(exc)
            with self._cond:
                self._busy = False
                self._note(failure)
                self._cond.notify_all()

    def _note(self, failure: str | None) -> None:
        if failure is not None and self._failing is None:
            log.error("cannot write the kubelet state files in %s: %s; retried with the next change",
                      self.directory, failure)
        elif failure is None and self._failing is not None:
            log.warning("kubelet state files in %s written again", self.directory)
        self._failing = failure

    def _replace(self, name: str, data: bytes) -> None:
        if self._held is None or self._held.removed():
            # Removed under the agent: written again once someone makes it
            # again, and only if it passes the same check as at start.
            if self._held is not None:
                self._held.close()
                self._held = None
            try:
                self._held = open_directory(self.directory, "kubelet state directory")
            except UntrustedDirectory as exc:
                raise OSError(str(exc)) from None
        self._held.replace_file(name, data, FILE_MODE)


def served_documents(files: StateFiles | None, machine: Machine, state: AgentState) -> dict:
    """`GET /v1/kubelet`: both documents as last written, or (files off, or none
    written yet) as they are for `state`, with the directory they are written in."""
    last = dict(files.last) if files is not None else {}
    if not last:
        cpu, memory = documents(machine, state)
        last = {CPU_MANAGER_STATE: cpu, MEMORY_MANAGER_STATE: memory}
    return {"directory": str(files.directory) if files is not None else None,
            **{name: msgspec.json.decode(data) for name, data in last.items()}}
