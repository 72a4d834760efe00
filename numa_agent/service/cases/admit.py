"""Admit: a request decided by the pure core (admission.admit.decide), judged
against the quotas, the isolation it asks for and --isolate-strict, then
committed (checkpoint, enforcement, acknowledgement). A request id already
used replays the admission it made; an engine's cgroup (a container's, a
Slurm task's) is booked inside what the engine granted it."""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Mapping

import msgspec

from numa_agent.admission.admit import (
    InvalidRequest,
    Refusal,
    Request,
    alignment_guaranteed,
    decide,
    effective_cpus,
)
from numa_agent.admission.quota import REASON_CODE as QUOTA_EXCEEDED
from numa_agent.admission.quota import check_quota
from numa_agent.core.caller import Caller
from numa_agent.core.hints import TopologyHint
from numa_agent.core.names import NAME_RULE, engine_name_refusal, is_workload_name
from numa_agent.enforcement.errors import EnforcementError
from numa_agent.enforcement.plan import engine_clash, runtime_enforced, workload_relpath
from numa_agent.enforcement.protocol import engines_of
from numa_agent.isolation.keeper import ISOLATE, STRICT, isolation_asked
from numa_agent.service.cases import release as release_case
from numa_agent.service.cases.ports import AdmitParts
from numa_agent.service.cases.refusal import refused
from numa_agent.service.counters import ManagerOutcome
from numa_agent.service.hugepage_counters import counters_for
from numa_agent.service.refusals import (
    InConflict,
    InvalidInput,
    NoCapacity,
    NotPermitted,
    RequestIdTaken,
    Unavailable,
)
from numa_agent.service.requests import (
    AdmitRequest,
    RuntimeRef,
    empty_runtime_id,
    to_admission_request,
    with_engine_grant,
)
from numa_agent.state.checkpoint import describe_oserror
from numa_agent.state.model import AgentState, Workload

log = logging.getLogger("numa_agent.service")


def admit(parts: AdmitParts, request: AdmitRequest, caller: Caller, dry_run: bool = False) -> dict:
    started = time.perf_counter()
    owner = parts.owner(caller.uid) if parts.quotas else None
    kernel = counters_for(parts.hugepage_counters, parts.machine, request,  # sysfs: outside the lock
                          parts.state, parts.enforcer.path_of)
    with parts.lock:
        request_id = None if dry_run else request.request_id
        if request_id is not None:
            replayed = _replay(parts, request_id, caller, request.runtime)
            if replayed is not None:
                return replayed
        deciding = time.perf_counter()
        try:
            req = _request_from(parts, request, caller)
            _check_runtime(parts.state, request, caller)
            req = _on_engine_cgroup(parts, req, request, caller)
            deciding = time.perf_counter()
            # A dry run (numa-run --dry-run, numa-agent explain) shows every provider's
            # hints and what was free; an admission's answer and log line do without.
            decision = decide(parts.machine, parts.state, req, explain=dry_run, kernel=kernel)
            if owner is not None:
                check_quota(parts.quotas, owner, parts.state, decision.state, decision.explanation)
        except OSError as exc:  # a file the decision needs (the caller's cgroup...): descriptors out
            raise Unavailable(f"cannot decide the admission, nothing was booked: {describe_oserror(exc)}") \
                from None
        except _NameTaken as exc:
            parts.counters.refused("name_in_use", time.perf_counter() - started)
            raise InConflict(f"a workload named {exc.args[0]!r} already exists; choose another --name") from None
        except InvalidRequest as exc:
            parts.counters.refused("bad_request", time.perf_counter() - started)
            raise InvalidInput(str(exc)) from None
        except Refusal as exc:
            # forbidden: no manager was asked; over a quota: refused after the managers
            # decided, as the kubelet's never see a pod its namespace's quota refused.
            if exc.code not in ("forbidden", QUOTA_EXCEEDED) and not dry_run:
                outcome = _manager_outcome(parts, request, exc.explanation, exc.pinned, exc.provider,
                                           merge_refused=exc.provider is None)
                parts.counters.decided(outcome, time.perf_counter() - deciding)
            parts.counters.refused(exc.code, time.perf_counter() - started)
            log.warning("refused %s for uid %d pid %d: %s | hints: %s | merged: %s",
                        request.name or "(unnamed)", caller.uid, caller.pid, exc.message,
                        _hints_text(exc.explanation), _merged_text(exc.explanation))
            if exc.code == "forbidden":
                raise NotPermitted(exc.message) from None
            raise refused(exc) from None
        if not dry_run:
            outcome = _manager_outcome(parts, request, decision.explanation, decision.pinned, None,
                                       merge_refused=False)
            parts.counters.decided(outcome, time.perf_counter() - deciding)
        w = _pinned(_with_runtime(decision.workload, request), request)
        w = _with_isolation(parts, w, request, caller, started)
        decision_state = decision.state if w is decision.workload else decision.state.with_workload(w)
        _check_strict(parts, decision_state, w, started)
        if dry_run:
            parts.counters.dry_run(time.perf_counter() - started)
            return parts.admission_view(decision_state, w, decision.explanation, dry_run=True)

        new_state = decision_state
        if request_id is not None:
            # Checkpointed with the workload, so a retry after a restart finds it.
            w = msgspec.structs.replace(w, request={**w.request, "request_id": request_id})
            new_state = new_state.with_workload(w)
        new_state = _unrevoked(new_state, w)
        # On an engine's cgroup the processes are already where they belong; a
        # runtime's container has none of the agent's to go to.
        move = None if w.cgroup is not None or w.runtime is not None else (workload_relpath(w), caller.pid)
        pending = parts.stage(new_state, admitted=w, move=move, caller=caller)
    parts.apply(pending)  # the kernel writes: without the lock
    _refuse_if_not_isolated(parts, w, started)
    parts.counters.admitted(time.perf_counter() - started, decision.explanation.get("alignment", {}))
    log.info("admitted %s for uid %d pid %d: cpus %s mems %s devices %s | merged: %s",
             w.name, caller.uid, caller.pid, effective_cpus(parts.machine, new_state, w).format(),
             ",".join(map(str, w.booking.mems)), ",".join(w.booking.device_addresses()) or "-",
             _merged_text(decision.explanation))
    return parts.admission_view(new_state, w, decision.explanation, dry_run=False)


