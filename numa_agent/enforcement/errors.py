"""Typed errors of the enforcement edge.

Every OSError raised while touching cgroupfs is turned into one of these, so
callers branch on the class (busy, no space, invalid...) instead of errno
numbers, and the message always names the file, the value and the errno.
"""

from __future__ import annotations

import errno as _errno
import os


class EnforcementError(Exception):
    """Base of everything the enforcement edge raises."""


class CgroupError(EnforcementError):
    """A cgroupfs operation failed.

    `path` is the file or directory involved, `value` what was written (None
    for reads, mkdir and rmdir), `errno` the kernel's error number (None for
    errors this project detects itself).
    """

    def __init__(self, message: str, *, path: str = "", value: str | None = None,
                 errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.value = value
        self.errno = errno


class CgroupPathError(CgroupError, ValueError):
    """A relative cgroup path that is malformed or would leave the root."""


class CgroupBusyError(CgroupError):
    """EBUSY: the cgroup has processes or children, or a sibling holds the CPUs."""


class CgroupInvalidError(CgroupError):
    """EINVAL, or a value the kernel accepted but reports as invalid."""


class CgroupNoSpaceError(CgroupError):
    """ENOSPC: e.g. moving a process into a cgroup whose cpuset is empty."""


class CgroupRangeError(CgroupError):
    """ERANGE: a value outside what the kernel accepts for the file."""


class CgroupPermissionError(CgroupError):
    """EACCES/EPERM: not allowed to write the file or move the process."""


class CgroupMissingError(CgroupError):
    """ENOENT: the cgroup or interface file does not exist (controller not enabled?)."""


class CgroupNoSuchProcessError(CgroupMissingError):
    """ESRCH: the process to move does not exist (any more)."""


class CgroupExistsError(CgroupError):
    """EEXIST: creating a cgroup that is already there."""


class CgroupUnsupportedError(CgroupError):
    """The running system cannot do what was asked (e.g. no inotify)."""


_BY_ERRNO: dict[int, type[CgroupError]] = {
    _errno.EBUSY: CgroupBusyError,
    _errno.ENOTEMPTY: CgroupBusyError,
    _errno.EINVAL: CgroupInvalidError,
    _errno.ENOSPC: CgroupNoSpaceError,
    _errno.ERANGE: CgroupRangeError,
    _errno.EACCES: CgroupPermissionError,
    _errno.EPERM: CgroupPermissionError,
    _errno.EROFS: CgroupPermissionError,
    _errno.ENOENT: CgroupMissingError,
    _errno.ESRCH: CgroupNoSuchProcessError,
    _errno.EEXIST: CgroupExistsError,
    _errno.E2BIG: CgroupRangeError,
    _errno.EOPNOTSUPP: CgroupUnsupportedError,  # also ENOTSUP on Linux
}


def cgroup_error_from_oserror(exc: OSError, action: str, path: str,
                              value: str | None = None) -> CgroupError:
    """Build the typed error for an OSError raised by `action` on `path`."""
    code = exc.errno
    name = _errno.errorcode.get(code, "E?") if code is not None else "E?"
    meaning = os.strerror(code) if code is not None else str(exc)
    what = f"{action} {value!r} to {path}" if value is not None else f"{action} {path}"
    cls = _BY_ERRNO.get(code, CgroupError) if code is not None else CgroupError
    return cls(f"{what} failed: {name} ({meaning})", path=path, value=value, errno=code)


class AffinityError(EnforcementError):
    """sched_setaffinity refused the requested CPU set."""
