"""A start that runs short of a system resource stops with one line and gives
back what it took; where a fallback exists, the agent takes it."""

from __future__ import annotations

import errno
import os

import pytest

from numa_agent.daemon import runtime
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent, StartupConfigError, StartupError
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


@pytest.fixture
def cfg(tmp_path):
    root = write_sysfs(make_topology(sockets=1, cores_per_node=2, threads_per_core=1), tmp_path / "machine")
    return AgentConfig(sysfs_root=str(root), state_dir=str(tmp_path / "state"),
                       socket=str(tmp_path / "agent.sock"), metrics_address=None, hotplug=False,
                       pod_resources_socket="")


def test_running_out_of_descriptors_midway_is_one_line_and_leaves_nothing_bound(cfg, monkeypatch):
    def out_of_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(runtime, "EventLoop", out_of_descriptors)  # the last thing a start makes
    with pytest.raises(StartupError) as info:
        Agent(cfg).start()
    assert str(info.value) == ("ran out of file descriptors while starting ([Errno 24] Too many open files); "
                               "raise the open-files limit (LimitNOFILE= in the unit, `ulimit -n` in a shell)")
    assert not os.path.exists(cfg.socket)
    monkeypatch.undo()
    Agent(cfg).start().stop()  # the state directory was given back


def test_an_unknown_isolation_group_is_a_configuration_error(cfg):
    from dataclasses import replace

    with pytest.raises(StartupConfigError, match="isolation.group: no group named 'no-such-group-here'"):
        Agent(replace(cfg, isolate_group="no-such-group-here")).start()
