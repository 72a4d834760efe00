"""The agent's `process_*` series: the same figures prometheus_client's process
collector gives, without listing /proc/self/fd on each scrape (the agent holds
descriptors per workload, so a listing costs the number of workloads)."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from prometheus_client import ProcessCollector

from numa_agent.views.process_metrics import ProcessMetrics, open_descriptors

ROOT = Path(__file__).resolve().parents[2]
KERNEL_COUNTS_FDS = os.stat("/proc/self/fd").st_size > 0  # Linux >= 6.2


def _values(collector) -> dict[str, tuple[str, float]]:
    return {m.name: (m.type, m.samples[0].value) for m in collector.collect()}


def test_same_names_types_and_figures_as_the_client_library():
    ours = _values(ProcessMetrics())
    theirs = _values(ProcessCollector(registry=None))
    assert set(ours) == set(theirs)
    for name, (kind, value) in ours.items():
        assert kind == theirs[name][0], name
        if name in ("process_start_time_seconds", "process_max_fds"):
            assert value == pytest.approx(theirs[name][1]), name
        elif name == "process_open_fds":
            # Counted exactly in a process of its own below: this one's other
            # threads and finalizers open and close descriptors meanwhile.
            assert value > 0
        else:
            assert value > 0, name


# Run in a fresh interpreter: nothing else opens or closes descriptors there.
_COUNT_IN_A_PROCESS_OF_ITS_OWN = """
import os
from numa_agent.views.metrics import build_registry

registry = build_registry(lambda: {"status": {"enforcement": "affinity", "workloads": []}, "counters": {}})
listed = []
real_listdir = os.listdir
os.listdir = lambda path=".": (listed.append(str(path)), real_listdir(path))[1]


def open_fds():
    return next(s.value for m in registry.collect() if m.name == "process_open_fds" for s in m.samples)


before = open_fds()
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(200)]
after = open_fds()
print(int(after - before), sum(1 for p in listed if p.endswith("/fd")))
"""


@pytest.mark.skipif(not KERNEL_COUNTS_FDS, reason="the kernel reports no count as /proc/self/fd's size (< 6.2)")
def test_a_scrape_lists_no_descriptors_and_counts_every_one():
    out = subprocess.run([sys.executable, "-c", _COUNT_IN_A_PROCESS_OF_ITS_OWN], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.split()
    counted, listings = (int(x) for x in out)
    assert counted == 200
    assert listings == 0


def test_an_older_kernel_is_counted_by_listing(tmp_path):
    fd_dir = tmp_path / "fd"
    fd_dir.mkdir()
    for n in range(7):
        (fd_dir / str(n)).touch()
    zero = types.SimpleNamespace(st_size=0)
    # The listing's own descriptor is not one of the process's.
    assert open_descriptors(str(tmp_path), stat=lambda path: zero) == 6
