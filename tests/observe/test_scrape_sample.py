"""A metrics scrape reads no file: the memory per node it reports comes from the
observer's last sample (taken off the scrape path), for the workloads its
state still holds."""

from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.enforcement.plan import workload_relpath
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.observe.observer import MemorySampler, Observer
from numa_agent.observe.procfs import ProcReader
from numa_agent.service.requests import AdmitRequest
from numa_agent.views.metrics import build_registry
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology

MIB = 1 << 20
CALLER = Caller(pid=os.getpid(), uid=1000, gid=1000)
MEMORY = "numa_agent_workload_memory_bytes"
INTRUDERS = "numa_agent_exclusive_cpu_intruders"


class CountingSource(ProcReader):
    """The real reader, counting the memory.numa_stat reads."""

    def __init__(self, proc_root: str) -> None:
        super().__init__(proc_root)
        self.numa_stat_reads: list[str] = []

    def numa_stat(self, cgroup_dir: str) -> dict[int, int] | None:
        self.numa_stat_reads.append(cgroup_dir)
        return super().numa_stat(cgroup_dir)


@pytest.fixture
def service(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig())
    root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    service, _ = start(machine, tmp_path / "state", root,
                       observer_of=lambda enforcer, state: Observer(CountingSource(str(tmp_path / "proc")),
                                                                    enforcer.path_of, None))
    yield service
    service.enforcer.close()


def _admit(service, name: str, mib: int, **fields) -> None:
    service.admit(AdmitRequest(name=name, **fields), CALLER)
    directory = service.enforcer.path_of(workload_relpath(service.state.workload(name)))
    with open(os.path.join(directory, "memory.numa_stat"), "w") as f:
        f.write(f"anon N0={mib * MIB} N1=0\nfile N0=0 N1=0\n")


def _scrape(service) -> dict:
    values = {}
    text = generate_latest(build_registry(service.metrics_snapshot)).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def _memory(values: dict) -> dict[str, float]:
    """workload -> its bytes on node 0."""
    return {dict(labels)["workload"]: v for (name, labels), v in values.items()
            if name == MEMORY and dict(labels)["numa_node"] == "0"}


def test_a_scrape_reads_no_numa_stat_and_reports_the_last_sample(service):
    for i in range(5):
        _admit(service, f"sh-{i}", 8 + i, shared=True)
    _admit(service, "db", 64, cpus=2)
    source = service.observer.source

    assert _memory(_scrape(service)) == {}  # nothing sampled yet
    assert source.numa_stat_reads == []

    service.observer.sample_memory(service.state)
    assert len(source.numa_stat_reads) == 6  # one read per workload, by the sample
    values = _scrape(service)
    assert len(source.numa_stat_reads) == 6  # and none by the scrape
    assert _memory(values) == {**{f"sh-{i}": (8 + i) * MIB for i in range(5)}, "db": 64 * MIB}
    outside = 0 if 0 in service.state.workload("db").booking.numa_nodes else 64 * MIB  # all is on node 0
    assert values[("numa_agent_workload_memory_outside_bytes", (("workload", "db"),))] == outside
    # Every held exclusive workload has its intruder series (0: the scan is off), shared ones none.
    assert {dict(labels)["workload"] for (name, labels) in values if name == INTRUDERS} == {"db"}


def test_a_released_workload_is_not_reported_from_an_older_sample(service):
    _admit(service, "db", 64, cpus=2)
    _admit(service, "web", 32, shared=True)
    _admit(service, "old", 16, shared=True)
    service.observer.sample_memory(service.state)
    assert set(_memory(_scrape(service))) == {"db", "web", "old"}

    service.release("db", None)
    service.release("old", None)
    _admit(service, "old", 1, shared=True)  # another workload by that name, not yet sampled
    values = _scrape(service)
    assert _memory(values) == {"web": 32 * MIB}
    assert not [labels for (name, labels) in values if dict(labels).get("workload") == "db"]

    service.observer.sample_memory(service.state)
    assert _memory(_scrape(service)) == {"web": 32 * MIB, "old": 1 * MIB}


def test_the_sampler_samples_on_its_own_thread_until_stopped(service):
    _admit(service, "web", 32, shared=True)
    sampler = MemorySampler(service.observer, lambda: service.state, interval=3600)
    assert service.observer.sample.finished_unix is None
    sampler.start()
    sampler.stop()  # the first sample is taken at once, then it waits for the interval or the stop
    assert service.observer.sample.finished_unix is not None
    assert _memory(_scrape(service)) == {"web": 32 * MIB}


def test_without_cgroups_nothing_is_read(service):
    _admit(service, "web", 32, shared=True)
    observer = Observer(service.observer.source, lambda rel: None, None)  # affinity mode
    sample = observer.sample_memory(service.state)
    assert dict(sample.figures) == {} and service.observer.source.numa_stat_reads == []
