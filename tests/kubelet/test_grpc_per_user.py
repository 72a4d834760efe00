"""PodResources bounds connections per user: one member of the socket's group
holding handshaken, idle connections up to and beyond its share cannot stop
another user's (root's) List from being answered. The refusals are counted
(`numa_agent_pod_resources_refused_connections_total{reason}`) and logged at
most once a second."""

from __future__ import annotations

import logging
import os
import socket

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from numa_agent.kubelet import gate as gate_mod
from numa_agent.kubelet import grpc_server
from tests.support.pod_resources import Starting, answers, running_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame: the handshake is done
PATIENCE = 30.0  # a bound, not a measure
NOBODY = 65534


@pytest.fixture
def server():
    # the directory and the socket's mode let the other user connect
    with running_server(dir_mode=0o755, socket_mode=0o666, max_connections=8) as srv:
        yield srv


def hold_as_nobody(path: str, count: int):
    """A child running as uid 65534 opens `count` connections, finishes the
    handshake on each, says how many the agent kept, and holds them until told."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker
        try:
            os.close(ready_r)
            os.close(go_w)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            held = []
            for _ in range(count):
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                try:
                    s.sendall(PREFACE + SETTINGS)
                except OSError:
                    pass
                held.append(s)
            kept = 0
            for s in held:  # kept: the server's settings arrive; refused: EOF or reset
                s.settimeout(PATIENCE)
                try:
                    kept += bool(s.recv(9))
                except OSError:
                    pass
            os.write(ready_w, str(kept).encode())
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    kept = int(os.read(ready_r, 16) or b"-1")
    os.close(ready_r)
    return pid, go_w, kept


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the attacker as another uid")
def test_one_user_holding_connections_cannot_stop_roots_list(server):
    share = server.stats()["max_per_peer"]
    assert share == 2  # a quarter of 8
    pid, go, kept = hold_as_nobody(server.socket_path, 3 * server.max_connections)
    try:
        assert kept == share
        assert answers(server.socket_path)
        assert server.stats()["refused_connections_total"]["per_peer_limit"] == 3 * server.max_connections - share
    finally:
        os.close(go)
        os.waitpid(pid, 0)
    registry = CollectorRegistry()
    registry.register(server.collector())
    text = generate_latest(registry).decode()
    assert ('numa_agent_pod_resources_refused_connections_total{reason="per_peer_limit"} 22.0') in text


def test_refusals_are_logged_at_most_once_a_second(monkeypatch, caplog):
    a, b = socket.socketpair()
    gate = gate_mod.ConnectionGate(a, "/nonexistent", max_connections=8)
    monkeypatch.setattr(gate_mod.time, "monotonic", lambda: 1000.0)
    with caplog.at_level(logging.WARNING, logger="numa_agent.kubelet"):
        for _ in range(5):
            x, y = socket.socketpair()
            gate._refuse(x, "per_peer_limit")
            y.close()
    assert gate.refused["per_peer_limit"] == 5
    assert len([r for r in caplog.records if "turned away" in r.getMessage()]) == 1
    gate.server_close()
    b.close()


@pytest.mark.parametrize("nofile", [384, 1024, 65536, 1 << 20])
def test_connections_through_the_gate_fit_in_the_descriptor_share(nofile):
    held = grpc_server.DESCRIPTORS_PER_CONNECTION * grpc_server.connection_cap(nofile)
    assert held <= grpc_server.descriptor_share(nofile)


def test_grpcios_own_socket_is_private_and_goes_with_the_server(tmp_path):
    srv = grpc_server.PodResourcesServer(str(tmp_path / "pr.sock"), max_connections=8).bind()
    srv.attach(Starting())
    srv.start()
    private = srv._private_dir
    assert private is not None and os.stat(private).st_mode & 0o777 == 0o700
    assert os.listdir(private) == ["grpc.sock"]
    srv.stop()
    assert not os.path.exists(private) and not (tmp_path / "pr.sock").exists()
