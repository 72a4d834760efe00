"""`numa-agent`: the daemon and its admin commands.

Each subcommand lives in its own module under numa_agent.cli with two functions:
``add_parser(subparsers)`` and ``run(args) -> int``. This file only wires them,
so `numa-agent topology` never imports the daemon's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from numa_agent import __version__
from numa_agent.cli import common

# subcommand name -> module under numa_agent.cli
SUBCOMMANDS = {
    "serve": "serve_cmd",
    "check-config": "check_config_cmd",
    "topology": "topology_cmd",
    "status": "status_cmd",
    "explain": "explain_cmd",
    "release": "release_cmd",
    "resize": "resize_cmd",
    "pod-resources": "pod_resources_cmd",
    "oci-hook": "oci_hook_cmd",
    "slurm-node": "slurm_node_cmd",
    "export": "export_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numa-agent",
        description="NUMA-aware node agent: discovers the machine, admits and pins workloads.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(f"numa_agent.cli.{module_name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return common.stdout_closed()


if __name__ == "__main__":
    sys.exit(main())
