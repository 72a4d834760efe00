"""The read side of the service: status, health, the workload views, the
topology and what the metrics read. Every view is built from one immutable
state read in one step (no lock but the metrics' short one), and files
(the observer's) and the user database are read outside the lock. It never
writes: nothing here imports the commit unit (tests/test_import_graph.py).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

import msgspec

from numa_agent import __version__
from numa_agent.admission.accounting import node_accounting
from numa_agent.admission.admit import alignment, effective_cpus, pod_shared_cpus, shared_pool
from numa_agent.admission.machine import Machine
from numa_agent.admission.quota import Owner, Quotas, owner_usage, quota_view
from numa_agent.core.mark import issue_mark, start_time_of
from numa_agent.core.pci import NO_NAMES
from numa_agent.discovery.pci_ids import PciNameSource
from numa_agent.enforcement.plan import workload_relpath
from numa_agent.enforcement.protocol import Enforcer
from numa_agent.isolation.keeper import STRICT, IsolationKeeper, isolation_asked
from numa_agent.service.caller import Owners, UserNames
from numa_agent.service.counters import Counters
from numa_agent.service.revocations import released_views
from numa_agent.service.tally import workload_tally
from numa_agent.state.model import REBUILT, AgentState, Workload
from numa_agent.state.runtime_pods import runtime_pods

VERSION = __version__


class ReadSide:
    """The views, over what the assembled service holds (AgentService)."""

    enforcer: Enforcer
    isolation: IsolationKeeper | None
    observer: Any
    quotas: Quotas
    owner: Owners
    user_name: UserNames
    counters: Counters
    store: Any
    clock: Callable[[], float]
    started: float
    sysfs_root: str
    edge_reports: dict[str, Callable[[], dict]]
    pci_names: PciNameSource | None
    mark_key: bytes | None
    _topology_json: Callable[[], dict] | None
    _lock: threading.RLock

    @property
    def machine(self) -> Machine:
        raise NotImplementedError

    @property
    def state(self) -> AgentState:
        raise NotImplementedError

    @property
    def _checkpoint_trouble(self) -> tuple[str, float] | None:
        raise NotImplementedError

    def view(self) -> tuple[Machine, AgentState] | None:
        raise NotImplementedError

    def shown(self) -> AgentState:
        """The state as last published, the one every view shows: a change is
        shown once its cgroups are written, as the kubelet's files and
        PodResources show it (the state decisions start from may hold changes
        still being written: service/commit.py)."""
        view = self.view()
        return view[1] if view is not None else self.state

    def _isolation_view(self, w: Workload) -> dict[str, Any] | None:
        asked = isolation_asked(w)
        if not asked:
            return None
        report = self.isolation.report(w) if self.isolation is not None else None
        return {"asked": list(asked), "strict": bool(w.request.get(STRICT)),
                "done": list(report.done) if report else [],
                "not_done": list(report.not_done) if report else
                [f"{k}: not available in this agent" for k in asked]}


    def _admission_view(self, state: AgentState, w: Workload, explanation, dry_run: bool) -> dict:
        view = self._workload_view(state, w)
        if dry_run and view.get("isolation"):
            view["isolation"].update(done=[], not_done=list(self.isolation.missing(state, w.name))
                                     if self.isolation is not None else view["isolation"]["not_done"])
        view.update({
            "cgroup": None if dry_run or w.runtime is not None else
            self.enforcer.path_of(w.pinned_in or workload_relpath(w)),
            # Pinned inside a cgroup it shares: its affinity holds the booking, and the
            # launcher binds its own memory, as under the affinity fallback.
            "enforcement": "affinity" if w.pinned_in is not None and self.enforcer.mode == "cgroup"
            else self.enforcer.mode,
            "explanation": dict(explanation), "dry_run": dry_run,
            "mark": None if dry_run else self._mark(w),
        })
        return view

    def _mark(self, w: Workload) -> str | None:
        """The token proving the agent admitted `w` for its own process: the
        same for a replay (it depends only on name, pid and start time)."""
        start_time = start_time_of(w.pid_identity)
        if self.mark_key is None or w.pid is None or start_time is None:
            return None
        return issue_mark(self.mark_key, w.name, w.pid, start_time)

    def _workload_view(self, state: AgentState, w: Workload, viewer_uid: int | None = None) -> dict:
        """`viewer_uid`: who asks (None: the agent itself). A command line can
        carry secrets, so only root and the owner see it."""
        topo = self.machine.topology
        devices = []
        for resource, addr in w.booking.devices:
            d = topo.device(addr)
            devices.append({"resource": resource, "address": addr, "numa_node": d.numa_node,
                            "vendor": d.vendor, "device": d.device})
        hugepages: dict[str, dict[str, int]] = {}
        memory: dict[str, int] = {}
        for node, per in sorted(w.booking.memory.items()):
            for resource, amount in per.items():
                if resource == "memory":
                    memory[str(node)] = amount
                else:
                    hugepages.setdefault(resource[len("hugepages-"):], {})[str(node)] = amount
        return {
            "name": w.name, "owner_uid": w.owner_uid, "pod": w.pod, "pid": w.pid,
            "cpus": effective_cpus(self.machine, state, w).format(), "exclusive": not w.shared,
            "numa_nodes": list(w.booking.numa_nodes), "mems": list(w.booking.mems),
            "memory_bytes": memory, "memory_limit_bytes": w.request.get("memory_bytes") or None,
            "hugepages": hugepages, "devices": devices, "created_unix": w.created_unix,
            "command": list(w.command) if _may_see_command(viewer_uid, w.owner_uid) else None,
            "aligned": alignment(self.machine, w.booking),
            "lost": list(w.lost),
            # "partial" when rebuilt from its process after the checkpoint lost it
            "rebuilt": w.request.get(REBUILT),
            "unknown": list(w.request.get("unknown") or []),
            "isolation": self._isolation_view(w),
            # The engine's cgroup it is enforced on (/proc/PID/cgroup's form), None: the agent's tree.
            "engine_cgroup": w.cgroup,
            # The engine's cgroup it shares with others and is pinned inside (a Slurm step's tasks).
            "pinned_in": w.pinned_in,
            # The container its runtime enforces (NRI), None: the agent enforces it.
            "runtime": msgspec.to_builtins(w.runtime) if w.runtime is not None else None,
        }

    def list_workloads(self, viewer_uid: int | None = None) -> list[dict]:
        state = self.shown()
        views = [self._workload_view(state, w, viewer_uid) for w in state.workloads if not w.quarantined]
        self._with_owner_names(views)
        return views

    def _with_owner_names(self, views: list[dict]) -> dict[int, str | None]:
        """Each view's `owner`: its `owner_uid`'s user name, None when it has none;
        returns the names by uid."""
        names = {uid: self.user_name(uid) for uid in {v["owner_uid"] for v in views}}
        for v in views:
            v["owner"] = names[v["owner_uid"]]
        return names

    @staticmethod
    def _quarantined_views(state: AgentState) -> list[dict]:
        """CPUs held at start-up for processes that could not be attributed;
        only an operator's release hands them out."""
        return [{"name": w.name, "cpus": w.booking.cpus.format(), "pid": w.request.get("pid"),
                 "uid": w.request.get("uid"), "affinity": w.request.get("affinity"),
                 "marked": w.request.get("marked"), "reason": w.request.get("reason"),
                 "remedy": f"stop or re-pin pid {w.request.get('pid')}, then "
                           f"`numa-agent release {w.name}` as root"}
                for w in state.workloads if w.quarantined]

    def status(self, viewer_uid: int | None = None, memory: bool = False) -> dict:
        """`memory`: also read the memory per node of workloads without a
        cgroup (/proc/PID/numa_maps, costly)."""
        state = self.shown()  # one immutable snapshot for the whole view
        status = self._status(state, viewer_uid)
        names = self._with_owner_names(status["workloads"] + status["pods"])
        status["quotas"] = self._quota_views(state, names)
        status.update((key, report()) for key, report in self.edge_reports.items())
        return self._observed(state, status, memory)

    def _quota_views(self, state: AgentState, names: Mapping[int, str | None]) -> list[dict[str, Any]]:
        """Per owner holding anything, what it holds and its limits (quota.quota_view).
        The user database is asked here, outside the lock: for each owner's name and
        groups when there are quotas, else for its name unless `names` has it."""
        def owner(uid: int) -> Owner:
            if self.quotas:
                return self.owner(uid)
            return Owner(uid, names[uid] if uid in names else self.user_name(uid))

        return [quota_view(self.quotas, owner(uid), usage) for uid, usage in sorted(owner_usage(state).items())]

    def _observed(self, state: AgentState, status: dict, memory: bool = False, scrape: bool = False) -> dict:
        """Intruders and memory per node added (files read: never under the lock).
        `scrape`: a metrics scrape's, which reads no file: the workloads with a
        series, the memory figures from the observer's last sample."""
        if self.observer is None:
            status["workloads"] = [] if scrape else status["workloads"]
        elif scrape:
            self.observer.annotate_scrape(state, status)
        else:
            self.observer.annotate(state, status, memory=memory)
        return status

    def _status(self, state: AgentState, viewer_uid: int | None) -> dict:
        return {
            "enforcement": self.enforcer.mode,
            "enforcement_reason": self.enforcer.reason,
            # The options in effect, this product's defaults included, not only the file's.
            "policy": {**self.machine.policy.describe(),
                       "topology_options": self.machine.tm_options.to_mapping()},
            "reserved_cpus": self.machine.reserved_cpus.format(),
            "shared_pool": shared_pool(self.machine, state).format(),
            "nodes": node_accounting(self.machine, state),
            "workloads": [self._workload_view(state, w, viewer_uid) for w in state.workloads
                          if not w.quarantined],
            "quarantined": self._quarantined_views(state),
            "released": released_views(state),
            "pods": [{"name": p.name, "owner_uid": p.owner_uid, "cpus": p.booking.cpus.format(),
                      "numa_nodes": list(p.booking.numa_nodes), "mems": list(p.booking.mems),
                      "members": list(p.members), "shared_cpus": pod_shared_cpus(state, p).format(),
                      "budget": dict(p.request), "created_unix": p.created_unix}
                     for p in state.pods],
            "isolation": self.isolation.status(state) if self.isolation is not None else None,
        }

    def _metrics_status(self, state: AgentState) -> dict:
        """What the metrics read of status: the node figures and counts kept in
        the state's memo (O(nodes), not O(workloads)); the workloads with a
        series of their own (intruders, memory per node) are the observer's
        to list (`_observed`, scrape=True), from its memo and last sample."""
        tally = workload_tally(state)
        return {
            "enforcement": self.enforcer.mode,
            "shared_pool": shared_pool(self.machine, state).format(),
            "nodes": node_accounting(self.machine, state),
            "workload_tally": {"held": tally.held, "lost": tally.lost},
            "pod_count": len(state.pods),
            "isolation": self.isolation.status(state) if self.isolation is not None else None,
            "kubernetes_containers": _kubernetes_containers(state),
        }

    def topology(self) -> dict:
        if self._topology_json is not None:
            return self._topology_json()
        from numa_agent.views.topology_report import topology_to_json
        topology = self.machine.topology
        names = NO_NAMES if self.pci_names is None else self.pci_names.names(topology.pci_devices)
        # numa-run's "all" leaves memory-only nodes out unless this says "ordinary".
        return {**topology_to_json(topology, names),
                "memory_only_nodes": self.machine.policy.memory_only_nodes}

    def health(self) -> dict:
        state = self.shown()
        held = self._quarantined_views(state)
        out: dict[str, Any] = {"status": "ok", "enforcement": self.enforcer.mode, "reason": self.enforcer.reason,
               "uptime_seconds": round(self.clock() - self.started, 3), "version": VERSION,
               "sysfs_root": self.sysfs_root,
               "workloads": len(state.workloads) - len(held),
               "quarantined": [{"name": q["name"], "cpus": q["cpus"], "pid": q["pid"]} for q in held]}
        trouble = self._checkpoint_trouble
        out["checkpoint"] = {"healthy": trouble is None, "state_dir": str(self.store.directory),
                             "error": trouble[0] if trouble else None,
                             "failing_seconds": round(self.clock() - trouble[1], 3) if trouble else 0.0,
                             "pending_releases": self.counters.pending_releases}
        if trouble is not None:
            pending = self.counters.pending_releases
            out["status"] = "degraded"
            out["degraded_reason"] = (
                f"the checkpoint in state directory {self.store.directory} cannot be written "
                f"(for {self.clock() - trouble[1]:.0f} s): {trouble[0]}; admissions and releases are "
                f"refused until it can" + (f"; {pending} release(s) of exited workloads are retried"
                                           if pending else ""))
        if held:
            out["attention"] = ("CPUs held for processes that could not be attributed at start-up: "
                                + "; ".join(f"{q['name']} (pid {q['pid']}, CPUs {q['cpus'] or 'none'})"
                                            for q in held)
                                + "; see `numa-agent status`, then `numa-agent release NAME` as root")
        out.update((key, report()) for key, report in self.edge_reports.items())
        return out

    def metrics_snapshot(self) -> dict:
        with self._lock:
            state = self.shown()
            status, counters = self._metrics_status(state), self.counters.snapshot()
            knobs = self.isolation.knob_counts(state) if self.isolation else {}
        status["quotas"] = self._quota_views(state, {}) if self.quotas else []  # metrics: only owners with one
        return {"status": self._observed(state, status, scrape=True), "counters": counters, "isolation_knobs": knobs,
                "info": {"version": VERSION, "enforcement": self.enforcer.mode}}


def _kubernetes_containers(state: AgentState) -> list[dict[str, str]]:
    """The containers a runtime enforces, as Kubernetes names them: from the
    state's index of them (as many as there are, not every workload)."""
    out = []
    for (namespace, pod), names in sorted(runtime_pods(state).pods.items()):
        for name in names:
            w = state.workload(name)
            if w is not None and w.runtime is not None:
                out.append({"workload": name, "namespace": namespace, "pod": pod, "container": w.runtime.container})
    return out


def _may_see_command(viewer_uid: int | None, owner_uid: int) -> bool:
    return viewer_uid is None or viewer_uid == 0 or viewer_uid == owner_uid
