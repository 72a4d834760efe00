"""The C library, for the few system calls Python does not wrap
(inotify, statfs, set_mempolicy). Loaded once, from the running process's own
symbols: no library search (ctypes.util would spawn ldconfig), so numa-run
stays quick to start."""

from __future__ import annotations

import ctypes

_handle: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _handle
    if _handle is None:
        handle = ctypes.CDLL(None, use_errno=True)
        handle.syscall.restype = ctypes.c_long
        _handle = handle
    return _handle
