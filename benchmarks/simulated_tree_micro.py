"""Benchmark (a script, not a test): the cost of one write to the simulated
cgroup tree (`SimulatedCgroupfs`, the backend of `numa-agent serve --sysfs-root`)
with 10, 100 and 1000 cgroups in it.

The tree is shaped like the agent's: `agent/` holding this process, half the
cgroups `wl-<i>` with one exclusive CPU each, the other half `shared/<i>` with
an empty `cpuset.cpus` (inheriting the pool's CPUs), one sleeping process in
every workload cgroup. Measured per operation (median of the repeats):

- a workload's `cpuset.cpus` (what an admission or a resize writes);
- the shared pool's `cpuset.cpus` (every inheriting child follows it);
- moving a process between two workload cgroups (`cgroup.procs`);
- mkdir then rmdir of a workload cgroup.

Run: python benchmarks/simulated_tree_micro.py [COUNTS...]   (default 10 100 1000)
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stats import table  # noqa: E402
from numa_agent.core.cpuset import CpuSet  # noqa: E402
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root  # noqa: E402

MACHINE = CpuSet(range(2048))


def build(root: Path, count: int, sleepers: list) -> SimulatedCgroupfs:
    make_simulated_cgroup_root(root, MACHINE, [0, 1])
    fake = SimulatedCgroupfs(root)
    fake.mkdir(root / "agent")
    fake.write(root / "agent" / "cgroup.procs", str(os.getpid()))
    fake.write(root / "cgroup.subtree_control", "+cpuset +cpu +memory +hugetlb")
    fake.mkdir(root / "shared")
    fake.write(root / "shared" / "cgroup.subtree_control", "+cpuset +cpu +memory +hugetlb")
    fake.write(root / "shared" / "cpuset.mems", "0-1")
    fake.write(root / "shared" / "cpuset.cpus", f"{count}-2047")
    for i in range(count):
        directory = root / f"wl-{i}" if i % 2 == 0 else root / "shared" / f"s{i}"
        fake.mkdir(directory)
        if i % 2 == 0:
            fake.write(directory / "cpuset.mems", "0")
            fake.write(directory / "cpuset.cpus", str(i))
        proc = subprocess.Popen(["sleep", "600"])
        sleepers.append(proc)
        fake.write(directory / "cgroup.procs", str(proc.pid))
    return fake


def median_ms(fn, repeat: int) -> float:
    samples = []
    for n in range(repeat):
        start = time.perf_counter()
        fn(n)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def measure(count: int, repeat: int) -> list[str]:
    sleepers: list = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cg"
        try:
            fake = build(root, count, sleepers)
            leaf = root / "wl-0" / "cpuset.cpus"
            pool = root / "shared" / "cpuset.cpus"
            mover = sleepers[0].pid
            targets = (root / "wl-2", root / "wl-0") if count > 2 else (root / "wl-0", root / "wl-0")
            leaf_ms = median_ms(lambda n: fake.write(leaf, str(0 if n % 2 else 2047)), repeat)
            pool_ms = median_ms(lambda n: fake.write(pool, f"{count + n % 2}-2047"), repeat)
            move_ms = median_ms(lambda n: fake.write(targets[n % 2] / "cgroup.procs", str(mover)), repeat)

            def mkdir_rmdir(n: int) -> None:
                fake.mkdir(root / "wl-bench")
                fake.rmdir(root / "wl-bench")

            dir_ms = median_ms(mkdir_rmdir, repeat)
        finally:
            for proc in sleepers:
                proc.kill()
                proc.wait()
    return [str(count), f"{leaf_ms:.3f}", f"{pool_ms:.3f}", f"{move_ms:.3f}", f"{dir_ms:.3f}"]


def main(argv: list[str]) -> None:
    # A SIGTERM still runs the finally that kills the sleepers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    counts = [int(a) for a in argv] or [10, 100, 1000]
    rows = [measure(count, repeat=30 if count <= 100 else 10) for count in counts]
    print("per-write cost of the simulated cgroup tree, milliseconds (median)")
    print(table(["cgroups", "leaf cpuset.cpus", "pool cpuset.cpus", "move pid",
                 "mkdir+rmdir"], rows))


if __name__ == "__main__":
    main(sys.argv[1:])
