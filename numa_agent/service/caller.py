"""Who is asking: the caller identity the API edge hands the service."""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Caller:
    """Who is asking, as the kernel reports it for the Unix socket peer.

    `pidfd` is opened by the API server right after accept, so the process
    cannot be swapped for another one with a recycled PID. The server closes
    it after the request; a service that wants to keep it must `os.dup` it.
    """

    pid: int
    uid: int
    gid: int
    pidfd: int | None = None
    # process_identity(pid), read after the pidfd was pinned: what a recycled
    # PID cannot repeat, kept with the workload.
    identity: str | None = None
    # Its supplementary groups at connect (SO_PEERGROUPS); () when not known.
    groups: tuple[int, ...] = ()

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return self.gid == gid or gid in self.groups


# uid -> user name, None when the user database has none: what `status` shows
# for an owner. The system's (NSS) by default; tests give their own.
UserNames = Callable[[int], "str | None"]


def system_user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None
