"""`numa-agent topology [--sysfs-root DIR|ARCHIVE] [--json] [--all-devices] [--pci-ids FILE]`:
what discovery sees."""

from __future__ import annotations

import json
import sys

from numa_agent.discovery.pci_ids import PCI_IDS_PATHS, PciIdsFile
from numa_agent.discovery.sysfs import DiscoveryError, read_topology
from numa_agent.service.snapshot import SnapshotError, extract_snapshot, is_archive, remove_snapshot
from numa_agent.views.topology_report import render_text, topology_to_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "topology",
        help="show the machine as discovery sees it (numactl -H style, or JSON)",
        description="Discover NUMA nodes, CPUs, caches, memory, hugepages and PCI devices "
                    "from sysfs/procfs and print them.",
    )
    p.add_argument("--sysfs-root", default="/", metavar="DIR|ARCHIVE",
                   help="directory holding sys/ and proc/ (default: /), or a snapshot archive of one "
                        "(.tar.gz, .tgz, .tar), as serve takes it")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--all-devices", action="store_true",
                   help="list every PCI device (bridges, uncore, DMA engines, USB ...), not only "
                        "network, storage, GPU, InfiniBand and accelerator devices")
    p.add_argument("--pci-ids", metavar="FILE", action="append",
                   help="the PCI ids database for vendor and device names (as lspci -i; default: the "
                        f"first of {', '.join(PCI_IDS_PATHS)}; if none is readable, ids are shown)")
    p.set_defaults(func=run)


def run(args) -> int:
    scratch = None
    try:
        root = args.sysfs_root
        if is_archive(root):
            scratch, root = extract_snapshot(root)
        topology = read_topology(root)
    except (DiscoveryError, SnapshotError) as exc:
        print(f"numa-agent topology: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a directory discovery may not list
        print(f"numa-agent topology: {exc.filename or args.sysfs_root}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    finally:
        if scratch is not None:  # discovery has read everything it needs
            remove_snapshot(scratch)
    names = PciIdsFile(args.pci_ids or PCI_IDS_PATHS).names(topology.pci_devices)
    if args.json:
        json.dump(topology_to_json(topology, names), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(topology, names, all_devices=args.all_devices))
    return 0
