"""The agent's start-up: discover the machine, choose the enforcer, restore the
checkpoint, then start the edges (API, metrics, event loop, hotplug) around the
one service that owns the state. `numa-agent serve` parses flags and calls this."""

from __future__ import annotations

import errno
import functools
import importlib
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from numa_agent.daemon.mark_key import KEY_NAME, MarkKey
from numa_agent.enforcement.plan import AGENT_CGROUP
from numa_agent.enforcement.processes import parse_cgroup
from numa_agent.state.trusted_dir import UntrustedDirectory

if TYPE_CHECKING:
    from numa_agent.api.server import ApiServer
    from numa_agent.daemon.config import AgentConfig
    from numa_agent.daemon.runtime import EventLoop
    from numa_agent.enforcement.protocol import Enforcer
    from numa_agent.hotplug.events import EventSource
    from numa_agent.kubelet.files import StateFiles
    from numa_agent.kubelet.grpc_server import PodResourcesServer
    from numa_agent.nri.adapter import NriAdapter
    from numa_agent.nri.plugin import NriHandler
    from numa_agent.observe.observer import MemorySampler, Observer
    from numa_agent.observe.watcher import IntruderWatcher
    from numa_agent.service.agent_service import AgentService
    from numa_agent.service.ports import AgentApi
    from numa_agent.state.directory import StateDirClaim
    from numa_agent.state.model import AgentState
    from numa_agent.views.metrics import MetricsServer

log = logging.getLogger("numa_agent.startup")


class StartupError(Exception):
    pass


class StartupConfigError(StartupError):
    """The configuration itself is wrong (as against a misfit with the machine,
    which a restart after hotplug may cure): restarting cannot help."""


def _log_machine(machine) -> None:
    """What the agent hands out, and what its cpuset keeps from it."""
    from numa_agent.views.topology_report import restriction_text

    topology = machine.topology
    log.info("machine: %d NUMA node(s) %s, %d usable CPUs, %d reserved (%s), %d PCI devices",
             len(machine.node_ids), ",".join(map(str, machine.node_ids)), len(machine.usable_cpus),
             len(machine.reserved_cpus), machine.reserved_cpus.format() or "-",
             len(topology.pci_devices))
    restriction = restriction_text(topology)
    if restriction:
        log.info("%s", restriction)


