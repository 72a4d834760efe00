"""PodResources holds a bounded number of connections, and one that never
finishes the HTTP/2 handshake (connects and says nothing, or sends the preface
and nothing more) is closed: idle clients cannot take the agent's descriptors."""

from __future__ import annotations

import socket
import time

import pytest

from numa_agent.kubelet import grpc_server
from tests.support.pod_resources import answers, running_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATIENCE = 30.0  # how long a test waits for the server to act: a bound, not a measure


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(grpc_server, "HANDSHAKE_TIMEOUT_MS", 500)
    with running_server(max_connections=8) as srv:
        yield srv


def closed_by_server(s: socket.socket) -> bool:
    """Wait (a bound, not a measure) until the server closes `s`."""
    s.settimeout(PATIENCE)
    try:
        while s.recv(65536):
            pass  # the server's settings frame, then EOF
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_connections_beyond_the_bound_are_closed_and_held_ones_at_the_handshake_deadline(server):
    held = []
    for i in range(200):
        s = socket.socket(socket.AF_UNIX)
        s.connect(server.socket_path)
        if i % 2:
            try:
                s.sendall(PREFACE)  # half-open: the preface and nothing more
            except BrokenPipeError:
                pass  # beyond the bound: the gate closed it already, as closed_by_server finds
        held.append(s)
    closed = sum(closed_by_server(s) for s in held)
    assert closed == len(held)  # the bound's 8 at the handshake deadline, the rest at once
    for s in held:
        s.close()
    assert answers(server.socket_path)


def test_a_client_answers_while_idle_connections_fill_the_bound(server):
    idle = []
    for _ in range(server.max_connections):
        s = socket.socket(socket.AF_UNIX)
        s.connect(server.socket_path)
        idle.append(s)
    give_up = time.monotonic() + PATIENCE
    while not answers(server.socket_path) and time.monotonic() < give_up:
        time.sleep(0.05)  # the client reconnects once the deadline frees a slot
    assert answers(server.socket_path)
    for s in idle:
        s.close()
