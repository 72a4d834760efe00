"""No listener can starve the agent: the real agent, with a small open-file
limit, takes floods of idle and half-open connections on /metrics (TCP and
unix:) and on PodResources, each larger than its whole descriptor table, and
still admits through the API; once the held ones reach their deadline a
plain scrape answers and counts what was turned away."""

from __future__ import annotations

import shutil
import socket
import tempfile

import pytest

from tests.support.agent_process import AgentProcess, machine_with_devices, numa_run, wait_for
from tests.support.chaos import connect_unix

NOFILE = 512  # the agent's soft and hard RLIMIT_NOFILE here
FLOOD = 700  # connections per listener: more than the agent has descriptors
PATIENCE = 60.0  # how long a step may wait for the agent: a bound, not a measure
CONNECT_PATIENCE = 5.0  # for one connection of the flood


def limited(agent: AgentProcess) -> AgentProcess:
    agent.args = ["/bin/sh", "-c", f'ulimit -n {NOFILE} && exec "$@"', "sh", *agent.args]
    return agent


def open_idle(connect, count: int) -> list[socket.socket]:
    """Up to `count` connections, every other one sending half a request head and
    then nothing; fewer when the agent stops accepting (its listen queue stays full)."""
    held = []
    for i in range(count):
        try:
            s = connect()
        except OSError:
            break
        if i % 2:
            try:
                s.send(b"GET /metrics HTTP/1.1\r\nHost: x")
            except OSError:
                pass
        held.append(s)
    return held


def unix_connector(path: str):
    def connect() -> socket.socket:
        s = connect_unix(path, CONNECT_PATIENCE)  # waits for room in the listen queue
        if s is None:
            raise OSError(f"cannot connect to {path}")
        s.settimeout(PATIENCE)
        return s
    return connect


def listening(connect) -> bool:
    try:
        connect().close()
    except OSError:
        return False
    return True


def wait_closed(held: list[socket.socket]) -> None:
    for s in held:
        s.settimeout(PATIENCE)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
        s.close()


def scrape(connect) -> str:
    with connect() as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return body.decode()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_idle_metrics_and_podresources_connections_never_stop_an_admission(tmp_path, transport):
    short = tempfile.mkdtemp(prefix="na-flood-", dir="/tmp")  # unix paths are short
    extra = ["--sysfs-root", str(machine_with_devices(tmp_path / "machine"))]
    if transport == "unix":
        extra += ["--metrics-address", f"unix:{short}/metrics.sock"]
    agent = limited(AgentProcess(tmp_path, *extra)).start()
    try:
        if transport == "unix":
            metrics = unix_connector(f"{short}/metrics.sock")
        else:
            def metrics() -> socket.socket:
                s = socket.create_connection(("127.0.0.1", agent.metrics_port), timeout=CONNECT_PATIENCE)
                s.settimeout(PATIENCE)
                return s
        pod_resources = unix_connector(str(tmp_path / "pod-resources.sock"))
        for connect in (metrics, pod_resources):  # both start just after the API answers
            assert wait_for(lambda connect=connect: listening(connect), timeout=PATIENCE)
        held = open_idle(metrics, FLOOD) + open_idle(pod_resources, FLOOD)
        assert len(held) > NOFILE  # more than the agent could hold

        r = numa_run(agent.socket, "--cpus", "1", "--name", "through-the-flood", "--", "true",
                     timeout=PATIENCE, env={"NUMA_AGENT_RETRY_SECONDS": "10"})
        assert r.returncode == 0, r.stderr + agent.log()[-3000:]

        wait_closed(held)  # every one refused at once or dropped at its deadline
        body = scrape(metrics)
        refused = {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                   for line in body.splitlines()
                   if line.startswith("numa_agent_metrics_refused_connections_total{")}
        assert refused["timeout"] > 0 and refused["busy"] + refused["per_peer_limit"] > 0
        assert "numa_agent_admission_requests_total{result=\"admitted\"} 1.0" in body
    finally:
        assert agent.stop() == 0, agent.log()[-3000:]
        shutil.rmtree(short, ignore_errors=True)