# Stop the agent (exit 0; workloads keep running): systemd's stop, ^C in a terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Every signal with a handler of the agent's (run_until_signal); SIGPIPE is ignored.
HANDLED_SIGNALS = (*STOP_SIGNALS, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# What a reload (SIGHUP) applies while the agent runs, by AgentConfig field: each is read
# afresh at every use, and replaced whole under the service's lock, or (metrics_address)
# the endpoint is served anew before the old one closes. Every other key
# (paths, sockets, policies, enforcement, the intruder scan's timer...) is taken at
# start, by a thread, a bound socket or the checkpoint's bookings: it needs a restart.
RELOADABLE = frozenset({"log_level", "quotas", "isolate_default", "isolate_group", "metrics_address"})


class Agent:
    """Wires the edges around the service; start(), stop()."""

    def __init__(self, cfg: AgentConfig, hotplug_source: EventSource | None = None,
                 read_config: Callable[[], AgentConfig] | None = None,
                 nri_handler: Callable[[AgentApi], NriHandler] | None = None) -> None:
        self.cfg = cfg
        # The configuration as loaded (self.cfg may have a snapshot's extracted root
        # for its sysfs_root), with what reloads applied: what a reload compares with.
        self.running_config = cfg
        # Reads the configuration again, flags over the file, for SIGHUP (None: nothing to read).
        self.read_config = read_config
        self.api: ApiServer | None = None
        self.pod_resources: PodResourcesServer | None = None
        self.metrics: MetricsServer | None = None
        self.loop: EventLoop | None = None
        self.watcher: IntruderWatcher | None = None
        self.sampler: MemorySampler | None = None  # the metrics' memory figures, off the scrape
        self.hotplug = hotplug_source  # tests inject a fake; else kernel uevents
        # [nri] enabled: the plugin's connection to the runtime, and what makes its handler
        # from the service (tests give a stand-in; else the Kubernetes one).
        self.nri: NriAdapter | None = None
        self.nri_handler = nri_handler or kubernetes_handler
        self.service: AgentService | None = None
        self.kubelet_files: StateFiles | None = None  # the kubelet-shaped state files; None: off
        self.claim: StateDirClaim | None = None
        self.snapshot_dir: Path | None = None  # an extracted --sysfs-root archive
        self.machine_source: str | None = None  # that archive, as health names the machine

    def start(self) -> "Agent":
        """Start, or raise StartupError having released whatever was taken."""
        from numa_agent.state.directory import StateDirError, StateDirUntrusted, claim_state_dir

        _check_descriptors(_allow_many_descriptors())
        try:
            # First of all: one agent per state directory, and only a private one.
            claim = self.claim = claim_state_dir(self.cfg.state_dir)
        except StateDirUntrusted as exc:
            raise StartupConfigError(str(exc)) from None
        except StateDirError as exc:
            raise _startup_error(exc, f"{exc} (agent.state_dir, --state-dir)") from None
        except OSError as exc:
            raise _system_refused(exc) from None
        try:
            self._open_snapshot()
            return self._start()
        except OSError as exc:
            self._abandon(claim)
            raise _system_refused(exc) from None
        except BaseException:
            self._abandon(claim)
            raise

    def _abandon(self, claim: StateDirClaim) -> None:
        """Give back whatever a failed start took."""
        for observing in (self.nri, self.watcher, self.sampler):
            if observing is not None:
                observing.stop()
        self.nri = self.watcher = self.sampler = None
        for server in (self.api, self.pod_resources):
            if server is not None:
                server.stop()  # bound but never served: removes the socket
        self.api = self.pod_resources = None
        self._remove_snapshot()
        claim.abandon()

    def _open_snapshot(self) -> None:
        """`--sysfs-root` naming an archive: discovery reads its extracted tree."""
        from dataclasses import replace

        from numa_agent.service.snapshot import SnapshotError, extract_snapshot, is_archive

        if not is_archive(self.cfg.sysfs_root):
            return
        try:
            self.snapshot_dir, root = extract_snapshot(self.cfg.sysfs_root)
        except SnapshotError as exc:
            raise StartupError(str(exc)) from None
        log.info("sysfs snapshot %s extracted to %s", self.cfg.sysfs_root, root)
        self.machine_source = os.path.abspath(self.cfg.sysfs_root)
        self.cfg = replace(self.cfg, sysfs_root=str(root))

    def _remove_snapshot(self) -> None:
        from numa_agent.service.snapshot import remove_snapshot

        if self.snapshot_dir is not None:
            remove_snapshot(self.snapshot_dir)
            self.snapshot_dir = None

    def _start(self) -> "Agent":
        from numa_agent.admission.machine import MachineConfigError, build_machine
        from numa_agent.discovery.pci_ids import PciIdsFile
        from numa_agent.discovery.sysfs import DiscoveryError, read_free_hugepages, read_topology
        from numa_agent.service.agent_service import AgentService
        from numa_agent.service.recovery import PolicyChanged, restore
        from numa_agent.service.revocation_copy import RevocationCopy
        from numa_agent.state.checkpoint import CheckpointStore

        cfg = self.cfg
        isolate_gid = _isolate_gid(cfg)
        try:
            topology = read_topology(cfg.sysfs_root)
        except DiscoveryError as exc:
            raise StartupError(f"topology discovery failed: {exc}") from None
        try:
            machine = build_machine(topology, cfg.policy)
        except MachineConfigError as exc:
            raise StartupError(f"configuration does not fit this machine: {exc}") from None
        _log_machine(machine)
        enforcer = choose_enforcer(cfg, machine)
        machine = self._within_cgroup_root(machine, enforcer)
        self._claim_endpoints()
        # Only now is anything written: cgroups, the checkpoint.
        store = CheckpointStore(self.claim.held if self.claim is not None else cfg.state_dir)
        mark_key, key_new = _mark_key(cfg)
        revocation_copy = RevocationCopy(mark_key_path(cfg).parent)
        try:
            enforcer.setup()
            state, report = restore(machine, store, enforcer, cfg.on_policy_change, uid_of=_uid_of,
                                    mark_key=mark_key, key_new=key_new, revoked_copy=revocation_copy.load())
        except PolicyChanged as exc:
            raise StartupConfigError(str(exc)) from None
        except Exception as exc:
            raise StartupError(f"cannot restore state: {exc}") from None
        self.kubelet_files = _kubelet_state_files(cfg)
        # The intruder watcher reads the state of the service it is given to: bound below.
        state_of = _ServiceState()
        service = AgentService(machine, store, enforcer, isolation=_isolation_keeper(cfg),
                               isolate_default=cfg.isolate_default, isolate_gid=isolate_gid,
                               mark_key=mark_key, pci_names=PciIdsFile(), quotas=cfg.quotas,
                               state_publisher=self.kubelet_files, revocation_copy=revocation_copy,
                               sysfs_root=self.machine_source or os.path.abspath(cfg.sysfs_root),
                               hugepage_counters=functools.partial(read_free_hugepages, cfg.sysfs_root),
                               observer=self._observer(enforcer, state_of))
        state_of.service = service
        try:
            service.install(state)
        except Exception as exc:
            raise StartupError(f"cannot apply the restored state: {exc}") from None
        self.service = service
        log.info("state: %d workload(s) restored, %d released, %d adopted%s", report.restored,
                 len(report.released), len(report.adopted),
                 f", corrupt checkpoint moved to {report.quarantined}" if report.quarantined else "")
        self._start_edges(machine)
        return self

    def _claim_endpoints(self) -> None:
        """Bind the API socket (served from start_edges on) and check the
        metrics port, so that a start failing on either writes nothing."""
        from numa_agent.api.server import ApiServer
        from numa_agent.views.metrics import check_metrics_address, socket_path_of

        cfg = self.cfg
        self.api = _claimed(lambda: ApiServer(None, cfg.socket, socket_mode=cfg.socket_mode,
                                              socket_group=cfg.socket_group).bind(),
                            f"the API on {cfg.socket} (agent.socket, --socket)", cfg.socket)
        self._claim_pod_resources()
        if cfg.metrics_address:
            where = "(agent.metrics_address, --metrics-address)"
            path = socket_path_of(cfg.metrics_address)
            if path is not None:
                _check_socket_place(path, f"metrics on {cfg.metrics_address} {where}")
            try:
                check_metrics_address(cfg.metrics_address)
            except (OSError, ValueError) as exc:
                what = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise _startup_error(exc, f"{what} {where}") from None

    def _claim_pod_resources(self) -> None:
        """Bind the PodResources socket: a path taken or not writable stops the
        start, never a silent absence."""
        from numa_agent.kubelet.grpc_server import PodResourcesServer

        cfg = self.cfg
        path = cfg.pod_resources_path()
        if path is None:
            return
        self.pod_resources = _claimed(
            lambda: PodResourcesServer(path, cfg.pod_namespace, socket_mode=cfg.socket_mode,
                                       socket_group=cfg.socket_group).bind(),
            f"PodResources on {path} (kubelet.pod_resources_socket, --pod-resources-socket)", path)

    def _within_cgroup_root(self, machine, enforcer: Enforcer):
        """The agent hands out what the enforcer's root is granted when it
        says so (in cgroup mode `cpuset.*.effective` of its cgroup root), not
        what its own process happens to be allowed."""
        from dataclasses import replace

        from numa_agent.admission.machine import MachineConfigError, build_machine
        from numa_agent.enforcement.protocol import kept_records

        kept = kept_records(enforcer)
        grant = kept.granted() if kept is not None else None
        if grant is None:
            return machine
        cpus, mems = grant.cpus, grant.mems
        topo = machine.topology
        granted = replace(topo, allowed_cpus=cpus, allowed_mems=frozenset(mems.nodes()))
        if (granted.allowed_cpus, granted.allowed_mems) == (topo.allowed_cpus, topo.allowed_mems):
            return machine
        log.info("%s grants cpus %s, mems %s", grant.source, cpus.format(), mems.format())
        try:
            machine = build_machine(granted, self.cfg.policy)
        except MachineConfigError as exc:
            raise StartupError(f"configuration does not fit what {grant.source} "
                               f"grants (cpus {cpus.format()}, mems {mems.format()}): {exc}") from None
        _log_machine(machine)
        return machine

    def _start_edges(self, machine) -> None:
        from numa_agent.daemon import sdnotify
        from numa_agent.daemon.runtime import EventLoop

        cfg = self.cfg
        service, api = self.service, self.api
        assert service is not None and api is not None, "the edges start after the service"
        self._start_observing(service)  # before the API serves: every status has its fields
        if cfg.nri_enabled:
            self.nri = self._nri_adapter(service)  # started once the API serves
        # Metrics listen before the API answers: a client that sees the agent up can scrape it.
        if cfg.metrics_address:
            from numa_agent.views.metrics import start_metrics_server

            try:
                self.metrics = start_metrics_server(cfg.metrics_address, self._registry(service),
                                                    socket_mode=cfg.socket_mode, socket_group=cfg.socket_group)
            except UntrustedDirectory as exc:  # changed since it was checked
                raise StartupConfigError(str(exc)) from None
            except (OSError, ValueError) as exc:  # taken since it was checked
                raise StartupError(f"{exc} (agent.metrics_address, --metrics-address)") from None
        api.attach(service, self._kubelet_documents)
        api.start()
        if self.pod_resources is not None:
            self.pod_resources.attach(service)
            self.pod_resources.start()
        if self.nri is not None:  # READY does not wait for the runtime: the adapter waits for it alone
            self.nri.start()
        if self.hotplug is None and cfg.hotplug and os.path.abspath(cfg.sysfs_root) == "/":
            from numa_agent.hotplug.events import HotplugUnavailable, UdevEventSource

            try:
                self.hotplug = UdevEventSource.open()
            except HotplugUnavailable as exc:
                log.warning("%s; the agent runs without hotplug", exc)
        probe = None
        if self.hotplug is not None:  # changes no uevent announces, wherever hotplug is followed
            from numa_agent.discovery.sysfs import read_memory_figures
            probe = functools.partial(read_memory_figures, cfg.sysfs_root)
        self.loop = EventLoop(service, hotplug_source=self.hotplug, on_hotplug=self._on_hotplug,
                              memory_probe=probe,
                              watchdog_interval=_half(sdnotify.watchdog_interval()),
                              watchdog_ping=sdnotify.watchdog_ping).start()
        sdnotify.ready()
        sdnotify.status(f"{len(service.state.workloads)} workloads; enforcement "
                        f"{service.enforcer.mode}; socket {cfg.socket}")
        log.info("ready: socket %s, enforcement %s%s", cfg.socket, service.enforcer.mode,
                 f" ({service.enforcer.reason})" if service.enforcer.reason else "")

    def _nri_adapter(self, service: AgentService) -> NriAdapter:
        """The NRI plugin ([nri] enabled), its handler made from the service; health and
        status say whether it is connected."""
        from numa_agent.nri.adapter import NriAdapter

        adapter = NriAdapter(self.cfg, self.nri_handler(service))
        service.edge_reports["nri"] = adapter.health
        return adapter

    def _registry(self, service: AgentService):
        """The metrics' registry: the agent's families, PodResources' gate, the NRI plugin's."""
        from numa_agent.views.metrics import NriCollector, build_registry

        registry = build_registry(service.metrics_snapshot)
        if self.pod_resources is not None:  # its gate's refusals beside the metrics listener's
            registry.register(self.pod_resources.collector())
        if self.nri is not None:
            registry.register(NriCollector(self.nri.stats))
        return registry

    def _observer(self, enforcer: Enforcer, state_of: Callable[[], AgentState]) -> Observer:
        """Memory locality in status, and the intruder scan (started with the
        edges; off with intruder_scan_seconds = 0). It reads <sysfs root>/proc:
        a captured tree without tasks shows none."""
        from numa_agent.observe.observer import Observer
        from numa_agent.observe.procfs import ProcReader
        from numa_agent.observe.watcher import IntruderWatcher, guarded_of

        cfg = self.cfg
        source = ProcReader(os.path.join(cfg.sysfs_root, "proc"))
        # How /proc/PID/cgroup names the workloads' cgroups: below the mount,
        # or (simulated) below the simulated tree's root.
        mount = CGROUP_MOUNT if enforcer.mode == "cgroup" else enforcer.path_of("")
        if cfg.intruder_scan_seconds > 0:
            self.watcher = IntruderWatcher(lambda: guarded_of(state_of(), enforcer.path_of, mount),
                                           source, cfg.intruder_scan_seconds)
        return Observer(source, enforcer.path_of, self.watcher)

    def _start_observing(self, service: AgentService) -> None:
        """The intruder scan on its own timer, and the memory per node the
        metrics report, sampled at the scan's pace: a scrape reads no file
        (docs/monitoring.md, staleness)."""
        from numa_agent.observe.observer import MEMORY_SAMPLE_SECONDS, MemorySampler

        if self.watcher is not None:
            self.watcher.start()
        if service.observer is not None:
            self.sampler = MemorySampler(service.observer, lambda: service.state,
                                         self.cfg.intruder_scan_seconds or MEMORY_SAMPLE_SECONDS).start()

    def _on_hotplug(self, events) -> None:
        """Kernel events arrived (None: some were lost): re-read the machine."""
        from numa_agent.admission.machine import build_machine
        from numa_agent.discovery.sysfs import read_topology

        service = self.service
        if service is None:
            return  # not started yet: start-up reads the machine anyway
        if events is None:
            log.warning("hotplug events were lost; rescanning sysfs")
        else:
            for event in events:
                service.counters.hotplug(event.kind)
                log.info("hotplug: %s %s %s", event.kind, event.action, event.id)
            if not events:
                return
        from numa_agent.service.refusals import Unavailable

        machine = build_machine(read_topology(self.cfg.sysfs_root), self.cfg.policy)
        try:
            service.replace_machine(machine)
        except Unavailable as exc:  # the checkpoint: health says so; the old machine stays
            log.error("hotplug: the changed machine is not taken on: %s", exc.message)

    def _kubelet_documents(self) -> dict:
        """GET /v1/kubelet: the documents of the state the service last published."""
        from numa_agent.kubelet.files import served_documents

        assert self.service is not None, "served once the service exists"
        machine, state = self.service.view() or (self.service.machine, self.service.state)
        return served_documents(self.kubelet_files, machine, state)

    def stop(self) -> None:
        from numa_agent.daemon import sdnotify

        sdnotify.stopping()
        if self.nri is not None:  # first: its handler's calls reach the service through no API
            self.nri.stop()
        if self.api is not None:
            # The socket file stays: a client that finds it refusing waits for the next
            # agent (a restart), where a missing one fails at once (no agent starts).
            # The next agent replaces it; systemd's socket unit keeps its own the same way.
            self.api.stop(leave_socket=True)
        for part in (self.pod_resources, self.loop, self.watcher, self.sampler, self.metrics):
            if part is not None:
                part.stop()
        if self.kubelet_files is not None:
            self.kubelet_files.close()  # the documents of the last change written
        if self.hotplug is not None:
            self.hotplug.close()
        if self.claim is not None:
            self.claim.release()
        self._remove_snapshot()
        log.info("stopped; workloads keep running and keep their CPUs")

    def run_until_signal(self) -> int:
        """Start, then serve until SIGTERM or SIGINT (exit 0). Every signal systemd or
        a user may send has an outcome (docs/numa-agent.md, Signals): SIGHUP reloads
        the configuration, SIGUSR1 and SIGUSR2 are logged and change nothing, SIGPIPE
        is ignored (a peer gone is an EPIPE on its socket). This thread acts on them;
        a reload changes settings under the service's lock, so an admission is never
        judged half under the old ones, and a stop lets the admissions under way finish."""
        # The signals reach this thread through a pipe: the interpreter's C handler
        # writes each one's number to the wakeup fd from whichever thread the kernel
        # chose, and waking the loop needs no lock (an Event set from a Python-level
        # handler can deadlock when the signal lands while this thread holds the Event's
        # lock). The Python-level handlers only replace the default action; they stay
        # after the stop, so that a signal while the process exits cannot end it otherwise.
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        # A storm of signals fills the pipe: each one past its room is then noted by the
        # Python-level handler (_noted) instead, and not reported on stderr.
        previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        _NOTED.clear()
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, _noted)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            self.start()  # a signal meanwhile waits in the pipe: acted on once started
            try:
                self._serve_signals(wake_r)
            finally:
                self.stop()
        finally:
            signal.set_wakeup_fd(previous)
            os.close(wake_r)
            os.close(wake_w)
        return 0

    def _serve_signals(self, wake_r: int) -> None:
        """Act on the signals read from `wake_r` (one byte each), and those noted by
        _noted, until one says stop. The whole pipe is read at once: a storm of SIGHUPs
        is one reload, not one per few hundred. When the pipe was full the byte of a
        signal is lost, but _noted has it; the wait is bounded so it is seen even if
        the pipe stays empty afterwards."""
        import select

        while True:
            readable, _, _ = select.select([wake_r], [], [], 1.0)
            taken = set(os.read(wake_r, 1 << 16)) if readable else set()
            while _NOTED:
                taken.add(_NOTED.pop())
            stop = [sig for sig in STOP_SIGNALS if sig in taken]
            if stop:
                log.info("%s received: stopping", signal.Signals(stop[0]).name)
                return
            if signal.SIGHUP in taken:
                self.reload()
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                if sig in taken:
                    log.info("%s received: nothing to do (SIGHUP reloads the configuration, SIGTERM stops "
                             "the agent)", signal.Signals(sig).name)

    def reload(self) -> None:
        """SIGHUP: read the configuration again (the file, and the flags over it),
        apply what can change while the agent runs (RELOADABLE) and name, in one log
        line, the changed keys that need a restart. A configuration that does not
        load is logged and the running one kept: a reload never stops the agent."""
        from numa_agent.daemon import sdnotify

        sdnotify.reloading()
        try:
            self._reload()
        finally:
            sdnotify.ready()

    def _reload(self) -> None:
        from dataclasses import replace

        from numa_agent.daemon.config import ConfigError, changed_keys

        if self.read_config is None:
            log.info("SIGHUP: this agent was started without a configuration to read again; nothing reloaded")
            return
        try:
            new = self.read_config()
            isolate_gid = _isolate_gid(new)
        except (ConfigError, StartupError) as exc:
            log.error("reload refused, the running configuration is kept: %s", one_line(exc))
            return
        except Exception as exc:  # a bug must not stop the agent either
            log.debug("reload failed", exc_info=True)
            log.error("reload failed unexpectedly, the running configuration is kept: %s: %s",
                      type(exc).__name__, one_line(exc))
            return
        changed = changed_keys(self.running_config, new)
        if not changed:
            log.info("configuration reloaded: nothing changed")
            return
        live = [(field, key) for field, key in changed if field in RELOADABLE]
        later = [key for field, key in changed if field not in RELOADABLE]
        applied = self._apply_live(new, {field for field, _ in live}, isolate_gid) if live else set()
        if applied:
            values = {field: getattr(new, field) for field in applied}
            self.running_config = replace(self.running_config, **values)
            self.cfg = replace(self.cfg, **values)
        later += [key for field, key in live if field not in applied]  # the metrics could not move
        done = ", ".join(key for field, key in live if field in applied)
        # At warning when something waits for a restart: an agent set to warning says it too.
        log.log(logging.WARNING if later else logging.INFO, "configuration reloaded: %s; %s",
                f"{done} applied" if done else "nothing applied",
                f"changed but not applied until a restart: {', '.join(later)}" if later
                else "nothing that needs a restart changed")

    def _apply_live(self, new: AgentConfig, fields: set[str], isolate_gid: int | None) -> set[str]:
        """Apply `fields` of `new`; the fields applied."""
        from numa_agent.daemon.logging_setup import ROOT_LOGGER, check_level

        applied = set(fields)
        if "log_level" in fields:
            logging.getLogger(ROOT_LOGGER).setLevel(check_level(new.log_level).upper())
        if "metrics_address" in fields and not self._move_metrics(new.metrics_address):
            applied.discard("metrics_address")
        settings = {"quotas": new.quotas, "isolate_default": new.isolate_default, "isolate_gid": isolate_gid}
        wanted = {name: value for name, value in settings.items()
                  if (name if name != "isolate_gid" else "isolate_group") in fields}
        if wanted and self.service is not None:
            self.service.reconfigure(**wanted)
        return applied

    def _move_metrics(self, address: str | None) -> bool:
        """The metrics endpoint served on `address` from now on (None: none); False, with
        the endpoint left where it was, when the new address cannot be served. The new
        one is listened on before the old one closes, so scrapes see no gap, except when
        the old one holds the port the new one wants (127.0.0.1:9464 to 0.0.0.0:9464)."""
        from numa_agent.views.metrics import start_metrics_server

        old, was, cfg, service = self.metrics, self.cfg.metrics_address, self.cfg, self.service
        assert service is not None, "reloads come once started"
        refusals = (OSError, ValueError, UntrustedDirectory)

        def serve(where: str) -> MetricsServer:
            return start_metrics_server(where, self._registry(service),
                                        socket_mode=cfg.socket_mode, socket_group=cfg.socket_group)

        if address is None:
            self.metrics = None
        else:
            try:
                self.metrics = serve(address)
            except refusals as exc:
                if old is None or was is None or not (isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
                                                      and _tcp_port(was) == _tcp_port(address)):
                    log.error("metrics stay on %s: %s (agent.metrics_address)", was or "(none)", one_line(exc))
                    return False
                old.stop()  # the port may be the old endpoint's own: hand it over
                try:
                    self.metrics = serve(address)
                    return True
                except refusals as again:
                    try:
                        self.metrics = serve(was)
                        log.error("metrics stay on %s: %s (agent.metrics_address)", was, one_line(again))
                    except refusals as back:
                        self.metrics = None
                        log.error("metrics are off: %s; and back on %s: %s (agent.metrics_address)",
                                  one_line(again), was, one_line(back))
                    return False
        if old is not None:
            old.stop()
        return True


