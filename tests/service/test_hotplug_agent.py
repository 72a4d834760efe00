"""Hotplug through the running agent: a fake uevent source, a sysfs tree that
changes under it, the real event loop, rediscovery and the cgroup tree."""

import os
import shutil
import subprocess
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from numa_agent.admission.machine import PolicyConfig
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon import runtime
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent
from numa_agent.enforcement.record import RECORD_XATTR, decode_record
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs
from numa_agent.hotplug.events import FakeEventSource, HotplugEvent
from numa_agent.service.refusals import NoCapacity
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.model import replace as replace_value
from numa_agent.views.metrics import build_registry
from tests.support.agent_process import wait_for
from tests.support.synthetic import make_topology, with_node_memory
from tests.support.sysfs_writer import write_sysfs

GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")
GiB = 1 << 30


@pytest.fixture
def running(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, devices=(GPU,))
    root = tmp_path / "machine"
    write_sysfs(topo, root)
    source = FakeEventSource()
    cfg = AgentConfig(sysfs_root=str(root), state_dir=str(tmp_path / "state"),
                      socket=str(tmp_path / "agent.sock"), metrics_address=None, hotplug=True,
                      policy=PolicyConfig(devices={"gpu": {"vendor": "0x10de"}}))
    agent = Agent(cfg, hotplug_source=source).start()
    sleeper = subprocess.Popen(["sleep", "60"])

    def change(new_topo):
        """The kernel changed the machine: swap in a new sysfs tree."""
        staging = tmp_path / "staging"
        write_sysfs(new_topo, staging)
        shutil.rmtree(root)
        os.rename(staging, root)

    yield agent, topo, source, change, Caller(pid=sleeper.pid, uid=0, gid=0), tmp_path
    sleeper.kill()
    sleeper.wait()
    agent.stop()


def test_cpu_offline_under_a_workload_then_back(running):
    agent, topo, source, change, caller, tmp = running
    service = agent.service
    cpus = CpuSet.parse(service.admit(AdmitRequest(name="w", cpus=4, devices={"gpu": 1}), caller)["cpus"])
    gone = cpus.max()
    offline = replace(topo, cpus=tuple(replace(c, online=False) if c.id == gone else c for c in topo.cpus))
    change(offline)
    source.push(HotplugEvent("cpu", "offline", f"/devices/system/cpu/cpu{gone}", gone))
    assert wait_for(lambda: service.state.workload("w").lost)
    w = service.state.workload("w")
    assert w.booking.cpus == cpus - CpuSet([gone])
    assert any(str(gone) in x for x in w.lost)
    status = service.status()
    assert status["workloads"][0]["lost"] == list(w.lost)
    assert sum(n["cpus"]["capacity"] for n in status["nodes"]) == 15
    assert service.counters.hotplug_events["cpu"] == 1
    cg = tmp / "state" / "cgroupfs" / "numa-agent"
    assert CpuSet.parse((cg / "wl-w" / "cpuset.cpus").read_text()) == cpus - CpuSet([gone])
    assert gone not in CpuSet.parse((cg / "shared" / "cpuset.cpus").read_text())

    # it comes back: capacity follows, the CPU goes to the shared pool, nobody holds it twice
    change(topo)
    source.push(HotplugEvent("cpu", "online", f"/devices/system/cpu/cpu{gone}", gone))
    assert wait_for(lambda: sum(n["cpus"]["capacity"] for n in service.status()["nodes"]) == 16)
    assert gone in CpuSet.parse(service.status()["shared_pool"])
    held = service.state.workload("w").booking.cpus
    assert gone not in held
    # (x takes the caller's process out of w, whose release as exited may follow at once)
    other = CpuSet.parse(service.admit(AdmitRequest(name="x", cpus=8), caller)["cpus"])
    assert other.isdisjoint(held)


