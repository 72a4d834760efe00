"""`numa-agent topology [--sysfs-root DIR|ARCHIVE] [--json] [--all-devices] [--pci-ids FILE]`:
what discovery sees."""

from __future__ import annotations

import json
import os
import sys

from numa_agent.api.client import ClientError, request
from numa_agent.cli import common
from numa_agent.core.printable import printable
from numa_agent.discovery.pci_ids import PCI_IDS_PATHS, PciIdsFile
from numa_agent.discovery.sysfs import DiscoveryError
from numa_agent.service.snapshot import SnapshotError
from numa_agent.views.topology_report import render_text, topology_to_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "topology",
        help="show the machine as discovery sees it (numactl -H style, or JSON)",
        description="Discover NUMA nodes, CPUs, caches, memory, hugepages and PCI devices "
                    "from sysfs/procfs and print them.",
    )
    p.add_argument("--sysfs-root", default=None, metavar="DIR|ARCHIVE",
                   help="directory holding sys/ and proc/ (/ is this host), or a snapshot archive of one "
                        "(.tar.gz, .tgz, .tar), as serve takes it; default: the machine the agent at --socket "
                        "reads, this host or the one it simulates (said on stderr); / when no agent answers")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--all-devices", action="store_true",
                   help="list every PCI device (bridges, uncore, DMA engines, USB ...), not only "
                        "network, storage, GPU, InfiniBand and accelerator devices")
    p.add_argument("--pci-ids", metavar="FILE", action="append",
                   help="the PCI ids database for vendor and device names (as lspci -i; default: the "
                        f"first of {', '.join(PCI_IDS_PATHS)}; if none is readable, ids are shown)")
    common.add_socket_option(p)
    p.set_defaults(func=run)


def agent_machine(args) -> str | None:
    """The machine the agent at --socket simulates (its --sysfs-root, a directory or an
    archive), or None when it reads this host or no agent answers within a moment."""
    try:
        status, health = request(common.resolve_socket(args), "GET", "/v1/health", timeout=2, busy_retry=0)
    except ClientError:
        return None
    source = health.get("sysfs_root") if status == 200 else None
    if not isinstance(source, str) or os.path.abspath(source) == "/":
        return None
    return source


def run(args) -> int:
    topology = None
    if args.sysfs_root is None:
        # Follow the agent: show the machine it places work on, which it read from a path
        # on this host (the agent answers on a local socket).
        args.sysfs_root = "/"
        source = agent_machine(args)
        socket_path = common.resolve_socket(args)
        if source is not None:
            try:
                topology = common.discover_at(source)
            except (DiscoveryError, SnapshotError, OSError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                print(printable(f"numa-agent topology: note: this is this host's machine, not the one the agent at "
                                f"{socket_path} simulates ({source}: {why})"), file=sys.stderr)
            else:
                print(printable(f"numa-agent topology: the machine the agent at {socket_path} simulates ({source}); "
                                "--sysfs-root / shows this host"), file=sys.stderr)
    try:
        if topology is None:
            topology = common.discover_at(args.sysfs_root)
    except (DiscoveryError, SnapshotError) as exc:
        print(printable(f"numa-agent topology: {exc}"), file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a directory discovery may not list
        print(printable(f"numa-agent topology: {exc.filename or args.sysfs_root}: {exc.strerror or exc}"),
              file=sys.stderr)
        return 1
    names = PciIdsFile(args.pci_ids or PCI_IDS_PATHS).names(topology.pci_devices)
    if args.json:
        json.dump(topology_to_json(topology, names), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        # Names from pci.ids and a snapshot's files: any control in them is escaped.
        text = render_text(topology, names, all_devices=args.all_devices)
        sys.stdout.write("".join(printable(line) + "\n" for line in text.splitlines()))
    return 0
