"""Benchmark (a script, not a test): one admission and its release through
AgentService (decide, layout, journal commit) with N live shared workloads,
in this process, with an enforcer that does nothing and the journal's fsyncs
skipped: what the pure core and the service add per live workload, without
the disk, the kernel or the other programs of a busy machine that make
`scripts/bench-scale` noisy.

Prints p50 and min per N (ms per admission and release) and the ratio of the
largest N to the smallest, for shared probes (the pool stays) and exclusive
ones (the pool changes: every shared workload's layout entry follows it),
each with the kubelet state files off and on, and on over off. Then the same
for a probe asking for one 2 MiB hugepage, which reads the kernel's counters (a
stand-in reader: every page free) and looks for the pages the live holders of
hugepages have in use (a few of the N live workloads hold some).

Run: python benchmarks/service_scale_micro.py [COUNTS...]   (default 10 100 1000)
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stats import table  # noqa: E402
from numa_agent.admission.machine import PolicyConfig, build_machine  # noqa: E402
from numa_agent.core.caller import Caller  # noqa: E402
from numa_agent.enforcement.errors import EnforcementError  # noqa: E402
from numa_agent.enforcement.protocol import NO_LIMITS, Enforcer  # noqa: E402
from numa_agent.kubelet.files import StateFiles  # noqa: E402
from numa_agent.service.agent_service import AgentService  # noqa: E402
from numa_agent.service.requests import AdmitRequest  # noqa: E402
from numa_agent.state.checkpoint import CheckpointStore  # noqa: E402
from numa_agent.state.model import AgentState  # noqa: E402
from tests.support.synthetic import make_topology  # noqa: E402

PROBES = 200


class NoEnforcer:
    """An Enforcer with nothing to enforce: every role of the protocol, answered
    as for a machine where no workload has a process or a cgroup. What is
    measured is the service's own work, not a mechanism's."""

    mode = "none"
    reason = "benchmark: nothing is enforced"

    # Applying
    def setup(self):
        pass

    def apply(self, old, new, move=None, changed=None):
        pass

    def evict(self, relpath, pid, identity, layout):
        pass

    def verify(self, layout, relpaths=None):
        pass

    def close(self):
        pass

    # Tracking: no workload has a process
    def track(self, relpath, pid, identity=None):
        return False

    def fds(self):
        return []

    def released(self, ready_fds):
        return []

    def populated(self, relpath):
        return False  # a released workload's processes are gone: nothing to revoke

    def pids(self, relpath):
        return []

    def subtree_pids(self, relpath):
        return []

    def live_marked(self):
        return []

    # Records: nothing is kept beside the checkpoint
    def exists(self, relpath):
        return False

    def path_of(self, relpath):
        return None

    def read_cpuset(self, relpath):
        raise EnforcementError(f"{relpath}: nothing is enforced in this benchmark")

    def read_limits(self, relpath):
        return NO_LIMITS

    def write_record(self, relpath, data):
        pass

    def read_record(self, relpath):
        return None

    def existing(self):
        return []

    def prune(self, layout):
        return []

    def granted(self):
        return None


def measure(machine, counts: list[int], tmp: Path, kubelet: bool) -> dict[tuple[str, int], tuple[float, float]]:
    """(kind, live) -> (p50, min) ms per admission and release; `kubelet`: with the
    kubelet state files published after each change (written by their thread)."""
    me = Caller(pid=os.getpid(), uid=1000, gid=1000)
    figures = {}
    enforcer = NoEnforcer()
    assert isinstance(enforcer, Enforcer)  # every role the service may ask for
    service = AgentService(machine, CheckpointStore(tmp / "state"), enforcer)
    files = StateFiles(tmp / "kubelet") if kubelet else None
    if files is not None:
        files.check()
        service.state_publisher = files
    service.install(AgentState(policy_fingerprint=machine.policy.fingerprint()))
    live = 0
    for count in counts:
        while live < count:
            service.admit(AdmitRequest(name=f"hold-{live:05d}", shared=True), me)
            live += 1
        for kind in ("shared", "exclusive"):
            times = []
            for i in range(PROBES):
                name = f"probe-{kind}-{count}-{i}"
                body = AdmitRequest(name=name, shared=True) if kind == "shared" else AdmitRequest(name=name, cpus=1)
                t0 = time.perf_counter()
                service.admit(body, me)
                service.release(name, me)
                times.append((time.perf_counter() - t0) * 1e3)
            figures[kind, count] = (statistics.median(times), min(times))
    if files is not None:
        files.close()
    return figures


HUGEPAGE_HOLDERS = 3


def free_hugepages(pools):
    """A stand-in for the sysfs counters: every page of the machine free, none reserved."""
    return tuple((node, size, 4096) for node, size in pools), tuple((size, 0) for size in {s for _, s in pools})


def measure_hugepages(counts: list[int], tmp: Path) -> dict[int, tuple[float, float]]:
    """live -> (p50, min) ms per admission and release of a probe asking for one
    2 MiB hugepage, with HUGEPAGE_HOLDERS of the live workloads holding some."""
    me = Caller(pid=os.getpid(), uid=1000, gid=1000)
    machine = build_machine(make_topology(sockets=2, cores_per_node=4, threads_per_core=2,
                                          memory_per_node_bytes=16 << 30, hugepages_2m_per_node=4096),
                            PolicyConfig())
    service = AgentService(machine, CheckpointStore(tmp / "state"), NoEnforcer(), hugepage_counters=free_hugepages)
    service.install(AgentState(policy_fingerprint=machine.policy.fingerprint()))
    for i in range(HUGEPAGE_HOLDERS):
        service.admit(AdmitRequest(name=f"huge-{i}", shared=True, hugepages={"2048": 2}), me)
    live, figures = HUGEPAGE_HOLDERS, {}
    for count in counts:
        while live < count:
            service.admit(AdmitRequest(name=f"hold-{live:05d}", shared=True), me)
            live += 1
        times = []
        for i in range(PROBES):
            name = f"probe-huge-{count}-{i}"
            t0 = time.perf_counter()
            service.admit(AdmitRequest(name=name, shared=True, hugepages={"2048": 1}), me)
            service.release(name, me)
            times.append((time.perf_counter() - t0) * 1e3)
        figures[max(count, live)] = (statistics.median(times), min(times))
    return figures


def main(argv: list[str]) -> int:
    counts = sorted(int(a) for a in argv) or [10, 100, 1000]
    os.fdatasync = os.fsync = lambda fd: None  # the disk is not what is measured here
    machine = build_machine(make_topology(sockets=2, cores_per_node=4, threads_per_core=2,
                                          memory_per_node_bytes=8 << 30), PolicyConfig())
    with tempfile.TemporaryDirectory(prefix="service-scale-") as tmp:
        # Alternating, so that the machine's mood weighs on both alike.
        runs = {setting: [] for setting in ("off", "on")}
        for rep in range(2):
            for setting in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                where = Path(tmp) / f"{setting}-{rep}"
                runs[setting].append(measure(machine, counts, where, kubelet=setting == "on"))
        huge = measure_hugepages(counts, Path(tmp) / "hugepages")
    figures = {setting: {key: min(run[key] for run in found) for key in found[0]} for setting, found in runs.items()}
    rows = [[kind, str(count), setting, f"{figures[setting][kind, count][0]:.3f}",
             f"{figures[setting][kind, count][1]:.3f}"]
            for kind in ("shared", "exclusive") for count in counts for setting in ("off", "on")]
    print(f"admission + release through AgentService, no enforcement, no fsync; {PROBES} probes, ms "
          "(the better of two alternating runs per setting); kubelet: the state files published after each change")
    print(table(["kind", "live", "kubelet", "p50", "min"], rows))
    if len(counts) > 1:
        print(table(["kind", "kubelet", "live", "p50 ratio", "min ratio"],
                    [[kind, setting, f"{counts[-1]}/{counts[0]}",
                      *(f"{figures[setting][kind, counts[-1]][i] / figures[setting][kind, counts[0]][i]:.2f}x"
                        for i in (0, 1))]
                     for kind in ("shared", "exclusive") for setting in ("off", "on")]))
    print(table(["kind", "live", "p50 on/off", "min on/off"],
                [[kind, str(count), *(f"{figures['on'][kind, count][i] / figures['off'][kind, count][i]:.2f}x"
                                      for i in (0, 1))]
                 for kind in ("shared", "exclusive") for count in counts]))
    print(f"a probe asking for one 2 MiB hugepage (the kernel's counters read, the pages in use of "
          f"{HUGEPAGE_HOLDERS} live holders of hugepages looked for), kubelet off; ms")
    print(table(["live", "p50 ms", "min ms"], [[str(n), f"{p50:.3f}", f"{low:.3f}"] for n, (p50, low) in huge.items()]))
    if len(huge) > 1:
        (few, at_few), (many, at_many) = min(huge.items()), max(huge.items())
        print(f"hugepage probe, {many}/{few} live: p50 {at_many[0] / at_few[0]:.2f}x, "
              f"min {at_many[1] / at_few[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
