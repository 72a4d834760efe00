"""Everything the service holds is given to its constructor by the assembly
(daemon/startup.py): the observer too, its intruder watcher reading the
state of the service it was given to."""

from __future__ import annotations

from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent
from numa_agent.service.agent_service import AgentService
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


def test_the_observer_is_given_to_the_service_when_it_is_made(tmp_path, monkeypatch):
    root = write_sysfs(make_topology(sockets=1, cores_per_node=2, threads_per_core=1), tmp_path / "machine")
    cfg = AgentConfig(sysfs_root=str(root), state_dir=str(tmp_path / "state"),
                      socket=str(tmp_path / "agent.sock"), metrics_address=None, hotplug=False,
                      pod_resources_socket="", intruder_scan_seconds=3600)
    given = []
    made = AgentService.__init__

    def recording(self, *args, **kwargs):
        given.append(kwargs.get("observer"))
        made(self, *args, **kwargs)

    monkeypatch.setattr(AgentService, "__init__", recording)
    agent = Agent(cfg).start()
    try:
        assert agent.service is not None and given == [agent.service.observer] and given[0] is not None
        assert agent.service.observer.watcher is agent.watcher is not None
        assert agent.watcher.scan_once().finished_unix is not None  # it reads the service's state
    finally:
        agent.stop()
