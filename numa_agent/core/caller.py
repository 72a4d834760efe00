"""Who is asking: the identity the API edge reads off the socket peer and hands the
service's use-cases (a value, below both: the edge and the core speak of it alike)."""

from __future__ import annotations

from dataclasses import dataclass


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
