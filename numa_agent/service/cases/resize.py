"""Resize: a workload's exclusive CPUs and memory grown or shrunk in place."""

from __future__ import annotations

import logging
import time

from numa_agent.admission.admit import Refusal
from numa_agent.admission.quota import check_quota
from numa_agent.admission.resize import resize as resize_workload
from numa_agent.core.caller import Caller
from numa_agent.service.cases.ports import CaseParts
from numa_agent.service.cases.refusal import refused
from numa_agent.service.refusals import InConflict, InvalidInput, NotPermitted, NotResizable, UnknownWorkload

log = logging.getLogger("numa_agent.service")


def resize(parts: CaseParts, name: str, caller: Caller, cpus: int | None = None,
           memory_bytes: int | None = None) -> dict:
    """Grow or shrink `name`'s exclusive CPUs and memory in place: decided by the
    pure core (admission.resize.resize), then committed as an admission is
    (checkpoint, then enforcement, kubelet files and isolation), so a crash
    leaves the old booking or the new."""
    started = time.perf_counter()
    # The quota is the workload owner's, whoever asks; looked up outside the lock (may be remote).
    held = parts.state.workload(name)
    owner = parts.owner(caller.uid if held is None else held.owner_uid) if parts.quotas else None
    with parts.lock:
        w = parts.state.workload(name)
        if w is None:
            raise UnknownWorkload(f"no workload named {name!r}")
        if owner is not None and owner.uid != w.owner_uid:  # replaced meanwhile
            owner = parts.owner(w.owner_uid)
        if not caller.is_root and caller.uid != w.owner_uid:
            raise NotPermitted(f"workload {name!r} belongs to uid {w.owner_uid}; only its owner or root may resize it")
        if w.quarantined:
            raise InConflict(f"{name} is held for an operator, not a workload to resize")
        try:
            decision = resize_workload(parts.machine, parts.state, name, cpus=cpus, memory_bytes=memory_bytes)
            if owner is not None:
                check_quota(parts.quotas, owner, parts.state, decision.state, decision.explanation)
        except Refusal as exc:
            parts.counters.refused(exc.code, time.perf_counter() - started)
            log.warning("resize of %s refused for uid %d: %s", name, caller.uid, exc.message)
            invalid = {"not_found": UnknownWorkload, "bad_request": InvalidInput,
                       "not_resizable": NotResizable}.get(exc.code)
            if invalid is not None:
                raise invalid(exc.message) from None
            raise refused(exc) from None
        pending = parts.stage(decision.state)
        installed = parts.state
    parts.apply(pending)  # the kernel writes: without the lock
    resized = decision.workload
    log.info("resized %s for uid %d: cpus %s -> %s, memory %s -> %s", name, caller.uid,
             w.booking.cpus.format() or "-", resized.booking.cpus.format() or "-",
             w.booking.memory_total("memory"), resized.booking.memory_total("memory"))
    return parts.admission_view(installed, resized, decision.explanation, dry_run=False)
