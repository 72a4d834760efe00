"""A copy of the state's revocations (service/revocations.py) beside the
mark key, so that a release survives the loss of the whole checkpoint.

The checkpoint holds the revocations; but a checkpoint lost entirely (both
generations and the journal) would take them along, and in the affinity
fallback start-up then rebuilds every marked process it finds, a released
one included. The runtime directory that holds the mark key is the natural
second home: it lives as long as the marks it could be confused by (a reboot
clears both), and it is not the state directory, whose loss is the case to
survive. Written whole, durably, each time the revocations change (a release
of a running workload, or a prune), through the directory checked and held
at start; read once at start and merged into what the checkpoint holds.
A damaged or unreadable copy is logged and ignored: the checkpoint is still
the record.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from numa_agent.state.model import Revocation
from numa_agent.state.trusted_dir import TrustedDir, UntrustedDirectory, open_directory

log = logging.getLogger("numa_agent.service")

COPY_NAME = "revoked.json"
_MODE = 0o600


class RevocationCopy:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._held: TrustedDir | None = None

    def _dir(self) -> TrustedDir:
        if self._held is None or self._held.removed():
            if self._held is not None:
                self._held.close()
            self._held = open_directory(self.directory, "runtime directory", create_mode=0o755)
        return self._held

    def load(self) -> tuple[Revocation, ...]:
        """The revocations copied last; none when there is no usable copy."""
        try:
            raw = self._dir().read_bytes(COPY_NAME)
        except FileNotFoundError:
            return ()
        except (OSError, UntrustedDirectory) as exc:
            log.warning("cannot read the copy of the revocations %s: %s; the checkpoint's are used",
                        self.directory / COPY_NAME, exc)
            return ()
        try:
            return msgspec.json.decode(raw, type=tuple[Revocation, ...])
        except (msgspec.DecodeError, RecursionError) as exc:
            log.warning("the copy of the revocations %s is damaged (%s); the checkpoint's are used",
                        self.directory / COPY_NAME, exc)
            return ()

    def save(self, revoked: tuple[Revocation, ...]) -> None:
        """Replace the copy with `revoked`; a failure is logged, never raised
        (the checkpoint, written first, holds them)."""
        try:
            held = self._dir()
            if not revoked:
                held.unlink(COPY_NAME, missing_ok=True)
                return
            held.replace_file(COPY_NAME, msgspec.json.encode(revoked), _MODE, durable=True)
        except (OSError, UntrustedDirectory) as exc:
            log.error("cannot write the copy of the revocations in %s: %s; a release stays recorded "
                      "in the checkpoint only", self.directory, exc)

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None


def merged(kept: tuple[Revocation, ...], copied: tuple[Revocation, ...]) -> tuple[Revocation, ...]:
    """The checkpoint's revocations with those only the copy has (one per booking)."""
    known = {(r.name, r.pid, r.created_unix) for r in kept}
    return kept + tuple(r for r in copied if (r.name, r.pid, r.created_unix) not in known)


__all__ = ["COPY_NAME", "RevocationCopy", "merged"]
