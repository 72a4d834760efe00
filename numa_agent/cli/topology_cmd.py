"""`numa-agent topology [--sysfs-root DIR] [--json]`: what discovery sees."""

from __future__ import annotations

import json
import sys

from numa_agent.discovery.sysfs import DiscoveryError, read_topology
from numa_agent.views.topology_report import render_text, topology_to_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "topology",
        help="show the machine as discovery sees it (numactl -H style, or JSON)",
        description="Discover NUMA nodes, CPUs, caches, memory, hugepages and PCI devices "
                    "from sysfs/procfs and print them.",
    )
    p.add_argument("--sysfs-root", default="/", metavar="DIR",
                   help="directory holding sys/ and proc/ (default: /)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        topology = read_topology(args.sysfs_root)
    except DiscoveryError as exc:
        print(f"numa-agent topology: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a directory discovery may not list
        print(f"numa-agent topology: {exc.filename or args.sysfs_root}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    if args.json:
        json.dump(topology_to_json(topology), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(topology))
    return 0
