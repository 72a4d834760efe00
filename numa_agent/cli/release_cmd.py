"""`numa-agent release NAME` / `numa-agent release --slurm-job ID`: end a workload's
allocation, or every allocation of a Slurm job (what the shipped Epilog runs)."""

from __future__ import annotations

import argparse

from numa_agent.cli import common

PROG = "numa-agent release"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "release", help="release a workload's CPUs, memory and devices",
        description="Release a workload. Only its owner (or root) may release it. With --slurm-job, "
                    "release every workload of that Slurm job (named slurm-ID-STEP-TASK-uUID by numa-run): "
                    "exit 0 when none is left, also when there was none.")
    parser.add_argument("name", metavar="NAME", nargs="?", help="workload name (see `numa-agent status`)")
    parser.add_argument("--slurm-job", metavar="ID",
                        help="release every workload of this Slurm job ($SLURM_JOB_ID in an Epilog)")
    parser.add_argument("--json", action="store_true", help="print the agent's answer as JSON")
    common.add_socket_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if (args.name is None) == (args.slurm_job is None):
        common.print_error(PROG, "give either a workload NAME or --slurm-job ID")
        return 2
    if args.slurm_job is not None:
        return release_slurm_job(args, args.slurm_job.strip())
    if "/" in args.name or args.name in ("", ".", ".."):
        common.print_error(PROG, f"invalid workload name {args.name!r}")
        return 1
    try:
        _, answer = common.call(args, "DELETE", f"/v1/workloads/{quote_name(args.name)}")
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    if args.json:
        common.print_json(answer)
    else:
        cpus = answer.get("cpus")
        print(f"released {answer.get('name', args.name)}" + (f" (cpus {cpus})" if cpus else ""))
    return 0


def release_slurm_job(args: argparse.Namespace, job: str) -> int:
    """Release the workloads named `slurm-<job>-...`. One line per workload released; exit 0
    when nothing of the job is left (none matched, or another release won the race), 1 if
    the agent is unreachable or refused a release."""
    from numa_agent.core.slurm import is_job_id, job_prefix

    if not is_job_id(job):
        common.print_error(PROG, f"--slurm-job: {job!r} is not a Slurm job id (a number)")
        return 2
    prefix = job_prefix(job)
    try:
        _, listing = common.call(args, "GET", "/v1/workloads")
    except common.CliError as exc:
        common.print_error(PROG, str(exc))
        return 1
    names = sorted(w["name"] for w in listing.get("workloads", []) if str(w.get("name", "")).startswith(prefix))
    released, failed = [], 0
    for name in names:
        try:
            _, answer = common.call(args, "DELETE", f"/v1/workloads/{quote_name(name)}")
        except common.AgentError as exc:
            if exc.status == 404:  # released meanwhile (its cgroup emptied): nothing left to do
                continue
            common.print_error(PROG, f"{name}: {exc}")
            failed += 1
            continue
        except common.CliError as exc:
            common.print_error(PROG, f"{name}: {exc}")
            failed += 1
            continue
        released.append(answer)
        if not args.json:
            cpus = answer.get("cpus")
            print(f"released {answer.get('name', name)}" + (f" (cpus {cpus})" if cpus else ""))
    if args.json:
        common.print_json({"slurm_job": job, "released": released})
    elif not names:
        print(f"no workloads of Slurm job {job}")
    return 1 if failed else 0


def quote_name(name: str) -> str:
    # The agent rejects anything outside its name rule; percent-encode so the
    # request line stays well-formed and the agent's message names the input.
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in name)
