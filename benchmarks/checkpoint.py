"""Checkpoint cost per acknowledged change: the whole-file save every
admission and release used to pay (encode, hash, write, fsync, `.prev`,
rename, fsync of the directory) against the journal's commit (append the
change, fdatasync; a snapshot inline every so often), at 10, 100 and 1000
workloads. Each commit is one change: a workload released or admitted, the
count staying near the size. Prints figures only; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.stats import fmt, percentile, table
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.units import format_bytes
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.model import AgentState, Booking, Workload

DEFAULT_SIZES = (10, 100, 1000)


class BenchError(Exception):
    pass


def workload(i: int) -> Workload:
    """A workload shaped like a real one: CPUs, memory on a node, a request, a command."""
    node = i % 2
    return Workload(
        name=f"inference-{i:05d}", owner_uid=1000 + i % 7, pid=10_000 + i, pid_identity=f"boot:{i}",
        created_unix=1_700_000_000.0 + i, command=("python", "-m", "server", f"--port={8000 + i}"),
        booking=Booking(cpus=CpuSet([2 * i, 2 * i + 1]), numa_nodes=(node,), mems=(node,),
                        memory={node: {"memory": 1 << 30}}, memory_group=(node,)),
        request={"cpus": 2, "memory_bytes": 1 << 30, "devices": {}, "hugepages": {}, "shared": False})


def changes(size: int, count: int) -> list[AgentState]:
    """`count` states after one of `size` workloads, each one change from the last."""
    state = AgentState(workloads=tuple(workload(i) for i in range(size)), policy_fingerprint="bench")
    out, fresh = [], size
    for n in range(count):
        if n % 2 == 0:
            state = state.without_workload(state.workloads[(n * 7919) % len(state.workloads)].name)
        else:
            state = state.with_workload(workload(fresh))
            fresh += 1
        out.append(state)
    return out


def timed(commit: Callable[[AgentState], Any], states: Sequence[AgentState]) -> list[float]:
    samples = []
    for state in states:
        started = time.perf_counter()
        commit(state)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def run_size(size: int, commits: int, directory: Path) -> dict[str, Any]:
    states = changes(size, commits)
    start = AgentState(workloads=tuple(workload(i) for i in range(size)), policy_fingerprint="bench")

    whole = CheckpointStore(directory / f"whole-{size}")
    whole.save(start.to_json())
    old = timed(lambda s: whole.save(s.to_json()), states)

    journal = CheckpointStore(directory / f"journal-{size}")
    journal.commit(start)
    kinds: list[str | None] = []
    new = timed(lambda s: kinds.append(journal.commit(s)), states)
    snapshot_bytes = journal.path.stat().st_size
    row = {"workloads": size, "commits": commits, "snapshot_bytes": snapshot_bytes,
           "snapshots": kinds.count("snapshot"), "journal_entries": kinds.count("journal")}
    for name, samples in (("whole", old), ("journal", new)):
        row[f"{name}_p50_ms"] = percentile(samples, 50)
        row[f"{name}_p99_ms"] = percentile(samples, 99)
        row[f"{name}_max_ms"] = max(samples)
    row["p50_ratio"] = row["whole_p50_ms"] / row["journal_p50_ms"]
    row["p99_ratio"] = row["whole_p99_ms"] / row["journal_p99_ms"]
    return row


def render(rows: list[dict[str, Any]], directory: str) -> str:
    headers = ["workloads", "snapshot", "whole p50", "whole p99", "journal p50", "journal p99",
               "journal max", "snapshots", "p50 ratio", "p99 ratio"]
    body = [[str(r["workloads"]), format_bytes(r["snapshot_bytes"]), fmt(r["whole_p50_ms"]),
             fmt(r["whole_p99_ms"]), fmt(r["journal_p50_ms"]), fmt(r["journal_p99_ms"]),
             fmt(r["journal_max_ms"]), f"{r['snapshots']}/{r['commits']}", f"{r['p50_ratio']:.1f}x",
             f"{r['p99_ratio']:.1f}x"]
            for r in rows]
    return (f"checkpoint commit per change, ms (state directory under {directory}; "
            "whole = the full save every change used to cost; snapshots = inline compactions "
            "among the journal's commits)\n" + table(headers, body))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench-checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="workload counts, comma-separated (default 10,100,1000)")
    p.add_argument("--commits", type=int, default=300, help="changes timed per size (default 300)")
    p.add_argument("--dir", help="where the state directories go (default: a temporary directory; "
                                 "use the agent's real filesystem for real fsync costs)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    try:
        try:
            sizes = [int(x) for x in args.sizes.split(",")]
        except ValueError:
            raise BenchError(f"--sizes: {args.sizes!r} is not a comma-separated list of numbers") from None
        if any(s < 1 for s in sizes):
            raise BenchError("every size must be at least 1")
        if args.commits < 2:
            raise BenchError(f"--commits must be at least 2, got {args.commits}")
    except BenchError as exc:
        print(f"bench-checkpoint: {exc}", file=sys.stderr)
        return 2
    if args.dir:
        try:
            Path(args.dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"bench-checkpoint: cannot use --dir {args.dir}: {exc.strerror}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-", dir=args.dir) as tmp:
        rows = [run_size(size, args.commits, Path(tmp)) for size in sizes]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(render(rows, args.dir or tempfile.gettempdir()))
    return 0
