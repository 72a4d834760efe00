"""Directories the agent writes in, held open so that nobody else can redirect
a write.

A root agent that creates, replaces or chmods a file by name in a directory
another user can write is a confused deputy: that user plants a symlink at
the name (or swaps the directory for one) and the agent overwrites any file
on the machine. So every directory the agent writes in is opened once with
`open_directory`, which walks the path from `/` one component at a time,
relative to the directory descriptor reached so far, and refuses it unless
the directory and every directory above it belong to root or the agent's
user and nobody else may write them. A shared directory above it (`/tmp`:
sticky, writable by all) is allowed: the sticky bit keeps others from
renaming or removing what is not theirs. A symlink on the way is followed
only where it cannot have been planted: in a checked directory, and in a
sticky shared one only when root or the agent owns it.

Every later operation (`TrustedDir.open`, `replace_file`, `unlink`, ...)
works relative to the held descriptor, never by the path again, and opens
with O_NOFOLLOW; new names are created with O_EXCL. A directory renamed or
swapped for a link after the start changes nothing: the agent goes on
writing in the directory it checked.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

_MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one lookup
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedDirectory(Exception):
    """A directory (or one above it) that someone but root or the agent's user
    could change, or no directory at all; the message is one line with the remedy."""


def agent_owners() -> frozenset[int]:
    """Who may own and write what the agent writes in: root and the agent's user."""
    return frozenset({0, os.geteuid()})


def open_directory(path: str | os.PathLike[str], what: str, *, create_mode: int | None = None,
                   owners: Iterable[int] | None = None) -> "TrustedDir":
    """Check and open `path` (see the module doc). Missing directories are made
    when `create_mode` is given: 0755 on the way, `create_mode` at the end.
    Raises UntrustedDirectory naming `what`, the offending directory, its owner
    and mode; OSError for what the kernel refuses (ENOENT, EACCES, ...)."""
    # Not normalised as text (os.path.abspath): '..' after a symlink goes up
    # from the link's target, as the kernel's (and the agent's other) lookups do.
    given = os.fspath(path)
    display = given if os.path.isabs(given) else os.path.join(os.getcwd(), given)
    trusted = frozenset(agent_owners() if owners is None else owners)
    walk = _Walk(display, what, trusted)
    try:
        return walk.run(create_mode)
    except BaseException:
        walk.close()
        raise


class _Walk:
    def __init__(self, display: str, what: str, owners: frozenset[int]) -> None:
        self.display, self.what, self.owners = display, what, owners
        self.stack: list[tuple[int, str, os.stat_result]] = []  # (fd, real path, its stat)

    def close(self) -> None:
        for fd, _, _ in self.stack:
            os.close(fd)
        self.stack.clear()

    def _push_root(self) -> None:
        self.close()
        fd = os.open("/", _DIR_FLAGS)
        self.stack.append((fd, "/", os.fstat(fd)))

    def run(self, create_mode: int | None) -> "TrustedDir":
        self._push_root()
        pending = [part for part in self.display.split("/") if part][::-1]  # a stack: next on top
        links = 0
        while pending:
            name = pending.pop()
            if name == ".":
                continue
            if name == "..":
                if len(self.stack) > 1:
                    os.close(self.stack.pop()[0])
                continue
            fd, real, st_dir = self.stack[-1]
            self._check(real, st_dir, final=False)
            entry = self._entry(fd, real, name, create_mode, last=not pending)
            if stat.S_ISLNK(entry.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), self.display)
                if _shared(st_dir) and entry.st_uid not in self.owners:
                    raise UntrustedDirectory(self._message(_join(real, name), entry, "a symlink in a shared "
                                                           "directory, owned by another user"))
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    self._push_root()
                pending.extend(part for part in reversed(target.split("/")) if part)
                continue
            if not stat.S_ISDIR(entry.st_mode):
                raise UntrustedDirectory(f"{self.what} {self.display}: {_join(real, name)} is not a directory")
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            st = os.fstat(child)
            self.stack.append((child, _join(real, name), st))
            if (st.st_dev, st.st_ino) != (entry.st_dev, entry.st_ino):  # replaced between the two looks
                raise UntrustedDirectory(f"{self.what} {self.display}: {_join(real, name)} changed while "
                                         "it was checked")
        fd, real, st = self.stack.pop()
        self.close()
        try:
            self._check(real, st, final=True)
        except BaseException:
            os.close(fd)
            raise
        return TrustedDir(Path(self.display), fd)

    def _entry(self, fd: int, real: str, name: str, create_mode: int | None, last: bool) -> os.stat_result:
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            if create_mode is None:
                raise
        mode = create_mode if last else 0o755
        try:
            os.mkdir(name, mode, dir_fd=fd)
            made = True
        except FileExistsError:
            made = False  # another made it meanwhile: checked like any other
        if made:
            # Exactly that mode, whatever the umask; the name is in a checked
            # directory, so it is still the one just made.
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                os.fchmod(child, mode)
            finally:
                os.close(child)
        return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def _check(self, real: str, st: os.stat_result, *, final: bool) -> None:
        if st.st_uid not in self.owners:
            raise UntrustedDirectory(self._message(real, st, "owned by another user", final))
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (final or not _shared(st)):
            raise UntrustedDirectory(self._message(real, st, "writable by its group or by others", final))

    def _message(self, real: str, st: os.stat_result, why: str, final: bool = False) -> str:
        # The directory itself (reached through a symlink: its real path too), or one above it.
        where = ("" if real == self.display else f" ({real})") if final else f": {real} above it"
        owner = _user_name(st.st_uid)
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        fix = (f"chown {_agent_user()} {real}" if "owned" in why
               else "remove a symlink planted there" if "symlink" in why else f"chmod go-w {real}")
        return (f"{self.what} {self.display}{where} is {why} (owner {owner}, mode {mode}); "
                f"anyone who can write it can redirect the agent's files: {fix}, or choose another directory")


