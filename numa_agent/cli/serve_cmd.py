"""`numa-agent serve`: run the agent in the foreground (systemd Type=notify)."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from numa_agent.core.printable import printable

if TYPE_CHECKING:
    pass

log = logging.getLogger("numa_agent.serve")

# sysexits.h EX_CONFIG: the configuration is wrong, so no restart can help; the unit's
# RestartPreventExitStatus=78 keeps systemd from restarting it in a loop. Every other
# failed start exits 1 and is restarted.
EX_CONFIG = 78


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="run the agent in the foreground",
        description="Discover the machine, restore the checkpoint, then admit and pin workloads "
                    "until SIGTERM. Flags override the config file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  numa-agent serve --config /etc/numa-agent/config.toml\n"
               "  numa-agent serve --state-dir .run/state --socket .run/agent.sock   (developer box)\n"
               "  numa-agent serve --sysfs-root machine.tar.gz --state-dir /tmp/s --socket /tmp/s.sock\n"
               "      (another machine's snapshot, a directory or an archive: enforced into a simulated\n"
               "       cgroup tree under the state directory; nothing is pinned for real)\n")
    p.add_argument("--config", metavar="FILE",
                   help="TOML config file (default /etc/numa-agent/config.toml if present)")
    p.add_argument("--sysfs-root", metavar="DIR|ARCHIVE",
                   help="directory holding sys/ and proc/ (default /), or a snapshot archive of one "
                        "(.tar.gz, .tgz, .tar)")
    p.add_argument("--cgroup-root", metavar="DIR|auto|none",
                   help="the agent's cgroup v2 directory; 'auto' (default) finds it, 'none' forces the "
                        "CPU-affinity fallback")
    p.add_argument("--state-dir", metavar="DIR", help="checkpoint directory (default /var/lib/numa-agent)")
    p.add_argument("--socket", metavar="PATH", help="API socket path (default /run/numa-agent/agent.sock)")
    p.add_argument("--socket-group", metavar="GROUP", help="group allowed to use the socket (mode 0660)")
    p.add_argument("--metrics-address", metavar="HOST:PORT|unix:PATH",
                   help="Prometheus metrics (default 127.0.0.1:9464, readable by every local user; "
                        "unix:PATH, a socket with the API socket's mode and group, limits it to that group; "
                        "'' disables)")
    p.add_argument("--pod-resources-socket", metavar="PATH",
                   help="PodResources v1 gRPC socket (default: pod-resources.sock beside --socket; '' disables)")
    p.add_argument("--kubelet-state-dir", metavar="DIR",
                   help="directory of cpu_manager_state and memory_manager_state (default: the state "
                        "directory; '' disables)")
    p.add_argument("--log-level", metavar="LEVEL", help="debug, info (default), warning, error")
    p.add_argument("--no-hotplug", action="store_true", help="do not follow hardware changes: no kernel hotplug events "
                   "(CPUs, memory, NUMA nodes, PCI devices), no reading of the nodes' memory figures every 5 s")
    p.set_defaults(func=run)


# flag (argparse dest) -> the AgentConfig field it overrides
_FLAGS = ("sysfs_root", "cgroup_root", "state_dir", "socket", "socket_group", "log_level",
          "metrics_address", "pod_resources_socket", "kubelet_state_dir")


def effective_config(args):
    """The file's settings with the flags over them; ConfigError naming the
    flag, or the file and the key, of a wrong value. `args` may lack the flags
    (check-config has --config alone)."""
    from numa_agent.daemon.config import (
        DEFAULT_CONFIG,
        ConfigError,
        agent_value,
        check_endpoints_apart,
        load_config,
    )
    from numa_agent.service.caller import unknown_quota_names

    cfg = load_config(args.config, required=args.config is not None)
    unknown = unknown_quota_names(cfg.quotas)  # the user database: asked once, at start
    if unknown:
        raise ConfigError(f"{args.config or DEFAULT_CONFIG}: {unknown[0]}")
    overrides = {}
    for key in _FLAGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        try:
            overrides[key] = agent_value(key, value)
        except ValueError as exc:
            raise ConfigError(f"--{key.replace('_', '-')}: {exc}") from None
    if getattr(args, "no_hotplug", False):
        overrides["hotplug"] = False
    cfg = replace(cfg, **overrides)
    for key, flag, where, group in (("socket_group", "--socket-group", "agent.socket_group", cfg.socket_group),
                                    ("isolate_group", None, "isolation.group", cfg.isolate_group)):
        if group is not None and not _group_exists(group):
            named = flag if key in overrides else f"{args.config or DEFAULT_CONFIG}: {where}"
            raise ConfigError(f"{named}: no group named {group!r}")
    check_endpoints_apart(cfg)
    return cfg


def _group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def run(args) -> int:
    from numa_agent.daemon.config import ConfigError

    try:
        cfg = effective_config(args)
    except ConfigError as exc:
        return refused(exc, EX_CONFIG)
    from numa_agent.daemon.logging_setup import setup_logging

    setup_logging(cfg.log_level)  # checked with the configuration
    from numa_agent.daemon.startup import Agent, StartupConfigError, StartupError, one_line

    try:
        return Agent(cfg, read_config=lambda: effective_config(args)).run_until_signal()
    except StartupError as exc:
        log.error("%s", one_line(exc))
        return refused(exc, EX_CONFIG if isinstance(exc, StartupConfigError) else 1)
    except Exception as exc:  # a bug: one line for the operator, the trace at debug level
        log.debug("start-up failed", exc_info=True)
        return refused(f"start-up failed unexpectedly: {type(exc).__name__}: {exc} "
                       "(run with --log-level debug for the trace)", 1)


def refused(what: object, code: int) -> int:
    """`what` as the one line `numa-agent: ...` on stderr; `code`, to exit with."""
    from numa_agent.daemon.startup import one_line

    print(printable(f"numa-agent: {one_line(what)}"), file=sys.stderr)
    return code
