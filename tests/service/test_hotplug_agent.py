"""Hotplug through the running agent: a fake uevent source, a sysfs tree that
changes under it, the real event loop, rediscovery and the cgroup tree."""

import os
import shutil
import subprocess
import time
from dataclasses import replace

import pytest

from numa_agent.admission.machine import PolicyConfig
from numa_agent.api.validation import AdmitRequest
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.fake_cgroupfs import FakeCgroupfs
from numa_agent.enforcement.record import RECORD_XATTR, decode_record
from numa_agent.hotplug.events import FakeEventSource, HotplugEvent
from numa_agent.service.caller import Caller
from numa_agent.service.config import AgentConfig
from numa_agent.service.startup import Agent
from numa_agent.state.model import replace as replace_value
from numa_agent.testing.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


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
    cg = tmp / "state" / "cgroupfs"
    assert CpuSet.parse((cg / "wl-w" / "cpuset.cpus").read_text()) == cpus - CpuSet([gone])
    assert gone not in CpuSet.parse((cg / "shared" / "cpuset.cpus").read_text())

    # it comes back: capacity follows, the CPU goes to the shared pool, nobody holds it twice
    change(topo)
    source.push(HotplugEvent("cpu", "online", f"/devices/system/cpu/cpu{gone}", gone))
    assert wait_for(lambda: sum(n["cpus"]["capacity"] for n in service.status()["nodes"]) == 16)
    assert gone in CpuSet.parse(service.status()["shared_pool"])
    assert gone not in service.state.workload("w").booking.cpus
    other = CpuSet.parse(service.admit(AdmitRequest(name="x", cpus=8), caller)["cpus"])
    assert other.isdisjoint(service.state.workload("w").booking.cpus)


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
    cg = tmp / "state" / "cgroupfs"
    record = lambda: decode_record(FakeCgroupfs(cg).getxattr(cg / "wl-w", RECORD_XATTR))  # noqa: E731
    assert record().booking.cpus == cpus and record().lost == ()
    gone = cpus.max()
    offline = replace(topo, cpus=tuple(replace(c, online=False) if c.id == gone else c for c in topo.cpus))
    change(offline)
    source.push(HotplugEvent("cpu", "offline", f"/devices/system/cpu/cpu{gone}", gone))
    assert wait_for(lambda: service.state.workload("w").lost)
    assert record() == replace_value(service.state.workload("w"), command=())
    assert record().booking.cpus == cpus - CpuSet([gone]) and record().lost