def _shared(st: os.stat_result) -> bool:
    """A sticky directory writable by others, as /tmp: names there are safe
    from others only when root or the agent owns them."""
    return bool(st.st_mode & stat.S_ISVTX and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _join(real: str, name: str) -> str:
    return f"{real.rstrip('/')}/{name}"


def _agent_user() -> str:
    """Who the remedy should make the owner: the agent's own user."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


class TrustedDir:
    """A checked directory, held open: every operation is relative to its
    descriptor and refuses symlinks. `path` is for messages only."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "TrustedDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def removed(self) -> bool:
        """The directory was deleted (a directory renamed elsewhere is not):
        whoever holds it may open the path again, checked anew."""
        return os.fstat(self.fd).st_nlink == 0

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def proc_path(self, name: str = "") -> str:
        """A path that reaches `name` in this very directory, whatever happened
        to its name since (for calls that take no directory descriptor, such as bind)."""
        return f"/proc/self/fd/{self.fd}/{name}" if name else f"/proc/self/fd/{self.fd}"

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def exists(self, name: str) -> bool:
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, name: str) -> bytes:
        fd = self.open(name, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def listdir(self) -> list[str]:
        return os.listdir(self.fd)

    def unlink(self, name: str, *, missing_ok: bool = False) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rename(self, source: str, target: str) -> None:
        """Rename within the directory, replacing `target` (a link there is replaced, not followed)."""
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def link(self, source: str, target: str) -> None:
        """Hard-link `source` (never through a symlink) as `target`; FileExistsError if taken."""
        os.link(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)

    def fsync(self) -> None:
        """Make the directory's entries durable (a rename or a new name)."""
        os.fsync(self.fd)

    def create_temporary(self, stem: str, mode: int = 0o600) -> tuple[int, str]:
        """A new file under an unpredictable name (O_EXCL: nothing planted is
        reused), open for writing: (descriptor, name)."""
        for _ in range(100):
            name = f".{stem}.{secrets.token_hex(6)}.tmp"
            try:
                return self.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), name
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(self.path / stem))

    def replace_file(self, name: str, data: bytes, mode: int, *, durable: bool = False) -> None:
        """Replace `name` whole: a new temporary file, written (and fsynced when
        `durable`), given `mode` whatever the umask, then renamed over `name`."""
        fd, temporary = self.create_temporary(name, mode)
        try:
            try:
                write_all(fd, data)
                os.fchmod(fd, mode)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self.rename(temporary, name)
        except BaseException:
            self.unlink(temporary, missing_ok=True)
            raise
        if durable:
            self.fsync()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        view = view[written:]
