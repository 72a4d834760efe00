"""Release: a workload's booking handed back, by its owner, root or the agent
(an exit it saw, a refusal it took back)."""

from __future__ import annotations

import logging

import msgspec

from numa_agent.admission.admit import release as release_workload
from numa_agent.core.caller import Caller
from numa_agent.enforcement.errors import EnforcementError
from numa_agent.enforcement.plan import workload_relpath
from numa_agent.service.cases.ports import CaseParts
from numa_agent.service.refusals import InConflict, NotPermitted, Unavailable, UnknownWorkload
from numa_agent.service.revocations import process_lives, pruned, revocation_of
from numa_agent.state.checkpoint import describe_oserror
from numa_agent.state.model import AgentState, Workload

log = logging.getLogger("numa_agent.service")


def release(parts: CaseParts, name: str, caller: Caller | None, reason: str = "requested",
            request_id: str | None = None) -> dict:
    """Release `name`; with `request_id`, only if that admission made it (a
    workload recorded without one, from before ids were kept, is taken by name).
    `caller` None: the agent's own release (an exit, a refusal taken back)."""
    seen = parts.state.workload(name)
    if caller is None and reason == "exited" and seen is not None:
        # An exit seen while the workload's admission was still being written (its
        # cgroup made, the process not yet moved in) is no exit: looked at again after.
        rel = workload_relpath(seen)
        if parts.wait_written(rel) and parts.enforcer.populated(rel):
            raise InConflict(f"{name} has its process in its cgroup: not released as exited")
    with parts.lock:
        w = parts.state.workload(name)
        if w is None:
            raise UnknownWorkload(f"no workload named {name!r}")
        if request_id is not None and w.request.get("request_id") not in (None, request_id):
            raise UnknownWorkload(f"no workload named {name!r} admitted under request id {request_id}")
        if caller is None and w.quarantined:
            # Not the exit of a followed process: the hold stays until an operator asks.
            raise InConflict(f"{name} holds CPUs {w.booking.cpus.format() or '(none)'} for an "
                             f"operator; only `numa-agent release {name}` as root frees them")
        if caller is not None and not caller.is_root and caller.uid != w.owner_uid:
            raise NotPermitted(f"workload {name!r} belongs to uid {w.owner_uid}; only its owner "
                               f"or root may release it")
        new_state, released, pod = release_workload(parts.state, name)
        try:
            new_state = _revoked_after(parts, new_state, w, reason, asked=caller is not None)
        except (EnforcementError, OSError) as exc:  # whether it still runs, unread: descriptors out
            what = describe_oserror(exc) if isinstance(exc, OSError) else str(exc)
            raise Unavailable(f"cannot release {name}, nothing was released: {what}") from None
        pending = parts.stage(new_state, released=w)
    parts.apply(pending)  # the kernel writes: without the lock
    parts.counters.releases_total += 1
    if w.quarantined:
        log.warning("released the held CPUs %s of %s (pid %s at start-up) on an operator's "
                    "request", w.booking.cpus.format() or "(none)", name, w.request.get("pid"))
    log.info("released %s (%s)%s", name, reason, f"; pod {pod.name} budget freed" if pod else "")
    return {"name": name, "released": True, "reason": reason,
            "pod_released": pod.name if pod else None}


def _revoked_after(parts: CaseParts, state: AgentState, w: Workload, reason: str, asked: bool) -> AgentState:
    """`state` (without `w`) with the revocations of which a trace remains,
    and `w`'s own when it was `asked` (not the agent's own release of an
    exit or a refusal) and its process still runs: released, it must not
    come back at a restart (service/revocations.py). A hold names no
    process the agent follows: its own is the one it was held for."""
    state = pruned(state, parts.enforcer)
    if not asked:
        return state
    if w.quarantined:
        pid, identity = w.request.get("pid"), w.request.get("pid_identity")
        w = msgspec.structs.replace(w, pid=pid if isinstance(pid, int) else None,
                                    pid_identity=identity if isinstance(identity, str) else None)
        running = process_lives(revocation_of(w, 0.0))
    else:
        running = parts.enforcer.populated(workload_relpath(w))
    if not running:
        return state
    where = f"its cgroup's CPUs ({w.pinned_in})" if w.pinned_in is not None else "the shared pool"
    log.warning("released %s (%s) while pid %s still runs: it goes back to %s, no longer "
                "managed, and is never taken for a workload again", w.name, reason, w.pid, where)
    return state.with_revoked((*state.revoked, revocation_of(w, parts.clock())))