def kubernetes_handler(api: AgentApi) -> NriHandler:
    """The NRI handler with Kubernetes' meaning (numa_agent/nri/handler.py), imported only
    when [nri] is enabled."""
    from numa_agent.nri.handler import KubernetesHandler

    return KubernetesHandler(api)


# ---- choosing the enforcer ----------------------------------------------------------
class _ServiceState:
    """The state of the service, for what the service is given and reads it
    back (the intruder watcher): bound once the service is made, read only by
    a scan, which starts with the edges."""

    def __init__(self) -> None:
        self.service: AgentService | None = None

    def __call__(self) -> AgentState:
        if self.service is None:
            raise RuntimeError("the service's state was read before the service was made")
        return self.service.state


class EnforcerUnavailable(Exception):
    """An enforcer cannot run here; the message says why. The next one is tried."""


EnforcerFactory = Callable[[Any, Any, str], "Enforcer"]


def choose_enforcer(cfg, machine) -> Enforcer:
    """The first enforcer of _ENFORCERS that accepts this configuration. Each
    factory gets (cfg, machine, why_not), `why_not` being why the previous
    ones declined ("" for the first), and returns an Enforcer, raises
    EnforcerUnavailable to let the next one try, or StartupError to stop."""
    why_not = ""
    for factory in _ENFORCERS:
        try:
            return factory(cfg, machine, why_not)
        except EnforcerUnavailable as exc:
            why_not = str(exc)
    raise StartupError(f"no enforcer can run here: {why_not}")


