"""`numa-agent serve`: run the agent in the foreground (systemd Type=notify)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from numa_agent.enforcement.plan import AGENT_CGROUP

log = logging.getLogger("numa_agent.serve")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="run the agent in the foreground",
        description="Discover the machine, restore the checkpoint, then admit and pin workloads "
                    "until SIGTERM. Flags override the config file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  numa-agent serve --config /etc/numa-agent/config.toml\n"
               "  numa-agent serve --state-dir .run/state --socket .run/agent.sock   (developer box)\n"
               "  numa-agent serve --sysfs-root snapshot/ --state-dir /tmp/s --socket /tmp/s.sock\n")
    p.add_argument("--config", help="TOML config file (default /etc/numa-agent/config.toml if present)")
    p.add_argument("--sysfs-root", help="directory holding sys/ and proc/ (default /)")
    p.add_argument("--cgroup-root",
                   help="the agent's cgroup v2 directory; 'auto' (default) finds it, 'none' forces the "
                        "CPU-affinity fallback")
    p.add_argument("--state-dir", help="checkpoint directory (default /var/lib/numa-agent)")
    p.add_argument("--socket", help="API socket path (default /run/numa-agent/agent.sock)")
    p.add_argument("--socket-group", help="group allowed to use the socket (mode 0660)")
    p.add_argument("--metrics-address", help="HOST:PORT for Prometheus metrics (default 127.0.0.1:9464; "
                                             "'' disables)")
    p.add_argument("--log-level", help="debug, info (default), warning, error")
    p.add_argument("--no-hotplug", action="store_true", help="do not listen for kernel hotplug events")
    p.set_defaults(func=run)


def _effective_config(args):
    from numa_agent.service.config import load_config

    cfg = load_config(args.config, required=args.config is not None)
    overrides = {}
    for flag, key in (("sysfs_root", "sysfs_root"), ("cgroup_root", "cgroup_root"),
                      ("state_dir", "state_dir"), ("socket", "socket"),
                      ("socket_group", "socket_group"), ("log_level", "log_level")):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    if args.metrics_address is not None:
        overrides["metrics_address"] = args.metrics_address or None
    if args.no_hotplug:
        overrides["hotplug"] = False
    return replace(cfg, **overrides)


def run(args) -> int:
    from numa_agent.service.config import ConfigError

    try:
        cfg = _effective_config(args)
    except ConfigError as exc:
        print(f"numa-agent: {exc}", file=sys.stderr)
        return 1
    from numa_agent.service.logging_setup import setup_logging

    try:
        setup_logging(cfg.log_level)
    except ValueError as exc:
        print(f"numa-agent: --log-level: {exc}", file=sys.stderr)
        return 1
    try:
        return Agent(cfg).run_until_signal()
    except StartupError as exc:
        log.error("%s", exc)
        print(f"numa-agent: {exc}", file=sys.stderr)
        return 1


class StartupError(Exception):
    pass


class Agent:
    """Wires the edges around the service; start(), stop()."""

    def __init__(self, cfg, hotplug_source=None) -> None:
        self.cfg = cfg
        self.api = self.metrics = self.loop = None
        self.hotplug = hotplug_source  # tests inject a fake; else kernel uevents
        self.service = None

    def start(self) -> "Agent":
        from numa_agent.admission.machine import MachineConfigError, build_machine
        from numa_agent.discovery.sysfs import DiscoveryError, read_topology
        from numa_agent.service.agent_service import AgentService
        from numa_agent.service.config import ConfigError
        from numa_agent.service.recovery import restore
        from numa_agent.state.checkpoint import CheckpointStore

        cfg = self.cfg
        try:
            topology = read_topology(cfg.sysfs_root)
        except DiscoveryError as exc:
            raise StartupError(f"topology discovery failed: {exc}") from None
        try:
            machine = build_machine(topology, cfg.policy)
        except MachineConfigError as exc:
            raise StartupError(f"configuration does not fit this machine: {exc}") from None
        log.info("machine: %d NUMA node(s) %s, %d usable CPUs, %d reserved (%s), %d PCI devices",
                 len(machine.node_ids), ",".join(map(str, machine.node_ids)), len(machine.usable_cpus),
                 len(machine.reserved_cpus), machine.reserved_cpus.format() or "-",
                 len(topology.pci_devices))
        enforcer = self._enforcer(machine)
        machine = self._within_cgroup_root(machine, enforcer)
        store = CheckpointStore(cfg.state_dir)
        try:
            enforcer.setup()
            state, report = restore(machine, store, enforcer, cfg.on_policy_change, uid_of=_uid_of)
        except ConfigError as exc:
            raise StartupError(str(exc)) from None
        except Exception as exc:
            raise StartupError(f"cannot restore state: {exc}") from None
        service = AgentService(machine, store, enforcer)
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

    def _within_cgroup_root(self, machine, enforcer):
        """In cgroup mode the agent hands out what its cgroup root is granted
        (`cpuset.*.effective`), not what its own process happens to be allowed:
        the two differ when the root is a partition the agent was not started
        in, or when the agent runs outside the subtree it manages."""
        from dataclasses import replace

        from numa_agent.admission.machine import MachineConfigError, build_machine

        if enforcer.mode != "cgroup" or enforcer.cgroup.is_fake:
            return machine
        cpus, mems = enforcer.cgroup.read_effective("")
        topo = machine.topology
        granted = replace(topo, allowed_cpus=cpus, allowed_mems=frozenset(mems.nodes()))
        if (granted.allowed_cpus, granted.allowed_mems) == (topo.allowed_cpus, topo.allowed_mems):
            return machine
        log.info("cgroup root %s grants cpus %s, mems %s", enforcer.cgroup.root, cpus.format(),
                 mems.format())
        try:
            return build_machine(granted, self.cfg.policy)
        except MachineConfigError as exc:
            raise StartupError(f"configuration does not fit what cgroup root {enforcer.cgroup.root} "
                               f"grants (cpus {cpus.format()}, mems {mems.format()}): {exc}") from None

    def _enforcer(self, machine):
        from numa_agent.enforcement.cgroup import CgroupV2
        from numa_agent.enforcement.enforcer import CgroupEnforcer
        from numa_agent.enforcement.fake_cgroupfs import make_fake_cgroup_root

        cfg = self.cfg
        root = cfg.cgroup_root
        if root == "none":
            return _fallback("cgroup enforcement disabled (cgroup_root = none)")
        if root == "auto" and os.path.abspath(cfg.sysfs_root) != "/":
            # The topology is a snapshot of another machine: pinning real
            # processes to its CPUs would be wrong. Simulate the cgroup tree.
            fake = Path(cfg.state_dir) / "cgroupfs"
            make_fake_cgroup_root(fake, machine.usable_cpus, machine.memory.memory_nodes.nodes()
                                  or machine.node_ids)
            log.warning("sysfs root %s is not this machine: enforcing into a simulated cgroup tree at %s",
                        cfg.sysfs_root, fake)
            return CgroupEnforcer(CgroupV2(fake))
        if root == "auto":
            root, why = _auto_cgroup_root()
            if root is None:
                return _fallback(why)
        cg = CgroupV2(root)
        caps = cg.probe()
        if not caps.usable:
            if cfg.cgroup_root == "auto":
                return _fallback(caps.reason)
            raise StartupError(f"cgroup root {root} cannot be used: {caps.reason}")
        log.info("enforcing with cgroup v2 below %s", root)
        return CgroupEnforcer(cg, domain_controllers=_may_use_domain_controllers(root),
                              partitions=cfg.cpuset_partitions)

    def _start_edges(self, machine) -> None:
        from numa_agent.api.server import ApiServer
        from numa_agent.service import sdnotify
        from numa_agent.service.runtime import EventLoop

        cfg = self.cfg
        service = self.service
        try:
            self.api = ApiServer(service, cfg.socket, socket_mode=cfg.socket_mode,
                                 socket_group=cfg.socket_group).start()
        except Exception as exc:
            raise StartupError(f"cannot serve the API on {cfg.socket}: {exc}") from None
        if cfg.metrics_address:
            from numa_agent.views.metrics import build_registry, start_metrics_server

            try:
                self.metrics = start_metrics_server(cfg.metrics_address,
                                                    build_registry(service.metrics_snapshot))
            except (OSError, ValueError) as exc:
                self.api.stop()
                raise StartupError(f"metrics: {exc}") from None
        if self.hotplug is None and cfg.hotplug and os.path.abspath(cfg.sysfs_root) == "/":
            from numa_agent.hotplug.events import HotplugUnavailable, UdevEventSource

            try:
                self.hotplug = UdevEventSource.open()
            except HotplugUnavailable as exc:
                log.warning("%s; the agent runs without hotplug", exc)
        self.loop = EventLoop(service, hotplug_source=self.hotplug, on_hotplug=self._on_hotplug,
                              watchdog_interval=_half(sdnotify.watchdog_interval()),
                              watchdog_ping=sdnotify.watchdog_ping).start()
        sdnotify.ready()
        sdnotify.status(f"{len(service.state.workloads)} workloads; enforcement "
                        f"{service.enforcer.mode}; socket {cfg.socket}")
        log.info("ready: socket %s, enforcement %s%s", cfg.socket, service.enforcer.mode,
                 f" ({service.enforcer.reason})" if service.enforcer.reason else "")

    def _on_hotplug(self, events) -> None:
        """Kernel events arrived (None: some were lost): re-read the machine."""
        from numa_agent.admission.machine import build_machine
        from numa_agent.discovery.sysfs import read_topology

        if events is None:
            log.warning("hotplug events were lost; rescanning sysfs")
        else:
            for event in events:
                self.service.counters.hotplug(event.kind)
                log.info("hotplug: %s %s %s", event.kind, event.action, event.id)
            if not events:
                return
        machine = build_machine(read_topology(self.cfg.sysfs_root), self.cfg.policy)
        self.service.replace_machine(machine)

    def stop(self) -> None:
        from numa_agent.service import sdnotify

        sdnotify.stopping()
        for part in (self.api, self.loop, self.metrics):
            if part is not None:
                part.stop()
        if self.hotplug is not None:
            self.hotplug.close()
        log.info("stopped; workloads keep running and keep their CPUs")

    def run_until_signal(self) -> int:
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        self.start()
        try:
            while not done.wait(3600):
                pass
        finally:
            self.stop()
        return 0


def _fallback(reason: str):
    from numa_agent.enforcement.enforcer import AffinityEnforcer

    log.warning("no usable cgroup v2 cpuset (%s): enforcing with CPU affinity instead; "
                "bookkeeping is identical, but child processes forked before admission "
                "and memory placement of other processes are not controlled", reason)
    return AffinityEnforcer(reason)


def _auto_cgroup_root() -> tuple[str | None, str]:
    """The agent's own cgroup when systemd delegated it (Delegate=yes), else
    a `numa-agent` cgroup below the hierarchy's root."""
    mount = "/sys/fs/cgroup"
    if not os.path.isfile(os.path.join(mount, "cgroup.controllers")):
        return None, f"no cgroup v2 hierarchy mounted at {mount}"
    try:
        own = _own_cgroup()
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc.strerror}"
    if own is None:
        return None, "this process is in no cgroup v2 hierarchy"
    if own not in ("/", "") and os.environ.get("INVOCATION_ID"):
        # Under systemd with Delegate=yes: the service's cgroup is ours. With
        # DelegateSubgroup=agent (systemd >= 254) we start one level down.
        if os.path.basename(own) == AGENT_CGROUP:
            own = os.path.dirname(own)
        return os.path.join(mount, own.lstrip("/")), ""
    path = os.path.join(mount, "numa-agent")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return None, f"cannot create {path}: {exc.strerror}"
    return path, ""


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path ("0::" line of /proc/self/cgroup), or None."""
    with open("/proc/self/cgroup") as f:
        return next((line.split("::", 1)[1].strip() for line in f if line.startswith("0::")), None)


def _may_use_domain_controllers(root: str) -> bool:
    """memory and hugetlb are domain controllers: once the service's cgroup
    enables them for its children it may hold no process, and systemd older
    than 254 (no DelegateSubgroup=) starts the restarted agent right there
    and fails (219/CGROUP). Without DelegateSubgroup, keep to the threaded
    controllers (cpuset, cpu, pids) so `systemctl restart` keeps working."""
    if not os.environ.get("INVOCATION_ID"):
        return True
    try:
        own = _own_cgroup() or ""
    except OSError:
        return True
    if os.path.basename(own) == AGENT_CGROUP:
        return True
    log.warning("systemd started the agent without DelegateSubgroup= (systemd < 254): memory and "
                "hugetlb limits are not enforced so that restarts keep working; CPU and memory-node "
                "pinning is unaffected")
    return False


def _uid_of(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return 0


def _half(interval):
    return interval / 2 if interval else None
