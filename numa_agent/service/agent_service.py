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
import threading
import time
from typing import Any, Callable, Mapping

from numa_agent.admission.machine import Machine
from numa_agent.admission.quota import NO_QUOTAS, Quotas
from numa_agent.core.caller import Caller
from numa_agent.discovery.pci_ids import PciNameSource
from numa_agent.enforcement.plan import CgroupLayout, engine_held, workload_relpath
from numa_agent.enforcement.protocol import Enforcer, Layout
from numa_agent.hotplug.rebase import memory_changes, rebase_state
from numa_agent.isolation.keeper import IsolationKeeper
from numa_agent.observe.observer import Observer
from numa_agent.service.caller import Owners, UserNames, system_owner, system_user_name
from numa_agent.service.cases import admit as admit_case
from numa_agent.service.cases import release as release_case
from numa_agent.service.cases import resize as resize_case
from numa_agent.service.commit import CommitUnit, Pending, StatePublisher, check_alive
from numa_agent.service.counters import Counters
from numa_agent.service.hugepage_counters import CounterReader
from numa_agent.service.read_side import VERSION as VERSION  # (re-exported: the info series)
from numa_agent.service.read_side import ReadSide
from numa_agent.service.refusals import NotPermitted, Unavailable
from numa_agent.service.requests import AdmitRequest
from numa_agent.service.revocation_copy import RevocationCopy
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
                 observer: Observer | None = None) -> None:
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
        self.observer: Observer | None = observer
        # Reads the kernel's free hugepages for an admission asking for some
        # (service/hugepage_counters.py); None: the bookings alone decide.
        self.hugepage_counters: CounterReader | None = hugepage_counters
        # What the adapters beside the API report of themselves in health and status, by key
        # (the NRI plugin's connection: "nri"); added by the assembly as they are made.
        self.edge_reports: dict[str, Callable[[], dict]] = {}

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

    # ---- the use cases (service/cases/) -----------------------------------------
    def admit(self, request: AdmitRequest, caller: Caller, dry_run: bool = False) -> dict:
        """Admit `request` for `caller` (service/cases/admit.py)."""
        return admit_case.admit(self, request, caller, dry_run)

    def _indexed(self, index: dict[str, str], engines: list[str], admitted: Workload | None = None,
                 released: Workload | None = None) -> None:
        """The request ids and engine cgroups kept in step with the state just staged."""
        if admitted is not None:
            if admitted.request.get("request_id") is not None:
                index[str(admitted.request["request_id"])] = admitted.name
            if (held := engine_held(admitted)) is not None:
                bisect.insort(engines, held)
        if released is not None:
            index.pop(str(released.request.get("request_id")), None)
            if (held := engine_held(released)) is not None and held in engines:
                engines.remove(held)
        self._request_index_state = self._engine_index_state = self.state

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

    def stage(self, new_state: AgentState, released: Workload | None = None, *,
              admitted: Workload | None = None, move: tuple[str, int] | None = None,
              caller: Caller | None = None) -> Pending:
        index, engines = self._request_index(), self._engine_index()
        pending = self._unit.stage(new_state, move=move, caller=caller)
        if released is not None or admitted is not None:
            self._indexed(index, engines, admitted=admitted, released=released)
        return pending

    def apply(self, pending: Pending) -> None:
        self._unit.apply(pending)

    def wait_written(self, relpath: str) -> bool:
        return self._unit.wait_written(relpath)

    def admission_view(self, state: AgentState, w: Workload, explanation: Mapping[str, Any],
                       dry_run: bool) -> dict:
        return self._admission_view(state, w, explanation, dry_run)

    def request_index(self) -> Mapping[str, str]:
        return self._request_index()

    def engine_index(self) -> list[str]:
        return self._engine_index()

    def rejoin(self, w: Workload, caller: Caller) -> None:
        # The agent may have stopped between the checkpoint and the move.
        check_alive(caller)
        if w.runtime is not None:
            return  # its runtime enforces it: nothing of the agent's to join
        if w.cgroup is None:
            self.enforcer.apply(self._layout, self._layout, (workload_relpath(w), caller.pid))
        else:
            # The engine may have made its cgroup again meanwhile (a container
            # restarted before its exit was seen): take it over once more.
            rel, layout = workload_relpath(w), self._layout
            base = layout if isinstance(layout, CgroupLayout) else CgroupLayout(layout)
            self.enforcer.apply(base.updated({}, [rel]), layout, None, changed={rel})

    def check_own_cgroup(self, cgroup: str, caller: Caller) -> None:
        _check_root_owned(self.enforcer.path_of(cgroup), cgroup)
        _check_owns_cgroup(self.enforcer.subtree_pids(cgroup), caller, cgroup)

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
            self._engine_paths = sorted(held for w in state.workloads if (held := engine_held(w)) is not None)
            self._engine_index_state = state
        return self._engine_paths


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