def _lazy(target: str) -> EnforcerFactory:
    """The factory "module:function", imported only when it is tried, so that
    the other subcommands never load an enforcer's dependencies."""
    module_name, _, name = target.partition(":")

    def factory(cfg, machine, why_not: str) -> Enforcer:
        return getattr(importlib.import_module(module_name), name)(cfg, machine, why_not)

    return factory


SIMULATED_ROOT = "numa-agent"  # the agent's root in its simulated hierarchy, as `auto` names it


def _simulated_cgroup(cfg, machine, why_not: str) -> Enforcer:
    """The topology is a snapshot of another machine: pinning real processes
    to its CPUs would be wrong. Simulate the cgroup tree."""
    if cfg.cgroup_root != "auto" or os.path.abspath(cfg.sysfs_root) == "/":
        raise EnforcerUnavailable("the topology is this machine's")
    from numa_agent.enforcement.cgroup import CgroupV2
    from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
    from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root

    # The simulated hierarchy's top, with the agent's root one level below it as
    # on a kernel (/sys/fs/cgroup/numa-agent): engines' cgroups lie beside it.
    mount = Path(cfg.state_dir) / "cgroupfs"
    make_simulated_cgroup_root(mount, machine.usable_cpus, machine.memory.memory_nodes.nodes()
                          or machine.node_ids)
    files = SimulatedCgroupfs(mount)
    top = CgroupV2(mount, files)
    top.enable_controllers("", top.controllers())
    top.create(SIMULATED_ROOT, exist_ok=True)
    fake = mount / SIMULATED_ROOT
    log.warning("sysfs root %s is not this machine: enforcing into a simulated cgroup tree at %s",
                cfg.sysfs_root, fake)
    return CgroupEnforcer(CgroupV2(fake, files))


