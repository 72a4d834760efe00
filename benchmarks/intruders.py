"""The intruder scan's cost on this machine: N sleeping threads are started
(in a child process, bounded, killed at the end), then the agent's own scan
(ProcReader over /proc, IntruderWatcher.scan_once) is timed against one
workload holding the last CPU, with its cgroup empty, so that every task
found there is read in full (the worst case). Two placements: the threads
where the scheduler put them, and all of them on that CPU (each one an
intruder: stat, the process's cgroup, the task's status). Prints ms per
scan (wall and CPU) and the CPU share at the default rate (one scan every
2 s); nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from typing import Sequence

from benchmarks.stats import fmt, percentile, table
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon.config import AgentConfig
from numa_agent.observe.model import Guarded
from numa_agent.observe.procfs import ProcReader
from numa_agent.observe.watcher import IntruderWatcher

MAX_TASKS = 20_000  # a bound on what this script starts
# The child: N threads blocked on one event until stdin closes.
_SLEEPERS = """
import sys, threading
threading.stack_size(64 * 1024)
done = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=done.wait, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def start_sleepers(count: int, cpu: int | None) -> subprocess.Popen:
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    child = subprocess.Popen([sys.executable, "-c", _SLEEPERS, str(count)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=pin)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError("the sleeping threads did not start")
    return child


def stop(child: subprocess.Popen) -> None:
    child.kill()
    child.wait(30)


def measure(scans: int, cpu: int) -> dict:
    logging.getLogger("numa_agent.observe").setLevel(logging.ERROR)  # one line per intruder otherwise
    guarded = Guarded("bench", CpuSet([cpu]), cgroup="/numa-agent-bench/none")
    watcher = IntruderWatcher(lambda: [guarded], ProcReader("/proc"), 2.0)
    watcher.scan_once()  # warm the dentry cache, as every scan after the first finds it
    wall, cpu_ms, last = [], [], None
    for _ in range(scans):
        c0, t0 = time.process_time(), time.perf_counter()
        last = watcher.scan_once()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu_ms.append((time.process_time() - c0) * 1000)
    assert last is not None
    interval_ms = AgentConfig().intruder_scan_seconds * 1000
    return {"tasks": last.tasks, "found": len(last.intruders),  # kernel threads among them
            "wall_ms_p50": percentile(wall, 50), "wall_ms_p90": percentile(wall, 90),
            "cpu_ms_p50": percentile(cpu_ms, 50),
            "cpu_share_at_default_rate": percentile(cpu_ms, 50) / interval_ms}  # type: ignore[operator]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-intruders", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="sleeping threads to start (default 2000)")
    parser.add_argument("--scans", type=int, default=30, help="timed scans per placement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 0 < args.tasks <= MAX_TASKS:
        parser.error(f"--tasks must be 1..{MAX_TASKS}")
    cpu = max(os.sched_getaffinity(0))
    results = {}
    for placement, pin in (("spread", None), (f"all on CPU {cpu}", cpu)):
        child = start_sleepers(args.tasks, pin)
        try:
            results[placement] = measure(args.scans, cpu)
        finally:
            stop(child)
    if args.json:
        print(json.dumps({"started_threads": args.tasks, "guarded_cpu": cpu, "results": results}, indent=2))
        return 0
    print(f"intruder scan: {args.tasks} sleeping threads started; one workload holds CPU {cpu}; "
          f"{args.scans} scans each; default rate one scan per {AgentConfig().intruder_scan_seconds:g} s")
    rows = [[placement, str(r["tasks"]), str(r["found"]), fmt(r["wall_ms_p50"], 2), fmt(r["wall_ms_p90"], 2),
             fmt(r["cpu_ms_p50"], 2), f"{r['cpu_share_at_default_rate']:.2%}"] for placement, r in results.items()]
    print(table(["threads", "tasks", "found there", "ms p50", "ms p90", "cpu ms p50", "cpu share"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
