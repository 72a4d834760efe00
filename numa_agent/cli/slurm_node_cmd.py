"""`numa-agent slurm-node [--config FILE] [--sysfs-root DIR|ARCHIVE] [--node-name NAME]`:
slurm.conf's NodeName line for this machine, agreeing with the agent's reservations."""

from __future__ import annotations

import argparse
import socket
import sys
from dataclasses import replace

PROG = "numa-agent slurm-node"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "slurm-node",
        help="print slurm.conf's NodeName line for this machine (CpuSpecList = the agent's reserved CPUs)",
        description="Discover the machine as `topology` does and print the NodeName line for slurm.conf: "
                    "sockets, cores, threads and memory, the CPUs the agent's configuration reserves as "
                    "CpuSpecList (in Slurm's abstract CPU ids, converted from the kernel's) and its "
                    "reserved memory as MemSpecLimit (MiB), so Slurm never counts a CPU the agent keeps.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n"
               "  numa-agent slurm-node --config /etc/numa-agent/config.toml >> /etc/slurm/slurm.conf\n")
    p.add_argument("--config", metavar="FILE",
                   help="the agent's TOML config file, for its reserved CPUs and memory "
                        "(default /etc/numa-agent/config.toml if present)")
    p.add_argument("--sysfs-root", metavar="DIR|ARCHIVE",
                   help="directory holding sys/ and proc/ (default: the config's, else /), or a snapshot "
                        "archive of one (.tar.gz, .tgz, .tar)")
    p.add_argument("--node-name", metavar="NAME",
                   help="the NodeName (default: this host's short name, as slurmd looks itself up)")
    p.set_defaults(func=run)


def run(args) -> int:
    from numa_agent.admission.machine import MachineConfigError, build_machine
    from numa_agent.core.slurm import SlurmShapeError, node_line, spec_note
    from numa_agent.daemon.config import ConfigError, load_config
    from numa_agent.discovery.sysfs import DiscoveryError, read_topology
    from numa_agent.service.snapshot import SnapshotError, extract_snapshot, is_archive, remove_snapshot

    scratch = None
    try:
        cfg = load_config(args.config, required=args.config is not None)
        if args.sysfs_root is not None:
            cfg = replace(cfg, sysfs_root=args.sysfs_root)
        root = cfg.sysfs_root
        if is_archive(root):
            scratch, extracted = extract_snapshot(root)
            root = str(extracted)
        topology = read_topology(root)
        machine = build_machine(topology, cfg.policy)
        reserved_memory = sum(per_node.get("memory", 0) for per_node in cfg.policy.reserved_memory.values())
        name = args.node_name or socket.gethostname().split(".")[0]
        line = node_line(name, topology, machine.reserved_cpus, reserved_memory)
        note = spec_note(topology, machine.reserved_cpus)
    except (ConfigError, DiscoveryError, SnapshotError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except MachineConfigError as exc:
        print(f"{PROG}: configuration does not fit this machine: {exc}", file=sys.stderr)
        return 1
    except SlurmShapeError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG}: {exc.filename or args.sysfs_root}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if scratch is not None:
            remove_snapshot(scratch)
    print(line)
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    return 0
