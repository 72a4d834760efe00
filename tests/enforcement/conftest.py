from __future__ import annotations

import subprocess

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root


@pytest.fixture
def fake_root(tmp_path):
    return make_simulated_cgroup_root(tmp_path / "numa.slice", CpuSet.parse("0-15"), [0, 1])


@pytest.fixture
def fakefs(fake_root):
    """The fake tree's emulator; its `process_exited(pid)` stands in for the
    kernel noticing a death."""
    return SimulatedCgroupfs(fake_root)


@pytest.fixture
def cg(fake_root, fakefs):
    """Driver on a fake tree whose root hands cpuset, memory and hugetlb down."""
    driver = CgroupV2(fake_root, fakefs)
    driver.enable_controllers("", ["cpuset", "memory", "hugetlb"])
    return driver


@pytest.fixture
def sleepers():
    """spawn() -> a live child process; all are killed at teardown."""
    procs = []

    def spawn():
        proc = subprocess.Popen(["sleep", "60"])
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        proc.kill()
        proc.wait()
