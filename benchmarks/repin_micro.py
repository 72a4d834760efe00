"""Benchmark (a script, not a test): what the affinity fallback pays per
shared process when the shared pool changes (an exclusive admission or
release re-pins every process on the pool: the kernel has no inheritance for
affinity), against the floor of one /proc/PID/task listing and one
sched_setaffinity per thread.

N sleeping processes (one thread each) are tracked as plain shared workloads
by an AffinityEnforcer; the pool alternates between two CPU sets. Measured
per count (median of the repeats, per process):

- floor: os.listdir(/proc/PID/task) and os.sched_setaffinity(PID) per process,
  nothing else;
- pin_trees: the enforcer's re-pin of those processes and their descendants
  (pin, list the threads, read the children of each thread: a followed
  process's threads and main thread's children through the descriptors held
  since it was followed);
- apply: AffinityEnforcer.apply when the pool changes, as an exclusive admission
  hands it over (the pool's spec changed, its followers not named): the plan,
  each process's pidfd asked whether it is still the one admitted, the re-pin.

Run: python benchmarks/repin_micro.py [COUNTS...]   (default 10 100 1000)
"""

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stats import table  # noqa: E402
from numa_agent.core.cpuset import CpuSet  # noqa: E402
from numa_agent.enforcement import affinity_enforcer as enforcer_module  # noqa: E402
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer  # noqa: E402
from numa_agent.enforcement.plan import SHARED_CGROUP, CgroupSpec  # noqa: E402

REPEATS = 15


def median_us_per(fn, count: int) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / count * 1e6


def measure(count: int, pools: tuple[CpuSet, CpuSet]) -> list[str]:
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    enforcer = AffinityEnforcer("benchmark")
    try:
        pids = [p.pid for p in procs]
        # As update_layout hands them over when an exclusive admission or release
        # changes the pool: the pool's own spec changed, its followers not named.
        layouts = []
        for pool in pools:
            layout = {f"shared/s{i}": CgroupSpec(f"shared/s{i}", pool, (0,), workload=f"s{i}",
                                                 pid=pid, inherit=True)
                      for i, pid in enumerate(pids)}
            layouts.append({SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0,)), **layout})
        for i, pid in enumerate(pids):
            enforcer.track(f"shared/s{i}", pid)
        held = {pid: f.held for i, pid in enumerate(pids)
                if (f := enforcer._followed.get(f"shared/s{i}")) is not None and f.held is not None}
        turn = [0]
        ids = [pool.ids() for pool in pools]

        def floor() -> None:
            cpus = ids[turn[0] % 2]
            turn[0] += 1
            for pid in pids:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.sched_setaffinity(int(tid), cpus)

        def pin_trees() -> None:
            enforcer_module._pin_trees(pids, pools[turn[0] % 2], finder=enforcer_module._Tasks(held=held))
            turn[0] += 1

        def apply() -> None:
            old, new = layouts[turn[0] % 2], layouts[(turn[0] + 1) % 2]
            turn[0] += 1
            enforcer.apply(old, new, changed=frozenset({SHARED_CGROUP}))

        figures = {name: median_us_per(fn, count) for name, fn in
                   (("floor", floor), ("pin_trees", pin_trees), ("apply", apply))}
        return [str(count), *(f"{figures[k]:.1f}" for k in ("floor", "pin_trees", "apply")),
                f"{figures['pin_trees'] / figures['floor']:.2f}x", f"{figures['apply'] / figures['floor']:.2f}x",
                f"{figures['apply'] * count / 1000:.1f}"]
    finally:
        enforcer.close()
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


def main(argv: list[str]) -> int:
    counts = [int(a) for a in argv] or [10, 100, 1000]
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        print("repin_micro: needs two CPUs to alternate between", file=sys.stderr)
        return 2
    pools = (CpuSet(allowed), CpuSet(allowed[:-1]))
    rows = [measure(count, pools) for count in counts]
    print(f"re-pin of N one-thread processes between CPUs {pools[0].format()} and {pools[1].format()}; "
          f"median of {REPEATS}, µs per process")
    print(table(["N", "floor", "pin_trees", "apply", "pin/floor", "apply/floor", "apply ms"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
