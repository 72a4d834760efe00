"""`numa-agent serve` picks its enforcer from one table: the first factory that
accepts the configuration wins, each told why the previous ones declined."""

from __future__ import annotations

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.daemon import startup
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import EnforcerUnavailable, StartupError, _lazy, choose_enforcer
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from tests.support.synthetic import make_topology

HERE = __name__


@pytest.fixture
def machine():
    topo = make_topology(sockets=2, cores_per_node=2, threads_per_core=1, memory_per_node_bytes=1 << 30)
    return build_machine(topo, PolicyConfig())


@pytest.fixture
def close_after():
    made = []
    yield made.append
    for enforcer in made:
        enforcer.close()


def test_cgroup_root_none_falls_back_to_affinity_and_says_why(machine, close_after):
    enforcer = choose_enforcer(AgentConfig(cgroup_root="none"), machine)
    close_after(enforcer)
    assert isinstance(enforcer, AffinityEnforcer) and enforcer.mode == "affinity"
    assert enforcer.reason == "cgroup enforcement disabled (cgroup_root = none)"


def test_a_sysfs_snapshot_enforces_into_a_simulated_tree(machine, tmp_path, close_after):
    cfg = AgentConfig(sysfs_root=str(tmp_path / "snapshot"), state_dir=str(tmp_path / "state"))
    enforcer = choose_enforcer(cfg, machine)
    close_after(enforcer)
    assert isinstance(enforcer, CgroupEnforcer) and enforcer.mode == "simulated"
    assert enforcer.cgroup.files.simulated and enforcer.granted() is None
    assert enforcer.cgroup.root == tmp_path / "state" / "cgroupfs" / "numa-agent"


def test_an_explicit_cgroup_root_that_cannot_be_used_stops_the_start(machine, tmp_path):
    with pytest.raises(StartupError, match="cgroup root .*/nope cannot be used: no cgroup2"):
        choose_enforcer(AgentConfig(cgroup_root=str(tmp_path / "nope")), machine)


class _Third:
    mode = "third"

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _declines(cfg, machine, why_not):
    raise EnforcerUnavailable(f"declined after {why_not or 'nobody'}")


def _third(cfg, machine, why_not):
    return _Third(why_not)


def test_another_enforcer_is_one_line_in_the_table(machine, monkeypatch):
    monkeypatch.setattr(startup, "_ENFORCERS",
                        (_declines, _lazy(f"{HERE}:_third"), startup._affinity))
    enforcer = choose_enforcer(AgentConfig(cgroup_root="none"), machine)
    assert isinstance(enforcer, _Third) and enforcer.reason == "declined after nobody"


def test_when_every_enforcer_declines_the_start_stops(machine, monkeypatch):
    monkeypatch.setattr(startup, "_ENFORCERS", (_declines, _lazy(f"{HERE}:_declines")))
    with pytest.raises(StartupError, match="no enforcer can run here: declined after declined "
                                           "after nobody"):
        choose_enforcer(AgentConfig(), machine)


def test_root_agent_in_the_affinity_fallback_names_the_capabilities_its_unit_took(tmp_path, monkeypatch, caplog):
    # Without them another user's numa-run would fail with EPERM and no remedy in sight.
    status = tmp_path / "status"
    status.write_text("CapEff:\t0000000000000001\n")  # CAP_CHOWN only, as the hardened unit
    monkeypatch.setattr(startup.os, "geteuid", lambda: 0)
    with caplog.at_level("WARNING", logger=startup.log.name):
        startup._warn_missing_affinity_capabilities(str(status))
    assert "CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_SYS_NICE" in caplog.text
    assert "affinity-fallback.conf" in caplog.text

    caplog.clear()
    status.write_text("CapEff:\t000001ffffffffff\n")
    with caplog.at_level("WARNING", logger=startup.log.name):
        startup._warn_missing_affinity_capabilities(str(status))
    assert caplog.text == ""


def test_without_pidfd_the_affinity_fallback_says_what_it_needs(machine, monkeypatch):
    import errno
    import os

    def no_pidfd(pid):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    with pytest.raises(StartupError) as info:
        choose_enforcer(AgentConfig(cgroup_root="none"), machine)
    assert str(info.value) == (
        "no enforcer can run here: no usable cgroup v2 cpuset (cgroup enforcement disabled (cgroup_root = "
        "none)), and the CPU-affinity fallback needs pidfd_open (Linux 5.3 or later): Function not implemented")
