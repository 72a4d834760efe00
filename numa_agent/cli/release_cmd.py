"""`numa-agent release NAME`: end a workload's allocation."""

from __future__ import annotations

import argparse

from numa_agent.cli import common

PROG = "numa-agent release"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "release", help="release a workload's CPUs, memory and devices",
        description="Release a workload. Only its owner (or root) may release it.")
    parser.add_argument("name", metavar="NAME", help="workload name (see `numa-agent status`)")
    parser.add_argument("--json", action="store_true", help="print the agent's answer as JSON")
    common.add_socket_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if "/" in args.name or args.name in ("", ".", ".."):
        common.print_error(PROG, f"invalid workload name {args.name!r}")
        return 1
    try:
        _, answer = common.call(args, "DELETE", f"/v1/workloads/{_quote(args.name)}")
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    if args.json:
        common.print_json(answer)
    else:
        cpus = answer.get("cpus")
        print(f"released {answer.get('name', args.name)}" + (f" (cpus {cpus})" if cpus else ""))
    return 0


def _quote(name: str) -> str:
    # The agent rejects anything outside its name rule; percent-encode so the
    # request line stays well-formed and the agent's message names the input.
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in name)
