"""The state directory's guard: one agent per directory, and a directory only
the agent's user can write.

`claim_state_dir` is the agent's very first step, before discovery, recovery
or any write. It creates the directory 0700 if missing, refuses one that
another user owns or that the group or the world may write (anyone who can
write the checkpoint can forge bookings: its checksum detects damage, not
intent), and takes an exclusive `flock` on `lock` inside it. The lock lives as
long as the returned object's descriptor, so it is released by the kernel
when the agent exits however it exits; a second agent on the same directory
fails at once naming the holder's PID.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

LOCK_NAME = "lock"
# Files in the directory the agent reads back; each must be as private as the directory.
GUARDED_FILES = ("checkpoint.json", "checkpoint.json.prev", "checkpoint.journal", LOCK_NAME)


class StateDirError(Exception):
    """The state directory cannot be trusted or used; the message has the remedy."""


class StateDirLocked(StateDirError):
    """Another agent holds the state directory."""

    def __init__(self, directory: Path, holder: int | None) -> None:
        who = f"PID {holder}" if holder else "another process"
        super().__init__(f"state directory {directory} is in use by another numa-agent ({who}); "
                         "stop it first, or give this one its own --state-dir")
        self.holder = holder


class StateDirClaim:
    """The held lock; `release()` (or process exit) gives it up."""

    def __init__(self, directory: Path, fd: int, created: bool) -> None:
        self.directory = directory
        self._fd = fd
        self._created = created

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def abandon(self) -> None:
        """Release after a failed start: a directory this claim created is
        removed again if nothing but the lock was put in it."""
        if self._fd >= 0 and self._created:
            try:
                if os.listdir(self.directory) == [LOCK_NAME]:
                    os.unlink(self.directory / LOCK_NAME)
                    os.rmdir(self.directory)
            except OSError:
                pass  # something else appeared: leave it
        self.release()


def claim_state_dir(directory: str | os.PathLike, *, uid: int | None = None) -> StateDirClaim:
    """Create (0700), check and lock the state directory; see the module doc."""
    path = Path(directory).absolute()
    owner = os.geteuid() if uid is None else uid
    created = not os.path.lexists(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateDirError(f"cannot create state directory {path}: {exc.strerror or exc}") from None
    _check_private(path, owner, "state directory", directory=True)
    for name in GUARDED_FILES:
        _check_private(path / name, owner, "file", directory=False)
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateDirError(f"cannot open {path / LOCK_NAME}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read_pid(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateDirLocked(path, holder) from None
        raise StateDirError(f"cannot lock {path / LOCK_NAME}: {exc.strerror or exc}") from None
    # Ours now: say who holds it, for the next agent's message.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateDirClaim(path, fd, created)


def _check_private(path: Path, owner: int, what: str, *, directory: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateDirError(f"cannot inspect {path}: {exc.strerror or exc}") from None
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        expected = "a directory" if directory else "a regular file"
        raise StateDirError(f"{what} {path} is not {expected} (a symlink or device is refused)")
    if st.st_uid != owner:
        raise StateDirError(f"{what} {path} is owned by uid {st.st_uid}, not by the agent's uid {owner}; "
                            f"anyone who can write it can forge bookings: chown {owner} {path}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirError(f"{what} {path} is writable by its group or by others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}); anyone who can write it can forge bookings: "
                            f"chmod go-w {path}")


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