def test_device_removed_under_a_workload(running):
    agent, topo, source, change, caller, tmp = running
    service = agent.service
    service.admit(AdmitRequest(name="g", cpus=2, devices={"gpu": 1}), caller)
    change(replace(topo, pci_devices=()))
    source.push(HotplugEvent("pci", "remove", "/devices/pci0000:00/0000:01:00.0", "0000:01:00.0"))
    assert wait_for(lambda: service.state.workload("g").lost)
    w = service.state.workload("g")
    assert w.booking.devices == () and "pci 0000:01:00.0 (gpu)" in w.lost
    assert all(not n["devices"] for n in service.status()["nodes"])
    assert service.counters.hotplug_events["pci"] == 1
    # the saved state agrees
    saved = agent.service.store.load()
    assert saved["workloads"][0]["lost"] == ["pci 0000:01:00.0 (gpu)"]


def test_a_trim_rewrites_the_booking_record(running):
    agent, topo, source, change, caller, tmp = running
    service = agent.service
    cpus = CpuSet.parse(service.admit(AdmitRequest(name="w", cpus=4), caller)["cpus"])
    cg = tmp / "state" / "cgroupfs" / "numa-agent"
    record = lambda: decode_record(SimulatedCgroupfs(cg.parent).getxattr(cg / "wl-w", RECORD_XATTR))  # noqa: E731
    assert record().booking.cpus == cpus and record().lost == ()
    gone = cpus.max()
    offline = replace(topo, cpus=tuple(replace(c, online=False) if c.id == gone else c for c in topo.cpus))
    change(offline)
    source.push(HotplugEvent("cpu", "offline", f"/devices/system/cpu/cpu{gone}", gone))
    assert wait_for(lambda: service.state.workload("w").lost)
    assert record() == replace_value(service.state.workload("w"), command=())
    assert record().booking.cpus == cpus - CpuSet([gone]) and record().lost


def node_memory(service, node_id):
    return next(n for n in service.status()["nodes"] if n["id"] == node_id)


def memory_blocks(source, action, first, count):
    for n in range(first, first + count):
        source.push(HotplugEvent("memory", action, f"/devices/system/memory/memory{n}", n, action))


def scrape(service):
    return generate_latest(build_registry(service.metrics_snapshot)).decode()


def test_memory_blocks_onlined_grow_the_node_capacity(running):
    agent, topo, source, change, caller, tmp = running
    service = agent.service
    assert node_memory(service, 1)["memory_bytes"]["capacity"] == 64 * GiB
    change(with_node_memory(topo, 1, 66 * GiB))  # a 2 GiB DIMM: 16 blocks of 128 MiB
    memory_blocks(source, "add", 600, 16)
    memory_blocks(source, "online", 600, 16)
    assert wait_for(lambda: node_memory(service, 1)["memory_bytes"]["capacity"] == 66 * GiB)
    assert node_memory(service, 1)["memory_total_bytes"] == 66 * GiB
    assert node_memory(service, 0)["memory_bytes"]["capacity"] == 64 * GiB
    assert service.counters.hotplug_events["memory"] == 32
    # the grown node holds what it could not before
    w = service.admit(AdmitRequest(name="big", cpus=2, memory_bytes=65 * GiB, cpunodebind=[1], membind=[1]),
                      caller)
    assert w["memory_bytes"] == {"1": 65 * GiB}


