"""The per-boot key that signs workload marks (numa_agent.core.mark).

It lives in the runtime directory (tmpfs: a reboot clears it, and no workload
survives a reboot either), mode 0600. Made atomically so that two agents
starting at once end with the same key: written to a new temporary file
(an unpredictable name, O_EXCL), then linked into place, which fails if
another agent got there first.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import NamedTuple

from numa_agent.core.mark import KEY_BYTES
from numa_agent.state.trusted_dir import TrustedDir, open_directory, write_all

log = logging.getLogger("numa_agent.service")

KEY_NAME = "mark.key"


class MarkKeyError(Exception):
    pass


class MarkKey(NamedTuple):
    secret: bytes
    new: bool  # made by this call: no live mark can have been issued with it


def load_or_create_key(path: Path) -> MarkKey:
    """The key at `path`; a new one if it is missing, or damaged (then the
    marks made with the old one no longer verify). Its directory must be one
    only root or the agent's user can change (state/trusted_dir.py), and every
    step works in it through its descriptor, never through a symlink."""
    try:
        held = open_directory(path.parent, "mark key directory", create_mode=0o755)
    except OSError as exc:  # UntrustedDirectory goes up as it is: a configuration to fix
        raise MarkKeyError(f"cannot open the mark key's directory {path.parent}: {exc.strerror or exc}") from None
    with held:
        return _load_or_create(held, path.name)


def _load_or_create(held: TrustedDir, name: str) -> MarkKey:
    path = held / name
    made = False
    for _ in range(3):
        found, key = _read(held, name)
        if key is not None:
            return MarkKey(key, made)
        if found:  # decided on what was read, not on a second look another agent may race
            log.warning("mark key %s is damaged; replacing it (marks issued with it no longer verify)", path)
            held.rename(_temporary(held, name), name)
            made = True
        elif _create(held, name):
            log.info("mark key %s created", path)
            made = True
        # else another agent made it first: read theirs
    found, key = _read(held, name)
    if key is None:
        raise MarkKeyError(f"cannot make a usable mark key at {path}")
    return MarkKey(key, made)


def _read(held: TrustedDir, name: str) -> tuple[bool, bytes | None]:
    """(whether something is at `name`, the key if it is a usable one)."""
    try:
        fd = held.open(name, os.O_RDONLY)
    except FileNotFoundError:
        return False, None
    except OSError as exc:
        if not stat.S_ISLNK(held.lstat(name).st_mode):
            raise MarkKeyError(f"cannot read the mark key {held / name}: {exc}") from None
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


def _temporary(held: TrustedDir, name: str) -> str:
    fd, tmp = held.create_temporary(name, 0o600)
    try:
        write_all(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _create(held: TrustedDir, name: str) -> bool:
    """Link a new key into place; False if one appeared meanwhile."""
    tmp = _temporary(held, name)
    try:
        held.link(tmp, name)
        return True
    except FileExistsError:
        return False
    finally:
        held.unlink(tmp, missing_ok=True)


__all__ = ["KEY_NAME", "MarkKey", "MarkKeyError", "load_or_create_key"]
