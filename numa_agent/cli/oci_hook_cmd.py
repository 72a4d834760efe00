"""`numa-agent oci-hook STAGE`: the OCI hook podman and CRI-O run (see numa_agent.engines.oci_hook)."""

from __future__ import annotations

import argparse
import sys

from numa_agent.cli import common
from numa_agent.core.printable import printable
from numa_agent.engines import oci_hook

PROG = "numa-agent oci-hook"
SYSLOG_IDENT = "numa-agent-oci-hook"  # journalctl -t numa-agent-oci-hook


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "oci-hook", help="the OCI hook for podman and CRI-O (reads the container's state on stdin)",
        description="Run by a container engine from its hooks.d definition, with the container's OCI "
                    "state on stdin. A container annotated numa-agent.io/... is admitted at createRuntime "
                    "(or prestart) and enforced on its own cgroup; a refusal, a bad annotation or an "
                    "unreachable agent exits 1, so the engine does not start it. poststop releases it. A "
                    "container without those annotations is left alone (exit 0, the agent is not asked).")
    parser.add_argument("stage", metavar="STAGE", choices=oci_hook.STAGES,
                        help="the OCI hook stage: " + ", ".join(oci_hook.STAGES))
    common.add_socket_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    raw = sys.stdin.buffer.read(oci_hook.MAX_STATE_BYTES + 1)
    status, lines = oci_hook.run(args.stage, raw, common.resolve_socket(args),
                                 refusal_lines=common.refusal_lines)
    lines = [printable(line) for line in lines]  # they quote the container's annotations and id
    for line in lines:
        print(line, file=sys.stderr)
    if lines:
        _to_system_log(lines)
    return status


def _to_system_log(lines: list[str]) -> None:
    """The reason in the system log too: crun sends a hook's stderr to /dev/null (unless the
    container has the run.oci.hooks.stderr annotation) and the engine prints only the exit code."""
    import syslog

    syslog.openlog(SYSLOG_IDENT, 0, syslog.LOG_DAEMON)
    for line in lines:
        syslog.syslog(syslog.LOG_ERR, line)
    syslog.closelog()