def _allow_many_descriptors() -> int:
    """Raise the soft limit on open files to the hard one (a thousand
    workloads are a thousand pidfds, more than the usual soft 1024); the
    soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else max(soft, 1 << 16), hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-files limit: %s", exc)
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# What an idle agent holds (about 20: sockets, epoll and event descriptors, the
# state directory's lock) and a few clients; each followed workload holds more.
MIN_OPEN_FILES = 64


def _check_descriptors(limit: int) -> None:
    if limit < MIN_OPEN_FILES:
        raise StartupConfigError(
            f"the open-files limit (RLIMIT_NOFILE) is {limit}, too few to start: the agent needs at "
            f"least {MIN_OPEN_FILES}, and one more per workload it follows; raise it (LimitNOFILE= "
            "in the unit, `ulimit -n` in a shell)")


def _system_refused(exc: OSError) -> StartupError:
    """An OSError no step of the start expected, as one line: running out of
    descriptors says which limit."""
    if exc.errno == errno.EMFILE:
        return StartupError(f"ran out of file descriptors while starting ({exc}); raise the open-files "
                            "limit (LimitNOFILE= in the unit, `ulimit -n` in a shell)")
    if exc.errno == errno.ENFILE:
        return StartupError(f"the system ran out of file descriptors while starting ({exc}); see "
                            "fs.file-max")
    return StartupError(f"cannot start: {exc}")


def _kernel_cgroup(cfg, machine, why_not: str) -> Enforcer:
    """cgroup v2 below the configured root, or the one found (auto)."""
    from numa_agent.enforcement.cgroup import CgroupV2, KernelFiles
    from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer

    root = cfg.cgroup_root
    if root == "none":
        raise EnforcerUnavailable("cgroup enforcement disabled (cgroup_root = none)")
    if root == "auto":
        root, why = _auto_cgroup_root()
        if root is None:
            raise EnforcerUnavailable(why)
    _refuse_foreign_cpus(cfg, machine, f"--cgroup-root {root}")
    _check_cgroup_root(root)
    cg = CgroupV2(root, KernelFiles())
    caps = cg.probe()
    if not caps.usable:
        if cfg.cgroup_root == "auto":
            raise EnforcerUnavailable(caps.reason)
        raise StartupError(f"cgroup root {root} cannot be used: {caps.reason}")
    log.info("enforcing with cgroup v2 below %s", root)
    return CgroupEnforcer(cg, domain_controllers=_may_use_domain_controllers(root),
                          partitions=cfg.cpuset_partitions)


def _check_cgroup_root(root: str) -> None:
    """A root another user can change is refused: the agent makes and writes
    cgroups below it as root (state/trusted_dir.py)."""
    from numa_agent.state.trusted_dir import open_directory

    try:
        open_directory(root, "cgroup root").close()
    except UntrustedDirectory as exc:
        raise StartupConfigError(str(exc)) from None
    except OSError:
        pass  # missing or unreadable: the probe says so, in its words


def _affinity(cfg, machine, why_not: str) -> Enforcer:
    """The last resort: pinning with CPU affinity; never declines."""
    from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer

    _refuse_foreign_cpus(cfg, machine, "--cgroup-root none")
    _require_pidfd(why_not)
    log.warning("no usable cgroup v2 cpuset (%s): enforcing with CPU affinity instead; "
                "bookkeeping is identical, but child processes forked before admission "
                "and memory placement of other processes are not controlled", why_not)
    _warn_missing_affinity_capabilities()
    return AffinityEnforcer(why_not)


def _require_pidfd(why_not: str) -> None:
    """The fallback follows each workload's process through a pidfd (exits,
    and a PID taken by another process): without one it cannot run."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ENOSYS:
            raise  # out of descriptors, say: the start reports it
        what = getattr(exc, "strerror", None) or "not in this Python"
        raise StartupError(f"no enforcer can run here: no usable cgroup v2 cpuset ({why_not}), and the "
                           f"CPU-affinity fallback needs pidfd_open (Linux 5.3 or later): {what}") from None


