"""`numa-agent slurm-node [--config FILE] [--sysfs-root DIR|ARCHIVE] [--node-name NAME]`:
slurm.conf's NodeName line for this machine, agreeing with the agent's reservations."""

from __future__ import annotations

import argparse
import socket
import sys

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
    from numa_agent.cli import common
    from numa_agent.core.slurm import SlurmShapeError, node_line, spec_note

    try:
        cfg, topology, machine = common.offline_machine(args.config, args.sysfs_root)
        reserved_memory = sum(per_node.get("memory", 0) for per_node in cfg.policy.reserved_memory.values())
        name = args.node_name or socket.gethostname().split(".")[0]
        line = node_line(name, topology, machine.reserved_cpus, reserved_memory)
        note = spec_note(topology, machine.reserved_cpus)
    except (common.CliError, SlurmShapeError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(line)
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    return 0
