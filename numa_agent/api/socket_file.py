"""A Unix socket's file: taking its path safely, and giving it back.

Shared by the HTTP API (`api/server.py`) and the PodResources gRPC server
(`kubelet/grpc_server.py`), so both refuse a path another server answers on
and both appear with the configured mode and group from their first instant.
"""

from __future__ import annotations

import errno
import grp
import os
import socket
import stat
from typing import Callable


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
    rights. Returns the file's (device, inode), for `remove_socket`."""
    check_socket_path(path, option)
    parent = os.path.dirname(path)
    # Clients must reach the socket whatever the umask (the unit's is 0077).
    old_umask = os.umask(0o022)
    try:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    finally:
        os.umask(old_umask)
    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"socket group {group!r} does not exist") from None
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    old_umask = os.umask(0o177)
    try:
        bind_at(tmp)
    finally:
        os.umask(old_umask)
    try:
        if gid != -1:
            os.chown(tmp, -1, gid)
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    st = os.stat(path)
    return st.st_dev, st.st_ino


def remove_socket(path: str, inode: tuple[int, int] | None) -> None:
    """Unlink `path` only if it is still the socket placed (a successor may own it)."""
    if inode is None:
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if inode == (st.st_dev, st.st_ino):
        os.unlink(path)
