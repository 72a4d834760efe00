"""The agent's `process_*` series: the same figures prometheus_client's process
collector gives, without listing /proc/self/fd on each scrape (the agent holds
descriptors per workload, so a listing costs the number of workloads)."""

import os
import types

import pytest
from prometheus_client import ProcessCollector

from numa_agent.views.metrics import build_registry
from numa_agent.views.process_metrics import ProcessMetrics, open_descriptors

KERNEL_COUNTS_FDS = os.stat("/proc/self/fd").st_size > 0  # Linux >= 6.2


def _values(collector) -> dict[str, tuple[str, float]]:
    return {m.name: (m.type, m.samples[0].value) for m in collector.collect()}


def _snapshot() -> dict:
    return {"status": {"enforcement": "affinity", "workloads": []}, "counters": {}}


def test_same_names_types_and_figures_as_the_client_library():
    ours = _values(ProcessMetrics())
    theirs = _values(ProcessCollector(registry=None))
    assert set(ours) == set(theirs)
    for name, (kind, value) in ours.items():
        assert kind == theirs[name][0], name
        if name in ("process_start_time_seconds", "process_max_fds"):
            assert value == pytest.approx(theirs[name][1]), name
        elif name == "process_open_fds":
            # Theirs counts the descriptor its own listing holds open.
            assert value in (theirs[name][1], theirs[name][1] - 1)
        else:
            assert value > 0, name


@pytest.mark.skipif(not KERNEL_COUNTS_FDS, reason="the kernel reports no count as /proc/self/fd's size (< 6.2)")
def test_a_scrape_lists_no_descriptors_and_counts_every_one(monkeypatch):
    registry = build_registry(_snapshot)
    listed = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": (listed.append(path), real_listdir(path))[1])

    def open_fds() -> float:
        return next(s.value for m in registry.collect() if m.name == "process_open_fds" for s in m.samples)

    before = open_fds()
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(200)]
    try:
        assert open_fds() == before + 200
    finally:
        for fd in held:
            os.close(fd)
    assert not [p for p in listed if str(p).endswith("/fd")]


def test_an_older_kernel_is_counted_by_listing(tmp_path):
    fd_dir = tmp_path / "fd"
    fd_dir.mkdir()
    for n in range(7):
        (fd_dir / str(n)).touch()
    zero = types.SimpleNamespace(st_size=0)
    # The listing's own descriptor is not one of the process's.
    assert open_descriptors(str(tmp_path), stat=lambda path: zero) == 6