def _warn_missing_affinity_capabilities(status_path: str = "/proc/self/status") -> None:
    """A root agent whose unit took away what the fallback needs for other users'
    processes says so, with the remedy, rather than failing each admission with EPERM."""
    from numa_agent.enforcement.processes import AFFINITY_CAPABILITIES, missing_capabilities

    if os.geteuid() != 0:
        return  # an agent of one user serves that user's own processes only
    try:
        with open(status_path) as f:
            missing = missing_capabilities(f.read(), AFFINITY_CAPABILITIES)
    except OSError:
        return
    if missing:
        log.warning("the affinity fallback lacks %s: other users' processes can be neither "
                    "pinned nor rebuilt after a restart; under systemd copy "
                    "affinity-fallback.conf (in the install prefix, /opt/numa-agent by default) to "
                    "/etc/systemd/system/numa-agent.service.d/ and restart the agent",
                    ", ".join(missing))


def _refuse_foreign_cpus(cfg, machine, option: str) -> None:
    """Real enforcement (real cgroups, CPU affinity) of a snapshot of
    another machine would pin real processes to CPUs this one may not have:
    every admission would then fail. Say so at start instead."""
    from numa_agent.core.cpuset import CpuSet

    if os.path.abspath(cfg.sysfs_root) == "/":
        return
    here = CpuSet(os.sched_getaffinity(0))
    foreign = machine.usable_cpus - here
    if foreign:
        raise StartupConfigError(
            f"the --sysfs-root snapshot is not this machine: its CPUs {foreign.format()} are not "
            f"among the CPUs this process may use ({here.format()}), and {option} would pin real "
            f"processes to them. Drop {option}: with --sysfs-root the agent enforces into a "
            "simulated cgroup tree by default")


