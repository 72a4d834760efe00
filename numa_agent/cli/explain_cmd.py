"""`numa-agent explain [allocation options]`: a dry run with the full reasoning.

Takes the same allocation options as numa-run. Exit status: 0 when the agent
would admit the request, 1 when it would refuse it or cannot be asked.
"""

from __future__ import annotations

import argparse
import sys

from numa_agent.cli import common

PROG = "numa-agent explain"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "explain", help="show how the agent would place a request (books nothing)",
        description="Ask the agent how it would place a request, with each resource's "
                    "NUMA hints and the merged hint. Nothing is booked. Exit 0 if it "
                    "would admit, 1 if it would refuse.")
    common.add_allocation_options(parser)
    parser.add_argument("--json", action="store_true", help="print the full decision record as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    common.warn_small_sizes(PROG, [("--memory", args.memory), ("--pod-memory", args.pod_memory)])
    try:
        body = common.build_request(args, context=common.placement_context(args))
        _, record = common.call(args, "POST", "/v1/workloads?dry_run=1", body)
    except common.AgentError as exc:
        common.report_agent_error(PROG, exc, as_json=args.json, heading="would refuse",
                                  stream=sys.stdout)
        return 1
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    if args.json:
        common.print_json(record)
    else:
        print("\n".join(common.decision_lines(record)))
    sys.stdout.flush()
    return 0
