"""`numa-agent slurm-node [--config FILE] [--sysfs-root DIR|ARCHIVE] [--node-name NAME]
[--gres | --gres-conf]`: slurm.conf's NodeName line for this machine, agreeing with the
agent's reservations, with `Gres=` for the agent's device resources (`--gres`), or
gres.conf's lines for them (`--gres-conf`)."""

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
        epilog="examples:\n"
               "  numa-agent slurm-node --config /etc/numa-agent/config.toml >> /etc/slurm/slurm.conf\n"
               "  numa-agent slurm-node --gres >> /etc/slurm/slurm.conf        # with Gres=gpu:4\n"
               "  numa-agent slurm-node --gres-conf >> /etc/slurm/gres.conf   # one line per device\n")
    p.add_argument("--config", metavar="FILE",
                   help="the agent's TOML config file, for its reserved CPUs and memory "
                        "(default /etc/numa-agent/config.toml if present)")
    p.add_argument("--sysfs-root", metavar="DIR|ARCHIVE",
                   help="directory holding sys/ and proc/ (default: the config's, else /), or a snapshot "
                        "archive of one (.tar.gz, .tgz, .tar)")
    p.add_argument("--node-name", metavar="NAME",
                   help="the NodeName (default: this host's short name, as slurmd looks itself up)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--gres", action="store_true",
                       help="add Gres=NAME:COUNT for the [devices] resources to the NodeName line "
                            "(slurm.conf then needs GresTypes= and gres.conf the lines of --gres-conf)")
    which.add_argument("--gres-conf", action="store_true",
                       help="print gres.conf's lines instead: one per device (File=, else Count=), "
                            "Cores= the Slurm cores of its NUMA node")
    p.set_defaults(func=run)


def run(args) -> int:
    from numa_agent.cli import common
    from numa_agent.core.slurm import SlurmShapeError, gres_types, node_line, spec_note

    try:
        cfg, topology, machine = common.offline_machine(args.config, args.sysfs_root)
        reserved_memory = sum(per_node.get("memory", 0) for per_node in cfg.policy.reserved_memory.values())
        name = args.node_name or socket.gethostname().split(".")[0]
        gres = _gres(topology, machine) if args.gres or args.gres_conf else []
        if args.gres_conf:
            lines = [g.text(name) for g in gres]
            note = None
        else:
            lines = [node_line(name, topology, machine.reserved_cpus, reserved_memory, gres)]
            note = spec_note(topology, machine.reserved_cpus)
    except (common.CliError, SlurmShapeError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    if args.gres:
        print(f"{PROG}: note: Gres= needs {gres_types(gres)} in slurm.conf and the lines of "
              f"`{PROG} --gres-conf` in gres.conf", file=sys.stderr)
    return 0


def _gres(topology, machine) -> list:
    """gres.conf's lines for the configured device resources; SlurmShapeError when
    there are none on this machine."""
    from numa_agent.core.slurm import SlurmShapeError, gres_lines

    by_address = {d.address: d for d in topology.pci_devices}
    resources = [(name, [by_address[d.address] for d in devices])
                 for name, devices in machine.devices.resources]
    gres = gres_lines(topology, resources)
    if not gres:
        configured = ", ".join(name for name, _ in resources)
        raise SlurmShapeError("no device resources to give Slurm: " + (
            f"the [devices] resources ({configured}) select no device of this machine" if configured
            else "the configuration has no [devices] resources"))
    return gres