def _manager_outcome(parts: AdmitParts, body: AdmitRequest, explanation: Mapping[str, Any],
                     pinned: frozenset[str], failed: str | None, merge_refused: bool) -> ManagerOutcome:
    """A decided admission (refused by the provider `failed`, or by the merge) as the
    kubelet's managers count it."""
    return ManagerOutcome(pinned=pinned, failed=failed, merge_refused=merge_refused,
                          guaranteed=alignment_guaranteed(explanation),
                          scope="pod" if body.pod else "container",
                          full_pcpus_only=parts.machine.cpu_options.full_pcpus_only)


# ---- requests ----------------------------------------------------------------
def _check_engine_clash(parts: AdmitParts, cgroup: str, pinned: bool = False) -> None:
    """One workload per engine cgroup, and none in or around another's: a
    cpuset or limit written on a cgroup governs its whole subtree, so an
    exclusive workload below another would run on the outer one's CPUs.
    Workloads pinned inside one cgroup they share (`pinned`: a Slurm step's
    tasks) are the exception: any number of them, and nothing else there."""
    clash = engine_clash(parts.engine_index(), cgroup)
    if clash is None:
        return
    spec = parts.layout.get(clash)
    where = ("lies below" if cgroup.startswith(clash + "/") else "lies above") + f" cgroup {clash}, which holds"
    if spec is None:  # no cgroup of a workload's: only pinned workloads hold it
        if clash != cgroup:
            raise InConflict(f"cgroup {cgroup} {where} workloads pinned inside it (tasks booked apart)")
        if pinned:
            return
        raise InConflict(f"cgroup {cgroup} holds workloads pinned inside it (tasks booked apart); one "
                         "booking for the whole cgroup cannot join them")
    where = "already holds" if clash == cgroup else where
    raise InConflict(f"cgroup {cgroup} {where} workload {spec.workload or '(unknown)'}; one engine cgroup "
                     "takes one workload, and none nests in another's")


def _replay(parts: AdmitParts, request_id: str, caller: Caller, runtime: RuntimeRef | None) -> dict | None:
    """The admission already made under `request_id` (its answer was lost:
    the client retried after a restart or a dropped connection), or None.
    A runtime's container (`runtime`) replays only the booking that same
    container made: its runtime would otherwise enforce CPUs another holds."""
    name = parts.request_index().get(request_id)
    w = parts.state.workload(name) if name is not None else None
    if w is None or w.request.get("request_id") != request_id:
        return None
    # A named engine cgroup's pid is the hook's that asked first: each hook run
    # is a new process (a container restarted before its exit was seen asks again).
    any_pid = w.cgroup is not None and caller.is_root
    if w.owner_uid != caller.uid or (w.pid is not None and w.pid != caller.pid and not any_pid):
        raise RequestIdTaken(f"request id {request_id} belongs to another admission "
                             "(another user or process); send a new random one")
    if runtime is not None and (w.runtime is None or w.runtime.container_id != runtime.container_id):
        raise RequestIdTaken(f"request id {request_id} belongs to {w.name}, which another container or "
                             "workload holds; a container replays only its own booking")
    try:
        parts.rejoin(w, caller)
    except (EnforcementError, OSError, ProcessLookupError) as exc:
        raise Unavailable(f"workload {w.name} is booked but the process could not be "
                          f"moved into it: {exc}") from None
    log.info("replayed the admission of %s for uid %d pid %d (request id %s)",
             w.name, caller.uid, caller.pid, request_id)
    view = parts.admission_view(parts.state, w, {}, dry_run=False)
    view["replayed"] = True
    return view


