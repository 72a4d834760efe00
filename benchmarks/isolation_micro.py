"""Benchmark (a script, not a test): what `--isolate` costs an admission. Through AgentService on
a simulated cgroup tree and a written /proc and /sys tree (32 CPUs, IRQS interrupts, default
200), 100 admit+release cycles of `--cpus 2` without isolation and with `--isolate irqs,idle`
(every interrupt on all CPUs, so each admission writes every one and each release restores
them), then 100 plain admit+release cycles beside one isolating workload. Medians; the file
writes land on whatever filesystem holds the temporary directory, not procfs.

Run: IRQS=200 python benchmarks/isolation_micro.py
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numa_agent.admission.machine import PolicyConfig, build_machine  # noqa: E402
from numa_agent.core.caller import Caller  # noqa: E402
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root  # noqa: E402
from numa_agent.isolation.keeper import IsolationKeeper  # noqa: E402
from numa_agent.isolation.knobs import ProcSysKnobs  # noqa: E402
from numa_agent.service.requests import AdmitRequest  # noqa: E402
from tests.support.isolation_tree import machine, write  # noqa: E402
from tests.support.simulated_service import start  # noqa: E402
from tests.support.synthetic import make_topology  # noqa: E402

ME = Caller(pid=os.getpid(), uid=0, gid=0)
IRQS = int(os.environ.get("IRQS", "200"))
ROUNDS = 100


def service_on_written_machine():
    tmp = Path(tempfile.mkdtemp())
    topo = make_topology(sockets=2, cores_per_node=8, threads_per_core=2, memory_per_node_bytes=8 << 30)
    m = build_machine(topo, PolicyConfig())
    tree = machine(tmp / "m", cpus=32)
    for irq in range(100, 100 + IRQS):
        write(tree, f"proc/irq/{irq}/smp_affinity_list", "0-31")
    service, _ = start(m, tmp / "s", make_simulated_cgroup_root(tmp / "cg", m.usable_cpus, [0, 1]),
                       isolation=IsolationKeeper(ProcSysKnobs(tree / "proc", tree / "sys")))
    return service


def cycles(service, prefix: str, isolate: list[str] | None) -> tuple[float, float]:
    """Median seconds of an admission and of a release."""
    admit, release = [], []
    for i in range(ROUNDS):
        t = time.perf_counter()
        service.admit(AdmitRequest(name=f"{prefix}{i}", cpus=2, isolate=isolate), ME)
        admit.append(time.perf_counter() - t)
        t = time.perf_counter()
        service.release(f"{prefix}{i}", None)
        release.append(time.perf_counter() - t)
    return statistics.median(admit), statistics.median(release)


def main() -> None:
    print(f"{IRQS} interrupts, 32 CPUs, {ROUNDS} rounds each (medians)")
    for label, isolate in (("no isolation", None), ("--isolate irqs,idle", ["irqs", "idle"])):
        admit, release = cycles(service_on_written_machine(), "w", isolate)
        print(f"{label:>40}: admit {admit * 1e3:7.2f} ms  release {release * 1e3:7.2f} ms")
    service = service_on_written_machine()
    service.admit(AdmitRequest(name="held", cpus=2, isolate=["irqs", "idle"]), ME)
    admit, release = cycles(service, "b", None)
    print(f"{'no isolation, beside an isolating one':>40}: admit {admit * 1e3:7.2f} ms  release {release * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
