"""AgentService: the one owner of the state.

Every admission and release is decided and checkpointed under one lock, then
enforced without it (service/commit.py: a stalled kernel write holds up only
the changes that depend on it), then acknowledged:
decide (pure) -> checkpoint the new state -> enforce -> acknowledge. If
enforcement fails, the change is taken back by a new one committed the same
way, so nothing is half-booked. Readers (status, metrics) get immutable
snapshots and never wait for a long admission.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping

import msgspec

from numa_agent.admission.admit import (
    InvalidRequest,
    Refusal,
    Request,
    alignment_guaranteed,
    decide,
    effective_cpus,
)
from numa_agent.admission.machine import Machine
from numa_agent.admission.quota import NO_QUOTAS, Quotas, check_quota
from numa_agent.admission.quota import REASON_CODE as QUOTA_EXCEEDED
from numa_agent.core.caller import Caller
from numa_agent.core.hints import TopologyHint
from numa_agent.core.names import NAME_RULE, engine_name_refusal, is_workload_name
from numa_agent.discovery.pci_ids import PciNameSource
from numa_agent.enforcement.errors import EnforcementError
from numa_agent.enforcement.plan import (
    CgroupLayout,
    engine_clash,
    workload_relpath,
)
from numa_agent.enforcement.protocol import Enforcer, Layout, engines_of
from numa_agent.hotplug.rebase import memory_changes, rebase_state
from numa_agent.isolation.keeper import ISOLATE, STRICT, IsolationKeeper, isolation_asked
from numa_agent.service.caller import Owners, UserNames, system_owner, system_user_name
from numa_agent.service.cases import release as release_case
from numa_agent.service.cases import resize as resize_case
from numa_agent.service.cases.refusal import refused
from numa_agent.service.commit import CommitUnit, Pending, StatePublisher, check_alive
from numa_agent.service.counters import Counters, ManagerOutcome
from numa_agent.service.hugepage_counters import CounterReader, counters_for
from numa_agent.service.read_side import VERSION as VERSION  # (re-exported: the info series)
from numa_agent.service.read_side import ReadSide
from numa_agent.service.refusals import (
    InConflict,
    InvalidInput,
    NoCapacity,
    NotPermitted,
    RequestIdTaken,
    Unavailable,
)
from numa_agent.service.requests import AdmitRequest, to_admission_request, with_engine_grant
from numa_agent.service.revocation_copy import RevocationCopy
from numa_agent.state.checkpoint import describe_oserror
from numa_agent.state.model import AgentState, Workload

log = logging.getLogger("numa_agent.service")



class AgentService(ReadSide):
    def __init__(self, machine: Machine, store, enforcer: Enforcer, *,
                 clock: Callable[[], float] = time.time,
                 topology_json: Callable[[], dict] | None = None,
                 isolation: IsolationKeeper | None = None, isolate_default: tuple[str, ...] = (),
                 isolate_gid: int | None = None, mark_key: bytes | None = None,
                 pci_names: PciNameSource | None = None,
                 user_name: UserNames = system_user_name, quotas: Quotas = NO_QUOTAS,
                 owner: Owners = system_owner, state_publisher: StatePublisher | None = None,
                 revocation_copy: RevocationCopy | None = None,
                 hugepage_counters: CounterReader | None = None, sysfs_root: str = "/",
                 observer: Any = None) -> None:
        # Where the machine was discovered ("/": this host; else a captured sysfs tree or
        # archive it simulates), so `numa-agent topology` can say which machine it shows.
        self.sysfs_root = sysfs_root
        # [quotas]: what each owner may hold; `owner` says who a uid is (its name
        # and groups), asked outside the lock: the user database may be remote.
        self.quotas = quotas
        self.owner = owner
        # Vendor, device and class names of /v1/topology's devices (None: ids only).
        self.pci_names = pci_names
        # Owners by name in status (a lookup: asked outside the lock, once per uid and view).
        self.user_name = user_name
        # Signs the mark numa-run gives a workload (numa_agent.core.mark); None: no mark issued.
        self.mark_key = mark_key
        # Interrupts, idle states and frequency of isolating workloads' CPUs (None: never touched).
        self.isolation = isolation
        self.isolate_default = isolate_default
        # Who besides root may ask for --isolate (a group id; None: root only): it
        # changes machine-wide settings (every interrupt's affinity, a whole
        # cpufreq policy), which the kernel lets only root change.
        self.isolate_gid = isolate_gid
        self.store = store
        self.enforcer = enforcer
        self.clock = clock
        self._topology_json = topology_json
        self.counters = Counters()
        self.started = clock()
        self._lock = threading.RLock()
        # The state, its layout and the checkpoint. `state_publisher` is told every
        # new state (the kubelet-shaped state files, kubelet/files.py; None: nobody);
        # `revocation_copy` is the revocations' copy beside the mark key (None: none kept).
        self._unit = CommitUnit(machine, store, enforcer, self._lock, counters=self.counters, clock=clock,
                                isolation=isolation, state_publisher=state_publisher,
                                revocation_copy=revocation_copy)
        # Intruders and memory locality (numa_agent.observe); None: status shows neither.
        self.observer: Any = observer
        # Reads the kernel's free hugepages for an admission asking for some
        # (service/hugepage_counters.py); None: the bookings alone decide.
        self.hugepage_counters: CounterReader | None = hugepage_counters

    @property
    def machine(self) -> Machine:
        return self._unit.machine

    @property
    def state(self) -> AgentState:
        """The state that stands (replaced whole: read without the lock)."""
        return self._unit.state

    @property
    def state_publisher(self) -> StatePublisher | None:
        return self._unit.state_publisher

    @state_publisher.setter
    def state_publisher(self, publisher: StatePublisher | None) -> None:
        self._unit.state_publisher = publisher

    @property
    def revocation_copy(self) -> RevocationCopy | None:
        return self._unit.revocation_copy

    @property
    def _checkpoint_trouble(self) -> tuple[str, float] | None:
        return self._unit.checkpoint_trouble

    @property
    def _layout(self) -> Layout:
        return self._unit.layout

    def reconfigure(self, **settings: Any) -> None:
        """Settings a reload (SIGHUP) changes while the agent runs: `quotas`,
        `isolate_default`, `isolate_gid`. Set under the lock, so that an
        admission is judged under the old ones or the new ones, never a mix."""
        unknown = set(settings) - {"quotas", "isolate_default", "isolate_gid"}
        if unknown:
            raise TypeError(f"not reconfigurable while running: {', '.join(sorted(unknown))}")
        with self._lock:
            for name, value in settings.items():
                setattr(self, name, value)

    @property
    def layout(self) -> Layout:
        """The cgroup layout of the state that stands (read without the lock:
        replaced whole); its writes may still be under way."""
        return self._unit.layout

    # ---- admission ---------------------------------------------------------
    def admit(self, request: AdmitRequest, caller: Caller, dry_run: bool = False) -> dict:
        started = time.perf_counter()
        owner = self.owner(caller.uid) if self.quotas else None
        kernel = counters_for(self.hugepage_counters, self.machine, request,  # sysfs: outside the lock
                              self.state, self.enforcer.path_of)
        with self._lock:
            request_id = None if dry_run else request.request_id
            if request_id is not None:
                replayed = self._replay(request_id, caller)
                if replayed is not None:
                    return replayed
            deciding = time.perf_counter()
            try:
                req = self._request_from(request, caller)
                req = self._on_engine_cgroup(req, request, caller)
                deciding = time.perf_counter()
                # A dry run (numa-run --dry-run, numa-agent explain) shows every provider's
                # hints and what was free; an admission's answer and log line do without.
                decision = decide(self.machine, self.state, req, explain=dry_run, kernel=kernel)
                if owner is not None:
                    check_quota(self.quotas, owner, self.state, decision.state, decision.explanation)
            except OSError as exc:  # a file the decision needs (the caller's cgroup...): descriptors out
                raise Unavailable(f"cannot decide the admission, nothing was booked: {describe_oserror(exc)}") \
                    from None
            except _NameTaken as exc:
                self.counters.refused("name_in_use", time.perf_counter() - started)
                raise InConflict(f"a workload named {exc.args[0]!r} already exists; choose another --name") from None
            except InvalidRequest as exc:
                self.counters.refused("bad_request", time.perf_counter() - started)
                raise InvalidInput(str(exc)) from None
            except Refusal as exc:
                # forbidden: no manager was asked; over a quota: refused after the managers
                # decided, as the kubelet's never see a pod its namespace's quota refused.
                if exc.code not in ("forbidden", QUOTA_EXCEEDED) and not dry_run:
                    outcome = self._manager_outcome(request, exc.explanation, exc.pinned, exc.provider,
                                                    merge_refused=exc.provider is None)
                    self.counters.decided(outcome, time.perf_counter() - deciding)
                self.counters.refused(exc.code, time.perf_counter() - started)
                log.warning("refused %s for uid %d pid %d: %s | hints: %s | merged: %s",
                            request.name or "(unnamed)", caller.uid, caller.pid, exc.message,
                            _hints_text(exc.explanation), _merged_text(exc.explanation))
                if exc.code == "forbidden":
                    raise NotPermitted(exc.message) from None
                raise refused(exc) from None
            if not dry_run:
                outcome = self._manager_outcome(request, decision.explanation, decision.pinned, None,
                                                merge_refused=False)
                self.counters.decided(outcome, time.perf_counter() - deciding)
            w = decision.workload
            w = self._with_isolation(w, request, caller, started)
            decision_state = decision.state if w is decision.workload else decision.state.with_workload(w)
            self._check_strict(decision_state, w, started)
            if dry_run:
                self.counters.dry_run(time.perf_counter() - started)
                return self._admission_view(decision_state, w, decision.explanation, dry_run=True)

            new_state = decision_state
            if request_id is not None:
                # Checkpointed with the workload, so a retry after a restart finds it.
                w = msgspec.structs.replace(w, request={**w.request, "request_id": request_id})
                new_state = new_state.with_workload(w)
            index, engines = self._request_index(), self._engine_index()
            # On an engine's cgroup the processes are already where they belong.
            move = None if w.cgroup is not None else (workload_relpath(w), caller.pid)
            pending = self._unit.stage(new_state, move=move, caller=caller)
            self._indexed(index, engines, admitted=w)
        self._unit.apply(pending)  # the kernel writes: without the lock
        self._refuse_if_not_isolated(w, started)
        self.counters.admitted(time.perf_counter() - started, decision.explanation.get("alignment", {}))
        log.info("admitted %s for uid %d pid %d: cpus %s mems %s devices %s | merged: %s",
                 w.name, caller.uid, caller.pid, effective_cpus(self.machine, new_state, w).format(),
                 ",".join(map(str, w.booking.mems)), ",".join(w.booking.device_addresses()) or "-",
                 _merged_text(decision.explanation))
        return self._admission_view(new_state, w, decision.explanation, dry_run=False)

    def _indexed(self, index: dict[str, str], engines: list[str], admitted: Workload | None = None,
                 released: Workload | None = None) -> None:
        """The request ids and engine cgroups kept in step with the state just staged."""
        if admitted is not None:
            if admitted.request.get("request_id") is not None:
                index[str(admitted.request["request_id"])] = admitted.name
            if admitted.cgroup is not None:
                bisect.insort(engines, admitted.cgroup)
        if released is not None:
            index.pop(str(released.request.get("request_id")), None)
            if released.cgroup is not None and released.cgroup in engines:
                engines.remove(released.cgroup)
        self._request_index_state = self._engine_index_state = self.state

    def _manager_outcome(self, body: AdmitRequest, explanation: Mapping[str, Any], pinned: frozenset[str],
                         failed: str | None, merge_refused: bool) -> ManagerOutcome:
        """A decided admission (refused by the provider `failed`, or by the merge) as the
        kubelet's managers count it."""
        return ManagerOutcome(pinned=pinned, failed=failed, merge_refused=merge_refused,
                              guaranteed=alignment_guaranteed(explanation),
                              scope="pod" if body.pod else "container",
                              full_pcpus_only=self.machine.cpu_options.full_pcpus_only)

    def release(self, name: str, caller: Caller | None, reason: str = "requested",
                request_id: str | None = None) -> dict:
        """Release `name` (service/cases/release.py)."""
        return release_case.release(self, name, caller, reason, request_id)

    def resize(self, name: str, caller: Caller, cpus: int | None = None,
               memory_bytes: int | None = None) -> dict:
        """Grow or shrink `name` in place (service/cases/resize.py)."""
        return resize_case.resize(self, name, caller, cpus=cpus, memory_bytes=memory_bytes)

    # ---- the parts the use cases are given (service/cases/ports.py) -----------------
    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def stage(self, new_state: AgentState, released: Workload | None = None) -> Pending:
        index, engines = self._request_index(), self._engine_index()
        pending = self._unit.stage(new_state)
        if released is not None:
            self._indexed(index, engines, released=released)
        return pending

    def apply(self, pending: Pending) -> None:
        self._unit.apply(pending)

    def wait_written(self, relpath: str) -> bool:
        return self._unit.wait_written(relpath)

    def admission_view(self, state: AgentState, w: Workload, explanation: Mapping[str, Any],
                       dry_run: bool) -> dict:
        return self._admission_view(state, w, explanation, dry_run)

    def isolation_pending(self) -> bool:
        """A restore failed and waits for its retry, or irqbalance restarted and is to be told again."""
        return self.isolation is not None and (bool(self.isolation.restore_failures())
                                               or self.isolation.lost(self.state))

    def isolation_watched(self) -> bool:
        """Isolation may hold a setting in a daemon that can restart and forget it
        (irqbalance): the event loop wakes to look. Asked before the loop waits, so
        true whenever it could hold one, not only while it does (an admission made
        while the loop waits would not wake it)."""
        return self.isolation is not None and self.isolation.files.daemons

    def retry_isolation(self) -> None:
        with self._lock:
            self._unit.isolate()

    def view(self) -> tuple[Machine, AgentState] | None:
        """(machine, state) as last published, one value read in one step by
        readers on other threads (the PodResources server) without the lock."""
        return self._unit.view()

    # ---- lifecycle -------------------------------------------------------------------
    def install(self, state: AgentState) -> None:
        """Adopt a restored state: checkpoint it whole, then make the kernel match."""
        with self._lock:
            self._unit.install(state)

    def replace_machine(self, machine: Machine) -> list[tuple[str, str]]:
        """The hardware changed: fit the bookings to the new machine and
        correct the cgroups, all at once once no change is being applied.
        Returns (workload, what it lost) pairs."""
        unit = self._unit
        while True:
            unit.drain()
            with self._lock:
                if unit.applying():
                    continue  # a change was staged meanwhile
                new_state, lost = rebase_state(machine, self.state)
                old_machine, unit.machine = unit.machine, machine
                try:
                    unit.commit_whole(new_state)
                except Unavailable:
                    # The machine and its rebased state are taken on together or not at all.
                    unit.machine = old_machine
                    raise
                for name, what in lost:
                    log.warning("hotplug: workload %s lost %s", name, what)
                for level, message in memory_changes(old_machine, machine, self.state):
                    log.log(logging.WARNING if level == "warning" else logging.INFO, "hotplug: %s", message)
                return lost

    # ---- requests ----------------------------------------------------------------
    # request_id -> workload name, for `_request_index_state` (the state it was
    # built from); admit and release keep it in step, anything else that
    # replaces the state (install, hotplug, recovery) makes the next use rebuild it.
    _request_index_state: AgentState | None = None
    _request_ids: dict[str, str]

    def _request_index(self) -> dict[str, str]:
        state = self.state
        if self._request_index_state is not state:
            self._request_ids = {str(w.request["request_id"]): w.name for w in state.workloads
                                 if w.request.get("request_id")}
            self._request_index_state = state
        return self._request_ids

    # The engine cgroups booked, sorted, for `_engine_index_state`: kept in
    # step like the request ids, so that a clash is found by bisection.
    _engine_index_state: AgentState | None = None
    _engine_paths: list[str]

    def _engine_index(self) -> list[str]:
        state = self.state
        if self._engine_index_state is not state:
            self._engine_paths = sorted(w.cgroup for w in state.workloads if w.cgroup is not None)
            self._engine_index_state = state
        return self._engine_paths

    def _check_engine_clash(self, cgroup: str) -> None:
        """One workload per engine cgroup, and none in or around another's: a
        cpuset or limit written on a cgroup governs its whole subtree, so an
        exclusive workload below another would run on the outer one's CPUs."""
        clash = engine_clash(self._engine_index(), cgroup)
        if clash is None:
            return
        spec = self._layout.get(clash)
        holder = spec.workload if spec is not None else None
        where = "already holds" if clash == cgroup else \
            ("lies below" if cgroup.startswith(clash + "/") else "lies above") + f" cgroup {clash}, which holds"
        raise InConflict(f"cgroup {cgroup} {where} workload {holder or '(unknown)'}; one engine cgroup "
                         "takes one workload, and none nests in another's")

    def _replay(self, request_id: str, caller: Caller) -> dict | None:
        """The admission already made under `request_id` (its answer was lost:
        the client retried after a restart or a dropped connection), or None."""
        name = self._request_index().get(request_id)
        w = self.state.workload(name) if name is not None else None
        if w is None or w.request.get("request_id") != request_id:
            return None
        # A named engine cgroup's pid is the hook's that asked first: each hook run
        # is a new process (a container restarted before its exit was seen asks again).
        any_pid = w.cgroup is not None and caller.is_root
        if w.owner_uid != caller.uid or (w.pid is not None and w.pid != caller.pid and not any_pid):
            raise RequestIdTaken(f"request id {request_id} belongs to another admission "
                                 "(another user or process); send a new random one")
        try:
            # The agent may have stopped between the checkpoint and the move.
            check_alive(caller)
            if w.cgroup is None:
                self.enforcer.apply(self._layout, self._layout, (workload_relpath(w), caller.pid))
            else:
                # The engine may have made its cgroup again meanwhile (a container
                # restarted before its exit was seen): take it over once more.
                rel, layout = workload_relpath(w), self._layout
                base = layout if isinstance(layout, CgroupLayout) else CgroupLayout(layout)
                self.enforcer.apply(base.updated({}, [rel]), layout, None, changed={rel})
        except (EnforcementError, OSError, ProcessLookupError) as exc:
            raise Unavailable(f"workload {w.name} is booked but the process could not be "
                              f"moved into it: {exc}") from None
        log.info("replayed the admission of %s for uid %d pid %d (request id %s)",
                 w.name, caller.uid, caller.pid, request_id)
        view = self._admission_view(self.state, w, {}, dry_run=False)
        view["replayed"] = True
        return view

    # ---- isolation ------------------------------------------------------------------
    def _with_isolation(self, w: Workload, body: AdmitRequest, caller: Caller, started: float) -> Workload:
        """`w` with the isolation it asked for (or the configured default) in its request."""
        if body.isolate and not (caller.is_root or (self.isolate_gid is not None and
                                                    caller.in_group(self.isolate_gid))):
            self.counters.refused("forbidden", time.perf_counter() - started)
            raise NotPermitted("--isolate changes machine-wide settings (interrupt affinities, idle states, "
                               "CPU frequency): only root may ask for it, or the members of the group the "
                               "agent's [isolation] group names")
        kinds = tuple(body.isolate) if body.isolate is not None else self.isolate_default
        if not kinds or (w.shared and body.isolate is None):
            return w
        if w.shared:
            raise InvalidInput("--isolate needs exclusive CPUs (--cpus or --physcpubind); a shared "
                               "workload runs on CPUs others use too", details={"field": "isolate"})
        extra: dict[str, Any] = {ISOLATE: list(kinds)}
        if body.isolate_strict:
            extra[STRICT] = True
        return msgspec.structs.replace(w, request={**w.request, **extra})

    def _check_strict(self, state: AgentState, w: Workload, started: float) -> None:
        """--isolate-strict asking for what this machine lacks: refused before anything is booked."""
        if not w.request.get(STRICT):
            return
        missing = self.isolation.missing(state, w.name) if self.isolation is not None \
            else tuple(f"{k}: not available in this agent" for k in isolation_asked(w))
        if missing:
            self._refuse_isolation(w, missing, started)

    def _refuse_if_not_isolated(self, w: Workload, started: float) -> None:
        """--isolate-strict and a write failed: released again (the knobs restored), refused."""
        if not w.request.get(STRICT) or self.isolation is None:
            return
        report = self.isolation.report(w)
        if report is not None and report.failed():
            self.release(w.name, None, reason="--isolate-strict could not isolate it")
            self._refuse_isolation(w, report.failed(), started)

    def _refuse_isolation(self, w: Workload, failed: tuple[str, ...], started: float) -> None:
        self.counters.refused("isolation_unavailable", time.perf_counter() - started)
        message = f"--isolate-strict: cannot isolate {w.name}: {'; '.join(failed)}"
        log.warning("refused %s: %s", w.name, message)
        raise NoCapacity(message, details={"admit": False, "reason": message,
                                           "reason_code": "isolation_unavailable",
                                           "isolation": list(failed)})

    def _request_from(self, body: AdmitRequest, caller: Caller) -> Request:
        name = body.name or self._generate_name(body, caller)
        for key, value in (("name", name), ("pod", body.pod)):
            if value is not None and not is_workload_name(value):
                raise InvalidRequest(f"{key} {value!r} must be {NAME_RULE}")
        for value in (name, body.pod):
            if value is not None and (refusal := engine_name_refusal(value, caller.uid)) is not None:
                raise Refusal("forbidden", refusal)
        if self.state.workload(name) is not None:
            raise _NameTaken(name)
        return to_admission_request(body, caller, name=name, created_unix=self.clock())

    def _on_engine_cgroup(self, req: Request, body: AdmitRequest, caller: Caller) -> Request:
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
        engines = engines_of(self.enforcer)
        if cgroup is None:
            cgroup = None if engines is None else engines.cgroup_of(caller.pid)
            if cgroup is None or cgroup.count("/") < 2:
                raise InvalidRequest(f"in_place: pid {caller.pid} is in cgroup {cgroup or '(none)'}, "
                                     "not below an engine's cgroup")
        if engines is None:
            raise InvalidRequest(f"cgroup {cgroup}: cannot enforce on the engine's cgroup {cgroup}: this agent pins "
                                 f"with sched_setaffinity ({self.enforcer.reason}); that needs a cgroup v2 cpuset")
        try:
            # First: a path that is not an engine's (the agent's own tree) is a 400, whoever asks.
            cpus, mems = engines.engine_grant(cgroup)
            if body.cgroup is None and not caller.is_root:
                _check_root_owned(self.enforcer.path_of(cgroup), cgroup)
                _check_owns_cgroup(self.enforcer.subtree_pids(cgroup), caller, cgroup)
        except EnforcementError as exc:
            raise InvalidRequest(f"cgroup {cgroup}: {exc}") from None
        self._check_engine_clash(cgroup)
        granted = cpus & self.machine.usable_cpus
        if req.within_cpus is not None:  # the caller's own bound narrows the engine's grant
            granted = granted & req.within_cpus
        return with_engine_grant(req, cgroup, granted, mems.nodes())

    def _generate_name(self, body: AdmitRequest, caller: Caller) -> str:
        command = body.command or ["workload"]
        base = re.sub(r"[^a-z0-9]+", "-", os.path.basename(str(command[0])).lower()).strip("-") or "workload"
        base = base[:40]
        name = f"{base}-{caller.pid}"
        n = 1
        while self.state.workload(name) is not None:
            n += 1
            name = f"{base}-{caller.pid}-{n}"
        return name

class _NameTaken(InvalidRequest):
    pass


def _check_root_owned(path: str | None, cgroup: str) -> None:
    """A cgroup delegated to a user (owned by it) could carry a booking record of
    the user's own making, so start-up trusts none there after a lost checkpoint:
    a booking on it would not survive one. Refused up front instead."""
    try:
        owner = os.stat(path).st_uid if path is not None else 0
    except FileNotFoundError:
        return  # gone: the grant's read already said so, or the take-over will
    if owner != 0:
        raise NotPermitted(f"cgroup {cgroup} is delegated to uid {owner}; in_place is for cgroups root "
                           "made for the caller (a Slurm task's), whose booking record survives a lost "
                           "checkpoint")


def _check_owns_cgroup(pids: list[int], caller: Caller, cgroup: str) -> None:
    """A caller other than root may have its own cgroup enforced only when every
    process in it, and below it, is its own: it cannot pin somebody else's."""
    for pid in pids:
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            continue  # exited meanwhile
        if uid != caller.uid:
            raise NotPermitted(f"cgroup {cgroup} holds pid {pid} of uid {uid}; only root, or the owner "
                               "of every process in it, may have it enforced")


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
