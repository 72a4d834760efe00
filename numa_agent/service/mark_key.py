"""The per-boot key that signs workload marks (numa_agent.core.mark).

It lives in the runtime directory (tmpfs: a reboot clears it, and no workload
survives a reboot either), mode 0600. Made atomically so that two agents
starting at once end with the same key: written to a private temporary file,
then linked into place, which fails if another agent got there first.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from numa_agent.core.mark import KEY_BYTES

log = logging.getLogger("numa_agent.service")

KEY_NAME = "mark.key"


class MarkKeyError(Exception):
    pass


def load_or_create_key(path: Path) -> bytes:
    """The key at `path`; a new one if it is missing, or damaged (then the
    marks made with the old one no longer verify)."""
    for _ in range(3):
        found, key = _read(path)
        if key is not None:
            return key
        if found:  # decided on what was read, not on a second look another agent may race
            log.warning("mark key %s is damaged; replacing it (marks issued with it no longer verify)", path)
            _replace(path)
        elif _create(path):
            log.info("mark key %s created", path)
        # else another agent made it first: read theirs
    found, key = _read(path)
    if key is None:
        raise MarkKeyError(f"cannot make a usable mark key at {path}")
    return key


def _read(path: Path) -> tuple[bool, bytes | None]:
    """(whether something is at `path`, the key if it is a usable one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False, None
    except OSError as exc:
        if not path.is_symlink():
            raise MarkKeyError(f"cannot read the mark key {path}: {exc}") from None
        return True, None  # a symlink is not ours: damaged
    try:
        st = os.fstat(fd)
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    # Readable by others, or not the right size: not a key to trust.
    if len(data) != KEY_BYTES or st.st_mode & 0o077 or st.st_uid != os.geteuid():
        return True, None
    return True, data


def _temporary(path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _create(path: Path) -> bool:
    """Link a new key into place; False if one appeared meanwhile."""
    tmp = _temporary(path)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _replace(path: Path) -> None:
    tmp = _temporary(path)
    os.replace(tmp, path)


__all__ = ["KEY_NAME", "MarkKeyError", "load_or_create_key"]