# Every enforcer the agent can run with, most capable first; the last one
# never declines. A new enforcer is one module holding its class and its
# factory, and one line here: _lazy("numa_agent.enforcement.<module>:<factory>").
_ENFORCERS: tuple[EnforcerFactory, ...] = (
    _simulated_cgroup,
    _kernel_cgroup,
    _affinity,
)


CGROUP_MOUNT = "/sys/fs/cgroup"


def _auto_cgroup_root(mount: str = CGROUP_MOUNT, environ: Mapping[str, str] = os.environ,
                      own_cgroup: Callable[[], str | None] | None = None) -> tuple[str | None, str]:
    """Under systemd: the workloads unit's cgroup when the unit names one
    (NUMA_AGENT_WORKLOADS_UNIT), else the agent's own delegated cgroup.
    Elsewhere a `numa-agent` cgroup below the hierarchy's root."""
    own_cgroup = own_cgroup or _own_cgroup
    if not os.path.isfile(os.path.join(mount, "cgroup.controllers")):
        return None, f"no cgroup v2 hierarchy mounted at {mount}"
    try:
        own = own_cgroup()
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc.strerror}"
    if own is None:
        return None, "this process is in no cgroup v2 hierarchy"
    if own not in ("/", "") and environ.get("INVOCATION_ID"):
        # Under systemd with Delegate=yes: the service's cgroup is ours. With
        # DelegateSubgroup=agent (systemd >= 254) we start one level down.
        if os.path.basename(own) == AGENT_CGROUP:
            own = os.path.dirname(own)
        unit = environ.get(WORKLOADS_UNIT_ENV, "").strip()
        if unit:
            return _workloads_unit_cgroup(mount, own, unit)
        return os.path.join(mount, own.lstrip("/")), ""
    path = os.path.join(mount, "numa-agent")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return None, f"cannot create {path}: {exc.strerror}"
    return path, ""


# Set by the shipped unit: the delegated unit beside the agent's own that holds the
# workloads (systemd/numa-agent-workloads.service).
WORKLOADS_UNIT_ENV = "NUMA_AGENT_WORKLOADS_UNIT"


def mark_key_path(cfg) -> Path:
    """Where the key that signs workload marks lives: the runtime directory (the
    socket's; tmpfs, cleared at reboot), or with a simulated machine
    (--sysfs-root) the state directory, like everything else of it."""
    directory = Path(cfg.socket).parent if cfg.sysfs_root == "/" else Path(cfg.state_dir)
    return directory / KEY_NAME


def _mark_key(cfg) -> MarkKey:
    from numa_agent.daemon.mark_key import MarkKeyError, load_or_create_key

    try:
        return load_or_create_key(mark_key_path(cfg))
    except UntrustedDirectory as exc:
        raise StartupConfigError(str(exc)) from None
    except (MarkKeyError, OSError) as exc:
        raise _startup_error(exc, f"cannot set up the workload mark key: {exc}") from None