# ---- isolation ------------------------------------------------------------------
def _with_isolation(parts: AdmitParts, w: Workload, body: AdmitRequest, caller: Caller,
                    started: float) -> Workload:
    """`w` with the isolation it asked for (or the configured default) in its request."""
    if body.isolate and not (caller.is_root or (parts.isolate_gid is not None and
                                                caller.in_group(parts.isolate_gid))):
        parts.counters.refused("forbidden", time.perf_counter() - started)
        raise NotPermitted("--isolate changes machine-wide settings (interrupt affinities, idle states, "
                           "CPU frequency): only root may ask for it, or the members of the group the "
                           "agent's [isolation] group names")
    kinds = tuple(body.isolate) if body.isolate is not None else parts.isolate_default
    if not kinds or (w.shared and body.isolate is None):
        return w
    if w.shared:
        raise InvalidInput("--isolate needs exclusive CPUs (--cpus or --physcpubind); a shared "
                           "workload runs on CPUs others use too", details={"field": "isolate"})
    extra: dict[str, Any] = {ISOLATE: list(kinds)}
    if body.isolate_strict:
        extra[STRICT] = True
    return msgspec.structs.replace(w, request={**w.request, **extra})


def _check_strict(parts: AdmitParts, state: AgentState, w: Workload, started: float) -> None:
    """--isolate-strict asking for what this machine lacks: refused before anything is booked."""
    if not w.request.get(STRICT):
        return
    missing = parts.isolation.missing(state, w.name) if parts.isolation is not None \
        else tuple(f"{k}: not available in this agent" for k in isolation_asked(w))
    if missing:
        _refuse_isolation(parts, w, missing, started)


def _refuse_if_not_isolated(parts: AdmitParts, w: Workload, started: float) -> None:
    """--isolate-strict and a write failed: released again (the knobs restored), refused."""
    if not w.request.get(STRICT) or parts.isolation is None:
        return
    report = parts.isolation.report(w)
    if report is not None and report.failed():
        release_case.release(parts, w.name, None, reason="--isolate-strict could not isolate it")
        _refuse_isolation(parts, w, report.failed(), started)


def _refuse_isolation(parts: AdmitParts, w: Workload, failed: tuple[str, ...], started: float) -> None:
    parts.counters.refused("isolation_unavailable", time.perf_counter() - started)
    message = f"--isolate-strict: cannot isolate {w.name}: {'; '.join(failed)}"
    log.warning("refused %s: %s", w.name, message)
    raise NoCapacity(message, details={"admit": False, "reason": message,
                                       "reason_code": "isolation_unavailable",
                                       "isolation": list(failed)})


def _request_from(parts: AdmitParts, body: AdmitRequest, caller: Caller) -> Request:
    name = body.name or _generate_name(parts.state, body, caller)
    for key, value in (("name", name), ("pod", body.pod)):
        if value is not None and not is_workload_name(value):
            raise InvalidRequest(f"{key} {value!r} must be {NAME_RULE}")
    for value in (name, body.pod):
        if value is not None and (refusal := engine_name_refusal(value, caller.uid)) is not None:
            raise Refusal("forbidden", refusal)
    if parts.state.workload(name) is not None:
        raise _NameTaken(name)
    return to_admission_request(body, caller, name=name, created_unix=parts.clock())


