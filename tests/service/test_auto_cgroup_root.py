"""Where `cgroup_root = "auto"` puts the workloads, on a written cgroup mount."""

import pytest

from numa_agent.daemon.startup import (
    WORKLOADS_UNIT_ENV,
    StartupError,
    _auto_cgroup_root,
    _may_use_domain_controllers,
)

SLICE = "numa.slice/numa-agent.slice"
SYSTEMD = {"INVOCATION_ID": "0123abcd"}


@pytest.fixture
def mount(tmp_path):
    for cgroup in ("", SLICE, f"{SLICE}/numa-agent.service", f"{SLICE}/numa-agent-workloads.service"):
        (tmp_path / cgroup).mkdir(parents=True, exist_ok=True)
        (tmp_path / cgroup / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    return tmp_path


def test_under_the_shipped_units_the_workloads_unit_beside_the_agent_is_the_root(mount):
    env = {**SYSTEMD, WORKLOADS_UNIT_ENV: "numa-agent-workloads.service"}
    for own in (f"/{SLICE}/numa-agent.service", f"/{SLICE}/numa-agent.service/agent"):
        root, why = _auto_cgroup_root(str(mount), env, lambda own=own: own)
        assert (root, why) == (str(mount / SLICE / "numa-agent-workloads.service"), "")


def test_without_the_workloads_unit_the_agents_delegated_cgroup_is_the_root(mount):
    root, _ = _auto_cgroup_root(str(mount), SYSTEMD, lambda: f"/{SLICE}/numa-agent.service/agent")
    assert root == str(mount / SLICE / "numa-agent.service")


def test_a_named_workloads_unit_that_is_not_running_stops_the_start(mount):
    env = {**SYSTEMD, WORKLOADS_UNIT_ENV: "other.service"}
    with pytest.raises(StartupError, match="other.service has no cgroup .* is it running"):
        _auto_cgroup_root(str(mount), env, lambda: f"/{SLICE}/numa-agent.service")
    with pytest.raises(StartupError, match="is not a service unit name"):
        _auto_cgroup_root(str(mount), {**SYSTEMD, WORKLOADS_UNIT_ENV: "../x.service"},
                          lambda: f"/{SLICE}/numa-agent.service")


def test_domain_controllers_are_kept_off_only_where_a_restart_would_land_among_workloads(mount):
    own = lambda: f"/{SLICE}/numa-agent.service"  # noqa: E731  started in its root (systemd < 254)
    workloads = str(mount / SLICE / "numa-agent-workloads.service")
    assert _may_use_domain_controllers(workloads, SYSTEMD, own, str(mount))
    assert not _may_use_domain_controllers(str(mount / SLICE / "numa-agent.service"), SYSTEMD, own, str(mount))
    started_below = lambda: f"/{SLICE}/numa-agent.service/agent"  # noqa: E731  DelegateSubgroup=agent
    assert _may_use_domain_controllers(str(mount / SLICE / "numa-agent.service"), SYSTEMD, started_below,
                                       str(mount))
    assert _may_use_domain_controllers(str(mount / "numa-agent"), {}, own, str(mount))  # not under systemd
