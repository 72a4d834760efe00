"""CgroupEnforcer.path_of is asked for every workload on each scrape: each path is
validated once and kept, a bad one is refused every time, and the kept set is bounded."""

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement import cgroup_enforcer as enforcer_module
from numa_agent.enforcement.cgroup import CgroupPathError, CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root


@pytest.fixture
def enforcer(tmp_path):
    root = make_simulated_cgroup_root(tmp_path / "cg", CpuSet.parse("0-3"), [0])
    return CgroupEnforcer(CgroupV2(root, SimulatedCgroupfs(root)))


def test_a_path_is_validated_once_and_kept(enforcer, monkeypatch):
    first = enforcer.path_of("shared/w1")
    assert first == str(enforcer.cgroup.root / "shared" / "w1")
    monkeypatch.setattr(enforcer.cgroup, "path", lambda rel: pytest.fail(f"validated {rel} again"))
    assert enforcer.path_of("shared/w1") == first


@pytest.mark.parametrize("bad", ["../escape", "shared/../../x", "a//b"])
def test_a_bad_path_is_refused_each_time(enforcer, bad):
    for _ in range(2):
        with pytest.raises(CgroupPathError):
            enforcer.path_of(bad)


def test_the_kept_paths_are_bounded(enforcer, monkeypatch):
    monkeypatch.setattr(enforcer_module, "_PATHS_KEPT", 8)
    for i in range(20):
        assert enforcer.path_of(f"shared/w{i}").endswith(f"/shared/w{i}")
        assert len(enforcer._paths) <= 8
