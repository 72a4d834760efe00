"""A Unix socket's file: taking its path safely, and giving it back.

Shared by the HTTP API (`api/server.py`) and the PodResources gRPC server
(`kubelet/grpc_server.py`), so both refuse a path another server answers on
and both appear with the configured mode and group from their first instant.
"""

from __future__ import annotations

import errno
import grp
import os
import secrets
import socket
import stat
from typing import Callable

from numa_agent.state.trusted_dir import TrustedDir, open_directory

# sun_path is 108 bytes; clients in C (and most languages) need its closing NUL.
SUN_PATH_MAX = 107


class SocketInUse(RuntimeError):
    """Another process is already serving on the socket path."""


def check_socket_path(path: str, option: str = "--socket") -> None:
    """Nothing, or a stale socket nobody listens on, is at `path`; else SocketInUse."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return  # stale: nobody listens; placing the new one replaces it
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketInUse(f"cannot tell whether {path} is in use: {exc}") from None
        return
    finally:
        probe.close()
    raise SocketInUse(f"another agent is already serving on {path}; stop it first or choose another {option}")


def place_socket(path: str, mode: int, group: str | None, bind_at: Callable[[str], None],
                 option: str = "--socket") -> tuple[int, int]:
    """Bind a socket at `path` with `mode` and `group`: `bind_at(name)` binds
    it at a temporary name under a private umask, owner and mode are fixed,
    then it is renamed into place, so the path never exists with loose
    rights. The directory is made (0755) if missing and must be one only
    root or the agent's user can change (state/trusted_dir.py): the chown and
    chmod of a name another user could replace by a link would land on any
    file. Returns the file's (device, inode), for `remove_socket`."""
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise ValueError(f"socket path {path} is {len(os.fsencode(path))} bytes, longer than a Unix socket's "
                         f"{SUN_PATH_MAX}: choose a shorter {option}")
    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"socket group {group!r} does not exist") from None
    with open_directory(os.path.dirname(path) or ".", "socket directory", create_mode=0o755) as held:
        # The directory first: what another user could have put at the name
        # must not stand for the error to fix.
        check_socket_path(path, option)
        # Not named after the socket: /proc/self/fd/N/ plus a long name would
        # not fit in sun_path where the path itself does.
        tmp = f".sock.{secrets.token_hex(6)}.tmp"
        old_umask = os.umask(0o177)
        try:
            bind_at(held.proc_path(tmp))  # in the directory held, whatever its name leads to now
        finally:
            os.umask(old_umask)
        try:
            _set_owner_and_mode(held, tmp, gid, mode)
            held.rename(tmp, os.path.basename(path))
            st = held.lstat(os.path.basename(path))
        except BaseException:
            held.unlink(tmp, missing_ok=True)
            raise
    return st.st_dev, st.st_ino


def _set_owner_and_mode(held: TrustedDir, name: str, gid: int, mode: int) -> None:
    """chown and chmod the socket just bound, never through a symlink: chmod
    has no flag for that, so it goes through an O_PATH descriptor of the
    socket itself."""
    fd = held.open(name, os.O_PATH)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise SocketInUse(f"{held / name} is no longer the socket just bound; refusing to use it")
        if gid != -1:
            os.chown(f"/proc/self/fd/{fd}", -1, gid)
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def remove_socket(path: str, inode: tuple[int, int] | None) -> None:
    """Unlink `path` only if it is still the socket placed (a successor may own it)."""
    if inode is None:
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if inode == (st.st_dev, st.st_ino):
        os.unlink(path)
