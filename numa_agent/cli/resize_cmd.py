"""`numa-agent resize NAME [--cpus N] [--memory SIZE]`: grow or shrink a running
workload's exclusive CPUs and memory in place."""

from __future__ import annotations

import argparse

from numa_agent.cli import common
from numa_agent.cli.release_cmd import quote_name
from numa_agent.core import units

PROG = "numa-agent resize"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "resize", help="grow or shrink a running workload's CPUs and memory in place",
        description="Resize a running workload without restarting it. Growing keeps its CPUs and adds "
                    "free siblings of its cores, then whole cores of its NUMA nodes (other nodes only "
                    "under best-effort or none); shrinking gives back the CPUs added last, whole cores "
                    "first. Its cgroup (or, in the affinity fallback, its threads' affinity) follows "
                    "before the answer. Only its owner (or root) may resize it. A resize that cannot be "
                    "met is refused and changes nothing.")
    parser.add_argument("name", metavar="NAME", help="workload name (see `numa-agent status`)")
    parser.add_argument("--cpus", type=int, metavar="N", help="its new number of exclusive CPUs (at least 1)")
    parser.add_argument("--memory", type=common.parse_size, metavar="SIZE",
                        help="its new memory booking, e.g. 16Gi (as numa-run --memory takes it)")
    parser.add_argument("--json", action="store_true", help="print the agent's answer as JSON")
    common.add_socket_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.cpus is None and args.memory is None:
        common.print_error(PROG, "give --cpus N, --memory SIZE or both")
        return 2
    common.warn_small_sizes(PROG, [("--memory", args.memory)])
    body = {key: value for key, value in (("cpus", args.cpus), ("memory_bytes", args.memory)) if value is not None}
    try:
        _, answer = common.call(args, "PATCH", f"/v1/workloads/{quote_name(args.name)}", body)
    except common.AgentError as exc:
        common.report_agent_error(PROG, exc, as_json=args.json)
        return 1
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    if args.json:
        common.print_json(answer)
    else:
        memory = answer.get("memory_limit_bytes")
        print(f"resized {answer.get('name', args.name)}: cpus {answer.get('cpus') or '-'}"
              + (f", memory {units.format_bytes(memory)}" if memory else ""))
    return 0