def test_memory_offlined_below_the_bookings_fences_the_node_until_it_returns(running, caplog):
    agent, topo, source, change, caller, tmp = running
    service = agent.service
    service.admit(AdmitRequest(name="held", cpus=2, memory_bytes=48 * GiB, cpunodebind=[1], membind=[1]), caller)
    change(with_node_memory(topo, 1, 32 * GiB))
    memory_blocks(source, "offline", 100, 256)
    assert wait_for(lambda: node_memory(service, 1)["memory_short"])
    node = node_memory(service, 1)
    assert node["memory_short"] == [{"resource": "memory", "booked_bytes": 48 * GiB,
                                     "allocatable_bytes": 32 * GiB}]
    assert node["memory_bytes"]["allocated"] == 48 * GiB and node["memory_bytes"]["free"] == 0
    # the booking is kept (the workload keeps its pages), and said in the log (once committed,
    # which status may show a moment before)
    assert service.state.workload("held").booking.memory == {1: {"memory": 48 * GiB}}
    assert wait_for(lambda: any("NUMA node 1 has less memory than is booked on it" in r.message
                                and "held" in r.message for r in caplog.records))
    assert 'numa_agent_memory_short_bytes{numa_node="1",resource="memory"} 1.7179869184e+10' in scrape(service)
    # no new admission there, with the reason; the other node takes one
    with pytest.raises(NoCapacity) as err:
        service.admit(AdmitRequest(name="there", cpus=2, cpunodebind=[1]), caller)
    assert "NUMA node(s) 1 take no new admission" in str(err.value)
    assert err.value.details["reason_code"] == "numa_node_memory_short"
    elsewhere = service.admit(AdmitRequest(name="elsewhere", cpus=2, memory_bytes=GiB), caller)
    assert elsewhere["numa_nodes"] == [0]

    change(topo)
    memory_blocks(source, "online", 100, 256)
    assert wait_for(lambda: not node_memory(service, 1)["memory_short"])
    assert 'numa_agent_memory_short_bytes{numa_node="1",resource="memory"} 0.0' in scrape(service)
    assert service.admit(AdmitRequest(name="there", cpus=2, cpunodebind=[1]), caller)["numa_nodes"] == [1]


@pytest.fixture
def fast_memory_poll(monkeypatch):
    monkeypatch.setattr(runtime, "MEMORY_POLL_INTERVAL", 0.05)


def test_memory_that_changes_without_a_uevent_is_followed(fast_memory_poll, running):
    agent, topo, source, change, caller, tmp = running
    service = agent.service
    change(with_node_memory(topo, 0, 60 * GiB))  # a balloon took 4 GiB of node 0: no uevent
    assert wait_for(lambda: node_memory(service, 0)["memory_bytes"]["capacity"] == 60 * GiB)
    # as a node change (more than one: the test's tree is replaced, not changed in place)
    assert service.counters.hotplug_events["node"] >= 1


def test_a_restart_on_less_memory_than_was_booked_says_so_and_fences(running, caplog):
    agent, topo, source, change, caller, tmp = running
    agent.service.admit(AdmitRequest(name="held", cpus=2, memory_bytes=48 * GiB, cpunodebind=[1], membind=[1]),
                        caller)
    agent.stop()
    change(with_node_memory(topo, 1, 32 * GiB))  # memory taken away while the agent was down
    again = Agent(agent.cfg, hotplug_source=FakeEventSource()).start()
    try:
        assert node_memory(again.service, 1)["memory_short"] == [
            {"resource": "memory", "booked_bytes": 48 * GiB, "allocatable_bytes": 32 * GiB}]
        assert any("NUMA node 1 has less memory than is booked on it" in r.message and "(held by held)" in r.message
                   for r in caplog.records)
        with pytest.raises(NoCapacity, match="take no new admission"):
            again.service.admit(AdmitRequest(name="there", cpus=1, cpunodebind=[1]), caller)
    finally:
        again.stop()


def test_a_hotplug_the_checkpoint_refuses_is_one_log_line(running, monkeypatch, caplog):
    """The changed machine cannot be checkpointed: the agent keeps the machine
    it had (with the state fitted to it), says so in one line, and health is
    degraded; no traceback."""
    from numa_agent.state.checkpoint import CheckpointWriteError

    agent, topo, source, change, caller, tmp = running
    service = agent.service
    cpus = CpuSet.parse(service.admit(AdmitRequest(name="w", cpus=4), caller)["cpus"])
    before = service.machine

    def broken(state, snapshot=False):
        raise CheckpointWriteError("appending to the journal failed: EROFS (Read-only file system)")

    monkeypatch.setattr(service.store, "commit", broken)
    change(replace(topo, cpus=tuple(replace(c, online=False) if c.id == cpus.max() else c for c in topo.cpus)))
    caplog.set_level("ERROR")
    agent._on_hotplug([HotplugEvent("cpu", "offline", f"/devices/system/cpu/cpu{cpus.max()}", cpus.max())])
    assert service.machine is before and service.state.workload("w").booking.cpus == cpus
    assert service.health()["status"] == "degraded"
    lines = [r for r in caplog.records if "hotplug" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None and "EROFS" in lines[0].getMessage()
