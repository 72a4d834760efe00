"""`numa-agent export nrt [-o json|yaml] [--node-name NAME] [--socket PATH | --sysfs-root DIR|ARCHIVE
--config FILE]`: this node's NodeResourceTopology object (views/nrt.py) for
`kubectl apply -f -`, from the running agent (its bookings make `available`)
or, with --sysfs-root or --config, from the machine alone (available ==
allocatable)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

from numa_agent.cli import common

PROG = "numa-agent export"
KINDS = ("nrt",)
FORMATS = ("json", "yaml")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="print this node's NodeResourceTopology object for the Kubernetes scheduler",
        description="Print this node's NodeResourceTopology object (topology.node.k8s.io/v1alpha2): one "
                    "zone per NUMA node with cpu, memory, hugepages and device resources (capacity, "
                    "allocatable, available), the distances as costs, and the topology manager's policy, "
                    "scope and options as attributes, the way the topology-aware scheduler plugin reads "
                    "them. By default the running agent answers (GET /v1/nrt), so available counts its "
                    "bookings; with --sysfs-root or --config the object is built from the machine and the "
                    "configuration alone, nothing booked.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n"
               "  numa-agent export nrt --node-name \"$NODE_NAME\" | kubectl apply -f -\n")
    p.add_argument("kind", choices=KINDS, help="what to export: nrt, the NodeResourceTopology object")
    p.add_argument("-o", "--output", choices=FORMATS, default="json",
                   help="json (default) or yaml; kubectl takes either")
    p.add_argument("--node-name", metavar="NAME",
                   help="the Kubernetes node the object describes (default: this host's name)")
    p.add_argument("--sysfs-root", metavar="DIR|ARCHIVE",
                   help="build from this sys/ and proc/ tree, or a snapshot archive of one, instead of asking "
                        "the agent")
    p.add_argument("--config", metavar="FILE",
                   help="build from the machine with this TOML config (its policies and reservations) "
                        "instead of asking the agent")
    common.add_socket_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        obj = _from_machine(args) if args.sysfs_root is not None or args.config is not None else _from_agent(args)
    except common.AgentError as exc:
        common.report_agent_error(PROG, exc)
        return 1
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    obj["metadata"] = {**obj.get("metadata", {}), "name": args.node_name or socket.gethostname()}
    if args.output == "yaml":
        sys.stdout.write(to_yaml(obj))
    else:
        common.print_json(obj)
    return 0


def _from_agent(args: argparse.Namespace) -> dict[str, Any]:
    _, obj = common.call(args, "GET", "/v1/nrt")
    return obj


def _from_machine(args: argparse.Namespace) -> dict[str, Any]:
    from numa_agent.state.model import AgentState
    from numa_agent.views.nrt import node_resource_topology

    _, _, machine = common.offline_machine(args.config, args.sysfs_root)
    return node_resource_topology(machine, AgentState(policy_fingerprint=machine.policy.fingerprint()),
                                  args.node_name or socket.gethostname())


# ---- YAML, for this object's shape -----------------------------------------------
def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar


def to_yaml(value: Any) -> str:
    """Block-style YAML of mappings, sequences, strings, integers, booleans and
    None: the shapes the object has; every string quoted, so none reads as
    another type."""
    lines: list[str] = []
    _emit(value, 0, lines)
    return "".join(f"{line}\n" for line in lines)


def _emit(value: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            lines.append(pad + "{}")
        for key, item in value.items():
            head = f"{pad}{_scalar(key) if not str(key).isidentifier() else key}:"
            _emit_child(head, item, indent, lines)
    elif isinstance(value, list):
        if not value:
            lines.append(pad + "[]")
        for item in value:
            if isinstance(item, dict) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                lines.append(f"{pad}- {sub[0][indent + 2:]}")
                lines.extend(sub[1:])
            else:
                _emit_child(f"{pad}-", item, indent, lines)
    else:
        lines.append(pad + _scalar(value))


def _emit_child(head: str, item: Any, indent: int, lines: list[str]) -> None:
    if isinstance(item, (dict, list)) and item:
        lines.append(head)
        _emit(item, indent + 2, lines)
    elif isinstance(item, dict):
        lines.append(f"{head} {{}}")
    elif isinstance(item, list):
        lines.append(f"{head} []")
    else:
        lines.append(f"{head} {_scalar(item)}")
