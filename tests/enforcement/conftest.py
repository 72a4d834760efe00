from __future__ import annotations

import subprocess

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.fake_cgroupfs import make_fake_cgroup_root


@pytest.fixture
def fake_root(tmp_path):
    return make_fake_cgroup_root(tmp_path / "numa.slice", CpuSet.parse("0-15"), [0, 1])


@pytest.fixture
def cg(fake_root):
    """Driver on a fake tree whose root hands cpuset, memory and hugetlb down."""
    driver = CgroupV2(fake_root)
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
