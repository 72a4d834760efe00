"""The state directory's guard: one agent per directory, and a directory only
the agent's user can write.

`claim_state_dir` is the agent's very first step, before discovery, recovery
or any write. It creates the directory 0700 if missing, refuses one that
another user owns or that the group or the world may write, or below such a
directory (anyone who can write the checkpoint can forge bookings: its
checksum detects damage, not intent; state/trusted_dir.py), and takes an exclusive `flock` on `lock` inside it. The lock lives as
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

from numa_agent.state.trusted_dir import TrustedDir, UntrustedDirectory, agent_owners, open_directory

LOCK_NAME = "lock"
# Files in the directory the agent reads back; each must be as private as the directory.
GUARDED_FILES = ("checkpoint.json", "checkpoint.json.prev", "checkpoint.journal", LOCK_NAME)


class StateDirError(Exception):
    """The state directory cannot be trusted or used; the message has the remedy."""


class StateDirUntrusted(StateDirError):
    """Someone but root or the agent's user could change the directory or a
    file in it: a configuration to fix, which no restart cures."""


class StateDirLocked(StateDirError):
    """Another agent holds the state directory."""

    def __init__(self, directory: Path, holder: int | None) -> None:
        who = f"PID {holder}" if holder else "another process"
        super().__init__(f"state directory {directory} is in use by another numa-agent ({who}); "
                         "stop it first, or give this one its own --state-dir")
        self.holder = holder


class StateDirClaim:
    """The held lock and the directory, held open (`held`: what the checkpoint
    writes through); `release()` (or process exit) gives both up."""

    def __init__(self, held: TrustedDir, fd: int, created: bool) -> None:
        self.held = held
        self.directory = held.path
        self._fd = fd
        self._created = created

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.held.close()

    def abandon(self) -> None:
        """Release after a failed start: a directory this claim created is
        removed again if nothing but the lock was put in it."""
        if self._fd >= 0 and self._created:
            try:
                if self.held.listdir() == [LOCK_NAME]:
                    self.held.unlink(LOCK_NAME)
                    os.rmdir(self.directory)
            except OSError:
                pass  # something else appeared: leave it
        self.release()


def claim_state_dir(directory: str | os.PathLike) -> StateDirClaim:
    """Create (0700), check and lock the state directory; see the module doc."""
    path = Path(directory).absolute()
    for _ in range(_CLAIM_ATTEMPTS):
        claim = _claim_once(path)
        if claim is not None:
            return claim
    raise StateDirError(f"state directory {path} was removed each time it was claimed: "
                        "is another agent starting and failing on it?")


# Two agents starting at once on a missing directory: the one that made it may
# fail its start and remove it (abandon) just as the other takes the lock.
_CLAIM_ATTEMPTS = 3


def _claim_once(path: Path) -> StateDirClaim | None:
    """The claim, or None when the lock was won on a file (or in a directory)
    removed meanwhile, which guards nothing: to be tried again."""
    created = not os.path.lexists(path)
    try:
        held = open_directory(path, "state directory", create_mode=0o700)
    except UntrustedDirectory as exc:
        raise StateDirUntrusted(str(exc)) from None
    except OSError as exc:
        raise StateDirError(f"cannot create state directory {path}: {exc.strerror or exc}") from None
    try:
        for name in GUARDED_FILES:
            _check_private(held, name)
        try:
            fd = held.open(LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
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
        if os.fstat(fd).st_nlink == 0 or held.removed():
            os.close(fd)
            held.close()
            return None
    except BaseException:
        held.close()
        raise
    # Ours now: say who holds it, for the next agent's message.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateDirClaim(held, fd, created)


def _check_private(directory: TrustedDir, name: str) -> None:
    path = directory / name
    try:
        st = directory.lstat(name)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateDirError(f"cannot inspect {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StateDirUntrusted(f"file {path} is not a regular file (a symlink or device is refused)")
    if st.st_uid not in agent_owners():
        raise StateDirUntrusted(f"file {path} is owned by uid {st.st_uid}, not by root or the agent's uid "
                            f"{os.geteuid()}; anyone who can write it can forge bookings: "
                            f"chown {os.geteuid()} {path}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirUntrusted(f"file {path} is writable by its group or by others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}); anyone who can write it can forge bookings: "
                            f"chmod go-w {path}")


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