def _workloads_unit_cgroup(mount: str, own: str, unit: str) -> tuple[str | None, str]:
    """The cgroup of `unit`, a sibling of the agent's own service in the same slice.

    Why a unit of its own: systemd starts a service's new main process in the
    service's cgroup, and the kernel refuses that while any child of it holds
    processes (219/CGROUP). With the workloads below the agent's own service, a
    restart, crash or watchdog kill on systemd < 254 (no DelegateSubgroup=)
    would leave the agent down for as long as any workload runs. The workloads
    unit is started once and never restarted with the agent."""
    if "/" in unit or not unit.endswith(".service"):
        raise StartupConfigError(f"{WORKLOADS_UNIT_ENV}={unit!r} is not a service unit name")
    path = os.path.join(mount, os.path.dirname(own).lstrip("/"), unit)
    if not os.path.isfile(os.path.join(path, "cgroup.controllers")):
        raise StartupError(f"the workloads unit {unit} has no cgroup at {path}: is it running? "
                           f"(`systemctl start {unit}`; the agent's unit requires it)")
    return path, ""


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path ("0::" line of /proc/self/cgroup), or None."""
    with open("/proc/self/cgroup") as f:
        return parse_cgroup(f.read())


def _may_use_domain_controllers(root: str, environ: Mapping[str, str] = os.environ,
                                own_cgroup: Callable[[], str | None] | None = None,
                                mount: str = CGROUP_MOUNT) -> bool:
    """memory and hugetlb are domain controllers: once the service's cgroup
    enables them for its children it may hold no process, and systemd older
    than 254 (no DelegateSubgroup=) starts the restarted agent right there
    and fails (219/CGROUP). When the agent runs in the root it manages and was
    not started one level down, keep to the threaded controllers (cpuset, cpu,
    pids): then a restart works while no workload runs (with one running the
    kernel refuses it all the same). The shipped units avoid the question: the
    workloads live in a unit of their own (see _workloads_unit_cgroup)."""
    if not environ.get("INVOCATION_ID"):
        return True
    try:
        own = (own_cgroup or _own_cgroup)() or ""
    except OSError:
        return True
    if os.path.basename(own) == AGENT_CGROUP:
        return True
    inside = mount.rstrip("/") + own.rstrip("/")
    if not (os.path.abspath(root) + "/").startswith(inside + "/") and \
            not (inside + "/").startswith(os.path.abspath(root) + "/"):
        return True  # the agent's own cgroup is outside the tree it manages
    log.warning("the agent runs inside the cgroup tree it manages and systemd started it without "
                "DelegateSubgroup= (systemd < 254): memory and hugetlb limits are not enforced, and "
                "systemd cannot start the agent again while a workload runs (219/CGROUP); the shipped "
                "units keep the workloads in numa-agent-workloads.service instead")
    return False


def _uid_of(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return 0


def _tcp_port(address: str) -> int | None:
    """The port of a HOST:PORT metrics address; None for unix:PATH."""
    from numa_agent.views.metrics import parse_address, socket_path_of

    return None if socket_path_of(address) is not None else parse_address(address)[1]


# Signals the Python-level handler saw (run_until_signal's loop takes them): the one
# record of a signal whose byte a full wakeup pipe had no room for.
_NOTED: set[int] = set()


def _noted(signum: int, frame: Any) -> None:
    """The Python-level handler of HANDLED_SIGNALS: the wakeup fd has the signal
    already, unless a storm of signals had filled it; noted here for that case."""
    _NOTED.add(signum)


def one_line(what: object) -> str:
    """Whatever a library's message holds, the operator's line is one line."""
    return "; ".join(line.strip() for line in str(what).splitlines() if line.strip())


def _half(interval):
    return interval / 2 if interval else None


def _claimed(bind: Callable[[], Any], what: str, path: str) -> Any:
    """A server's socket bound by `bind` at `path`: what the configuration alone
    gets wrong is a configuration error (exit 78, _check_socket_place), any other
    failure says it cannot serve `what`."""
    _check_socket_place(path, what)
    try:
        return bind()
    except UntrustedDirectory as exc:
        raise StartupConfigError(str(exc)) from None
    except Exception as exc:
        raise _startup_error(exc, f"cannot serve {what}: {exc}") from None


def _check_socket_place(path: str, what: str) -> None:
    """Before a socket is bound at `path`: a path no restart can make work (too
    long for a Unix socket, a file that is not a socket, a directory others may
    write or that cannot be made) stops the start as a configuration error
    (StartupConfigError, exit 78). A socket another agent serves on is left to the
    bind: it may be gone by the next try."""
    import stat

    from numa_agent.state.socket_file import SUN_PATH_MAX
    from numa_agent.state.trusted_dir import open_directory

    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:
        raise StartupConfigError(f"cannot serve {what}: the path is {size} bytes, longer than a Unix "
                                 f"socket's {SUN_PATH_MAX}")
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupConfigError(f"cannot serve {what}: {path} exists and is not a socket; refusing "
                                     "to replace it")
    except OSError:
        pass  # missing (the usual case), or the directory says why below
    try:
        open_directory(os.path.dirname(path) or ".", "socket directory", create_mode=0o755).close()
    except UntrustedDirectory as exc:
        raise StartupConfigError(str(exc)) from None
    except OSError as exc:
        raise _startup_error(exc, f"cannot serve {what}: {exc.strerror or exc}") from None


# What an OSError says of a path that no restart can change: it names something
# other than a directory, a read-only file system (ProtectSystem= without
# ReadWritePaths=), no permission, a name too long or a loop of symlinks.
_CONFIG_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.EACCES, errno.EPERM,
                            errno.ENAMETOOLONG, errno.ELOOP})


def _startup_error(exc: BaseException, message: str) -> StartupError:
    """`message` as a StartupConfigError (exit 78) when `exc`, or what it was
    raised from, is an error of the configuration; else as a StartupError (exit 1,
    restarted: a lock held, a port taken, an I/O error may pass)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; never loop on a cycle
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in _CONFIG_ERRNOS:
            return StartupConfigError(message)
        if isinstance(seen, ValueError) and not isinstance(seen, OSError) and seen is exc:
            return StartupConfigError(message)  # a path too long, a group unknown: the value is wrong
        seen = seen.__cause__ or seen.__context__
    return StartupError(message)


def _kubelet_state_files(cfg):
    """The kubelet-shaped state files' writer, its directory checked; None when off."""
    from numa_agent.kubelet.files import StateFiles, StateFilesError, StateFilesUntrusted

    directory = cfg.kubelet_state_path()
    if directory is None:
        return None
    files = StateFiles(directory)
    try:
        files.check()
    except StateFilesUntrusted as exc:
        raise StartupConfigError(str(exc)) from None
    except StateFilesError as exc:
        raise _startup_error(exc, f"{exc} (kubelet.state_dir, --kubelet-state-dir)") from None
    return files


def _isolate_gid(cfg) -> int | None:
    """The gid of `[isolation] group`; an unknown group stops the start."""
    if cfg.isolate_group is None:
        return None
    import grp

    try:
        return grp.getgrnam(cfg.isolate_group).gr_gid
    except KeyError:
        raise StartupConfigError(f"isolation.group: no group named {cfg.isolate_group!r}") from None


def _isolation_keeper(cfg):
    """The machine's /proc and /sys, or on a captured tree (`--sysfs-root`) its
    knobs simulated: this machine's interrupts are never touched for a snapshot."""
    from numa_agent.enforcement.processes import boot_id
    from numa_agent.isolation.keeper import IsolationKeeper
    from numa_agent.isolation.knobs import ProcSysKnobs, SimulatedKnobs

    root = os.path.abspath(cfg.sysfs_root)
    if root == "/":
        return IsolationKeeper(ProcSysKnobs("/proc", "/sys", cfg.idle_latency_us), boot_id("/proc"))
    return IsolationKeeper(SimulatedKnobs(os.path.join(root, "proc"), os.path.join(root, "sys"),
                                          cfg.idle_latency_us))
