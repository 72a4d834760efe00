"""Revocations: a workload released while its process ran stays released.

`numa-agent release NAME` frees a workload's booking whatever its processes
do. They carry on, on the shared pool, but a trace of the workload remains
that start-up takes for a workload the checkpoint lost: its process's mark
(`NUMA_AGENT_MARK`, which the affinity fallback rebuilds workloads from:
service/rebuild.py) and, until the release is enforced, its cgroup with its
booking record (which start-up adopts from: service/recovery.py). So the
release also records a `Revocation` in the state, checkpointed with it
(snapshot and journal) before anything is enforced. Start-up neither
rebuilds nor adopts what a revocation names, and hands what it left running
to the shared pool again (the agent may have died before it did); in the
affinity fallback, where nothing follows the pool by itself, a released
process is re-pinned whenever the pool changes, as the cgroup tree's
`shared/_released` follows it.

The cost stays bounded: a revocation is kept only while a trace of it
remains, its process (pid and start time: no later process of this boot has
both, and a mark never verifies in another boot, whose key is new) or the
cgroup carrying its record. Each release and each start drop those without
one, so the list holds the released processes still running and at most
those that exited since the last release.

A checkpoint lost entirely (both generations and the journal) would take
them along; a copy beside the mark key (service/revocation_copy.py) outlives
it. Only the loss of both lets the next start in the affinity fallback
rebuild a released workload whose process still runs.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from numa_agent.enforcement.errors import EnforcementError
from numa_agent.enforcement.plan import is_pinned, workload_relpath
from numa_agent.enforcement.processes import process_alive, process_identity
from numa_agent.enforcement.protocol import Enforcer, Layout, Records, kept_records
from numa_agent.enforcement.record import decode_record
from numa_agent.state.model import AgentState, Revocation, Workload

log = logging.getLogger("numa_agent.service")

REASON = "released by an operator"


def revocation_of(w: Workload, now: float) -> Revocation:
    return Revocation(name=w.name, pid=w.pid, pid_identity=w.pid_identity, created_unix=w.created_unix,
                      cgroup=workload_relpath(w), released_unix=now)


def process_lives(r: Revocation) -> bool:
    """The revoked workload's own process still runs (not one that reuses its pid)."""
    if r.pid is None:
        return False
    if r.pid_identity is None:
        return process_alive(r.pid)
    return process_identity(r.pid) == r.pid_identity


def record_remains(r: Revocation, enforcer: Records) -> bool:
    """Its cgroup still carries the revoked booking's record (its release was
    not enforced yet); never a later workload's of the same name."""
    kept = kept_records(enforcer)
    if kept is None or not r.cgroup or not enforcer.exists(r.cgroup):
        return False
    return revoked_by((r,), kept.read_record(r.cgroup)) is not None


def revoked_by(revoked: Iterable[Revocation], data: bytes | None) -> Revocation | None:
    """The revocation of the booking whose record is `data` (a cgroup's), if any."""
    try:
        record = decode_record(data) if data is not None else None
    except ValueError:
        return None
    if not isinstance(record, Workload):
        return None
    return next((r for r in revoked if r.covers(record)), None)


def _lives_once() -> Callable[[Revocation], bool]:
    """process_lives, asked once per process: a process that admitted itself
    under many names and was released under each has one revocation per name."""
    known: dict[tuple[int | None, str | None], bool] = {}

    def lives(r: Revocation) -> bool:
        key = (r.pid, r.pid_identity)
        if key not in known:
            known[key] = process_lives(r)
        return known[key]
    return lives


def pruned(state: AgentState, enforcer: Records) -> AgentState:
    """`state` without the revocations of which no trace remains."""
    lives = _lives_once()
    kept = tuple(r for r in state.revoked if lives(r) or record_remains(r, enforcer))
    return state.with_revoked(kept)


def hand_to_pool(state: AgentState, enforcer: Enforcer, layout: Layout) -> None:
    """What the revoked workloads left running goes to the shared pool of
    `layout`: a cgroup still carrying a revoked record is emptied into it and
    removed, a live revoked process (the affinity fallback) re-pinned to it,
    once however many revocations name it; a live one pinned inside a cgroup it
    shares, to every CPU (its cgroup bounds it), as its release does.
    A failure is logged: the start or the change it belongs to goes on."""
    lives = _lives_once()
    handed: set[tuple[int | None, str | None]] = set()
    for r in state.revoked:
        pid = r.pid if (r.pid, r.pid_identity) not in handed and lives(r) else None
        # A task pinned inside a cgroup it shares has only its process's affinity to hand
        # back (a process booked again has no revocation left: service/cases/admit.py).
        pinned = pid is not None and bool(r.cgroup) and is_pinned(r.cgroup)
        cgroup = r.cgroup if pinned or record_remains(r, enforcer) else None
        if cgroup is None and pid is None:
            continue
        handed.add((r.pid, r.pid_identity))
        try:
            enforcer.evict(cgroup, pid, r.pid_identity, layout)
        except (EnforcementError, OSError) as exc:
            log.error("cannot move what the released workload %s left running to the shared pool: %s",
                      r.name, exc)


def released_views(state: AgentState) -> list[dict[str, Any]]:
    """The processes of revoked workloads still running: unmanaged, on the shared pool."""
    lives = _lives_once()
    return [{"name": r.name, "pid": r.pid, "released_unix": r.released_unix, "reason": REASON}
            for r in state.revoked if lives(r)]


__all__ = ["REASON", "hand_to_pool", "process_lives", "pruned", "record_remains", "released_views",
           "revocation_of", "revoked_by"]
