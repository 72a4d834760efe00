"""The daemon with [nri] enabled: the adapter starts once the API serves, its handler
made from the service (a stand-in here), READY is not held back by a missing runtime,
health, status and the metrics say whether the plugin is connected, and a stop ends it."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import replace

import pytest

from numa_agent.cli.status_cmd import format_status
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri.handler import KubernetesHandler
from tests.nri.fake_runtime import FakeRuntime
from tests.support.agent_process import wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


class StandIn:
    """The handler, as KubernetesHandler(api) will be made: from the service."""

    def __init__(self, api) -> None:
        self.api = api
        self.synchronized = threading.Event()

    def synchronize(self, pods, containers):
        self.synchronized.set()
        return []

    def create_container(self, request):
        return api.CreateContainerResponse()

    def update_container(self, request):
        return api.UpdateContainerResponse()

    def stop_container(self, request):
        return api.StopContainerResponse()

    def state_change(self, event):
        return None


def _config(tmp_path, **nri) -> AgentConfig:
    root = tmp_path / "machine"
    if not root.exists():
        write_sysfs(make_topology(sockets=1, cores_per_node=2, threads_per_core=1), root)
    return AgentConfig(sysfs_root=str(root), state_dir=str(tmp_path / "state"), socket=str(tmp_path / "agent.sock"),
                       metrics_address=f"unix:{tmp_path}/metrics.sock", hotplug=False, pod_resources_socket="",
                       intruder_scan_seconds=0, nri_socket=str(tmp_path / "nri" / "nri.sock"), **nri)


def _scrape(tmp_path, name: str = "metrics.sock") -> list[str]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(tmp_path / name))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode().splitlines()


@pytest.fixture
def made():
    handlers: list[StandIn] = []

    def make(api):
        handlers.append(StandIn(api))
        return handlers[-1]

    make.handlers = handlers
    return make


def test_nri_off_makes_no_adapter_and_reports_nothing(tmp_path):
    def never(api):
        raise AssertionError("no handler is made with [nri] off")

    agent = Agent(_config(tmp_path), nri_handler=never).start()
    try:
        assert agent.nri is None and "nri" not in agent.service.health() and "nri" not in agent.service.status()
        assert not any(line.startswith("numa_agent_nri_") for line in _scrape(tmp_path))
    finally:
        agent.stop()


def test_ready_is_not_held_back_by_a_missing_runtime(tmp_path, monkeypatch, made):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    agent = Agent(_config(tmp_path, nri_enabled=True), nri_handler=made).start()
    try:
        messages = [notify.recv(4096) for _ in range(2)]
        assert any(b"READY=1" in m for m in messages), messages
        assert made.handlers[0].api is agent.service
        health = agent.service.health()["nri"]
        assert health["connected"] is False and health["plugin"] == "10-numa-agent"
        assert "numa_agent_nri_connected 0.0" in _scrape(tmp_path)
    finally:
        agent.stop()
        notify.close()
    assert agent.nri.stopped


def test_the_plugin_registers_after_the_api_and_health_status_and_metrics_say_so(tmp_path, made):
    (tmp_path / "nri").mkdir(mode=0o755)
    rt = FakeRuntime(str(tmp_path / "nri" / "nri.sock"))
    agent = Agent(_config(tmp_path, nri_enabled=True, nri_plugin_index="42"), nri_handler=made).start()
    try:
        rt.accept()
        registered = rt.expect_register()
        assert (registered.plugin_name, registered.plugin_idx) == ("numa-agent", "42")
        rt.call("Configure", api.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"),
                api.ConfigureResponse)
        assert rt.call("Synchronize", api.SynchronizeRequest(), api.SynchronizeResponse)[0] == 0
        assert made.handlers[0].synchronized.is_set()
        # The adapter records its registration when register() returns, which the session
        # serving the runtime meanwhile may come before (tests/nri/test_adapter.py).
        assert wait_for(lambda: agent.service.health()["nri"]["connected"])
        health = agent.service.health()
        assert health["status"] == "ok" and health["nri"]["connected"] is True
        assert health["nri"]["runtime"] == "containerd 1.7.24"
        status = agent.service.status()
        assert "NRI plugin 42-numa-agent: connected to containerd 1.7.24 on " + rt.path in \
            format_status(status, now=0.0)
        scraped = _scrape(tmp_path)
        assert "numa_agent_nri_connected 1.0" in scraped and "numa_agent_nri_connections_total 1.0" in scraped
        assert 'numa_agent_nri_requests_total{call="Synchronize"} 1.0' in scraped
    finally:
        agent.stop()
    rt.conn.settimeout(10)
    assert rt.conn.recv(1) == b""  # the agent's stop closed the session
    assert agent.nri.stopped
    rt.close()


def test_status_says_when_the_plugin_is_not_connected():
    lines = format_status({"nri": {"enabled": True, "connected": False, "plugin": "10-numa-agent",
                                   "socket": "/var/run/nri/nri.sock", "error": "NRI socket /var/run/nri/nri.sock "
                                   "does not exist: is NRI enabled?"}}, now=0.0)
    assert lines[1] == ("NRI plugin 10-numa-agent: NOT CONNECTED to /var/run/nri/nri.sock: NRI socket "
                        "/var/run/nri/nri.sock does not exist: is NRI enabled?")
    assert not any("NRI" in line for line in format_status({}, now=0.0))


def test_the_kubernetes_handler_is_the_default(tmp_path):
    agent = Agent(_config(tmp_path, nri_enabled=True)).start()
    try:
        assert agent.nri is not None and isinstance(agent.nri.handler, KubernetesHandler)
    finally:
        agent.stop()


def test_a_reload_that_moves_the_metrics_keeps_the_nri_families(tmp_path, made):
    cfg = _config(tmp_path, nri_enabled=True)
    moved = replace(cfg, metrics_address=f"unix:{tmp_path}/moved.sock")
    agent = Agent(cfg, read_config=lambda: moved, nri_handler=made).start()
    try:
        agent.reload()
        assert agent.cfg.metrics_address == moved.metrics_address
        assert "numa_agent_nri_connected 0.0" in _scrape(tmp_path, "moved.sock")
    finally:
        agent.stop()


def _register(rt: FakeRuntime, pods=(), containers=()) -> list:
    rt.accept()
    rt.expect_register()
    rt.call("Configure", api.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"),
            api.ConfigureResponse)
    code, text, answer = rt.call("Synchronize", api.SynchronizeRequest(pods=list(pods), containers=list(containers)),
                                 api.SynchronizeResponse)
    assert code == 0, text
    return list(answer.update)


def test_a_container_pinned_through_the_daemon_keeps_its_cpus_across_a_restart(tmp_path):
    from tests.nri.fake_api import container, create, resources, sandbox

    cfg = _config(tmp_path, nri_enabled=True)
    (tmp_path / "nri").mkdir(mode=0o755)
    pod = sandbox(1)
    ctr = container(1, pod, resources(cpus=1, memory=64 << 20))
    rt = FakeRuntime(cfg.nri_socket)
    agent = Agent(cfg).start()
    try:
        _register(rt)
        code, text, answer = rt.call("CreateContainer", create(pod, ctr), api.CreateContainerResponse)
        assert code == 0, text
        cpus = answer.adjust.linux.resources.cpu.cpus
        assert cpus and agent.service.status()["workloads"][0]["runtime"]["container_id"] == ctr.id
    finally:
        agent.stop()
        rt.close()
    os.unlink(cfg.nri_socket)
    rt = FakeRuntime(cfg.nri_socket)  # the runtime still runs the container; the agent comes back
    agent = Agent(cfg).start()
    try:
        _register(rt, [pod], [container(1, pod, resources(cpus=1, memory=64 << 20), cpus=cpus)])
        [w] = agent.service.status()["workloads"]
        assert (w["name"], w["cpus"]) == (f"ctr-{ctr.id[:12]}", cpus)
    finally:
        agent.stop()
        rt.close()