def _on_engine_cgroup(parts: AdmitParts, req: Request, body: AdmitRequest, caller: Caller) -> Request:
    """`req` enforced on an engine's cgroup when the body asks for one: a
    named one for root only (a container's, from its OCI hook), or the
    caller's own when every process there is the caller's (numa-run in a
    Slurm task). Booked inside what the engine granted that cgroup."""
    if body.cgroup is None and not body.in_place:
        return req
    cgroup = body.cgroup
    if cgroup is not None and not caller.is_root:
        raise NotPermitted("only root may have a named cgroup enforced (an engine's hook runs as root); "
                           "numa-run asks for its own with in_place")
    engines = engines_of(parts.enforcer)
    if cgroup is None:
        cgroup = None if engines is None else engines.cgroup_of(caller.pid)
        if cgroup is None or cgroup.count("/") < 2:
            raise InvalidRequest(f"in_place: pid {caller.pid} is in cgroup {cgroup or '(none)'}, "
                                 "not below an engine's cgroup")
    if engines is None:
        raise InvalidRequest(f"cgroup {cgroup}: cannot enforce on the engine's cgroup {cgroup}: this agent pins "
                             f"with sched_setaffinity ({parts.enforcer.reason}); that needs a cgroup v2 cpuset")
    try:
        # First: a path that is not an engine's (the agent's own tree) is a 400, whoever asks.
        # Pinned inside it: the cgroup's own cpuset, which the agent never writes, bounds the task.
        cpus, mems = engines.engine_grant(cgroup, own=True) if body.pinned else engines.engine_grant(cgroup)
        if body.cgroup is None and not caller.is_root:
            parts.check_own_cgroup(cgroup, caller)
    except EnforcementError as exc:
        raise InvalidRequest(f"cgroup {cgroup}: {exc}") from None
    _check_engine_clash(parts, cgroup, pinned=body.pinned)
    granted = cpus & parts.machine.usable_cpus
    if req.within_cpus is not None:  # the caller's own bound narrows the engine's grant
        granted = granted & req.within_cpus
    return with_engine_grant(req, cgroup, granted, mems.nodes(), granted_by=cgroup if body.pinned else None)


def _check_runtime(state: AgentState, body: AdmitRequest, caller: Caller) -> None:
    """A container its runtime enforces is root's to book (the NRI plugin runs in
    the agent), and a pod holds such containers only or none (its cgroup is the
    agent's to make, or the runtime's). Both of its ids are given: the HTTP API's
    checks are not the NRI handler's, which asks in-process."""
    if body.runtime is not None and not caller.is_root:
        raise NotPermitted("only root may book a container its runtime enforces (the NRI plugin runs in the agent)")
    if body.runtime is not None and (what := empty_runtime_id(body.runtime)) is not None:
        raise InvalidInput(f"runtime.{what} is empty", details={"field": f"runtime.{what}"})
    pod = state.pod(body.pod) if body.pod is not None else None
    if pod is not None and runtime_enforced(state, pod) != (body.runtime is not None):
        raise InvalidRequest(f"pod {pod.name} holds containers " + (
            "their runtime enforces; a workload the agent enforces cannot join it" if body.runtime is None
            else "the agent enforces; a container its runtime enforces cannot join it"))


def _unrevoked(state: AgentState, w: Workload) -> AgentState:
    """`state` without the revocations of `w`'s process: a process released while it
    ran that asks anew is the new workload's now (its release no longer stands), so
    nothing hands it back to the pool, and nothing keeps it from being rebuilt under
    its new name. O(revocations), which are few: one per released live process."""
    if w.pid is None or not state.revoked:
        return state
    return state.with_revoked(tuple(r for r in state.revoked if not r.covers_process(w.pid, w.pid_identity)))


def _pinned(w: Workload, body: AdmitRequest) -> Workload:
    """`w` pinned inside the engine cgroup it was booked in (body.pinned): the agent
    follows and pins its process there, and never writes that cgroup."""
    if not body.pinned or w.cgroup is None:
        return w
    return msgspec.structs.replace(w, pinned_in=w.cgroup, cgroup=None)


def _with_runtime(w: Workload, body: AdmitRequest) -> Workload:
    """`w` as a container its runtime enforces: no process the agent follows
    (the one that asked is the agent's own), the runtime's reference kept."""
    if body.runtime is None:
        return w
    return msgspec.structs.replace(w, runtime=body.runtime, pid=None, pid_identity=None)


def _generate_name(state: AgentState, body: AdmitRequest, caller: Caller) -> str:
    command = body.command or ["workload"]
    base = re.sub(r"[^a-z0-9]+", "-", os.path.basename(str(command[0])).lower()).strip("-") or "workload"
    base = base[:40]
    name = f"{base}-{caller.pid}"
    n = 1
    while state.workload(name) is not None:
        n += 1
        name = f"{base}-{caller.pid}-{n}"
    return name


class _NameTaken(InvalidRequest):
    pass


def _merged_text(explanation: Mapping[str, Any]) -> str:
    """The merged hint as the hints are written ("{0} preferred"), "none" without a merge."""
    merged = explanation.get("merged")
    return str(TopologyHint.from_json(merged)) if merged else "none"


def _hints_text(explanation: Mapping[str, Any]) -> str:
    parts = []
    for p in explanation.get("providers", ()):
        parts.append(f"{p.get('provider')}/{p.get('resource')}: {', '.join(map(str, p.get('hints', [])))}"
                     + (f" (+{p['more']} more)" if p.get("more") else ""))
    return "; ".join(parts) or "none"
