"""A client meeting no agent: at once when none is there or starting, with how to start
one; waiting while one starts; a denied socket named with its group and the remedy."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from numa_agent.api import client
from numa_agent.api.client import AgentUnreachable, agent_starting, permission_message, request
from numa_agent.api.server import ApiServer

SERVICE_ACTIVATING = ("Id=numa-agent.service\nActiveState=activating\nListen=\n\n"
                      "Id=numa-agent.socket\nActiveState=inactive\nListen=\n")
SOCKET_HOLDS = ("Id=numa-agent.service\nActiveState=inactive\nListen=\n\n"
                "Id=numa-agent.socket\nActiveState=active\nListen={path} (Stream)\n")
NOTHING = ("Id=numa-agent.service\nActiveState=inactive\nListen=\n\n"
           "Id=numa-agent.socket\nActiveState=inactive\nListen=\n")


@pytest.fixture
def no_systemd(monkeypatch):
    """The host's systemd (or its absence) plays no part."""
    monkeypatch.setattr(client, "_systemctl_show", lambda: None)


@pytest.fixture
def sleeps(monkeypatch):
    """Every wait of the retry loop, recorded instead of slept."""
    calls: list[float] = []
    monkeypatch.setattr(client.time, "sleep", calls.append)
    return calls


def _hold_lock(path: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_no_socket_and_no_agent_starting_fails_at_once_saying_how_to_start(sock_dir, no_systemd, sleeps):
    with pytest.raises(AgentUnreachable) as caught:
        request(f"{sock_dir}/agent.sock", "GET", "/v1/health", busy_retry=30)
    assert sleeps == []  # not one wait
    message = str(caught.value)
    assert message.startswith(f"cannot reach the agent at {sock_dir}/agent.sock: No such file or "
                              "directory; no agent runs or starts there: start it")
    assert "systemctl start numa-agent" in message and "numa-agent serve" in message


def _agent_comes_during_the_first_wait(fake, path, monkeypatch, before=lambda: None) -> list[float]:
    """GET /v1/health while the agent (after `before`) binds its socket during the
    client's first wait; the waits the client made."""
    waits: list[float] = []
    servers: list[ApiServer] = []

    def bind(seconds):
        waits.append(seconds)
        if not servers:
            before()
            servers.append(ApiServer(fake, path, poll_interval=0.05).start())
    monkeypatch.setattr(client.time, "sleep", bind)
    try:
        assert request(path, "GET", "/v1/health", busy_retry=30)[0] == 200
    finally:
        for srv in servers:
            srv.stop()
    return waits


def test_no_socket_while_an_agent_holds_its_state_lock_waits_for_it(fake, sock_dir, no_systemd, monkeypatch):
    lock = _hold_lock(f"{sock_dir}/state/lock")  # scripts/agent's layout: state/ beside the socket
    try:
        assert len(_agent_comes_during_the_first_wait(fake, f"{sock_dir}/agent.sock", monkeypatch)) == 1
    finally:
        os.close(lock)


def test_an_agent_that_stops_starting_ends_the_wait_with_its_log(sock_dir, no_systemd, monkeypatch):
    lock = _hold_lock(f"{sock_dir}/state/lock")

    def fail_to_start(seconds):
        os.close(lock)  # its start failed: the lock is free again, no socket came
    monkeypatch.setattr(client.time, "sleep", fail_to_start)
    with pytest.raises(AgentUnreachable, match="no agent runs or starts there"):
        request(f"{sock_dir}/agent.sock", "GET", "/v1/health", busy_retry=30)


def test_a_lock_nobody_holds_is_no_agent_starting(sock_dir):
    os.makedirs(f"{sock_dir}/state")
    with open(f"{sock_dir}/state/lock", "w"):
        pass
    assert agent_starting(f"{sock_dir}/agent.sock", systemd=lambda: None) is None
    fd = _hold_lock(f"{sock_dir}/state/lock")
    try:
        assert "state directory's lock" in agent_starting(f"{sock_dir}/agent.sock", systemd=lambda: None)
    finally:
        os.close(fd)


def test_systemd_activating_or_a_socket_unit_holding_the_path_is_an_agent_starting(sock_dir):
    path = f"{sock_dir}/agent.sock"
    assert agent_starting(path, systemd=lambda: SERVICE_ACTIVATING) == "numa-agent.service is activating"
    assert agent_starting(path, systemd=lambda: SOCKET_HOLDS.format(path=path)) == \
        f"numa-agent.socket holds {path}"
    assert agent_starting(path, systemd=lambda: SOCKET_HOLDS.format(path="/run/other.sock")) is None
    assert agent_starting(path, systemd=lambda: NOTHING) is None


def test_the_default_state_directory_is_the_daemons():
    from numa_agent.daemon.config import DEFAULT_STATE_DIR
    from numa_agent.state.directory import LOCK_NAME

    assert (client.DEFAULT_STATE_DIR, client._LOCK_NAME) == (DEFAULT_STATE_DIR, LOCK_NAME)


def test_a_refused_socket_is_still_waited_for(fake, sock_dir, no_systemd, monkeypatch):
    """A socket file nobody accepts on is an agent restarting: waited for as before."""
    import socket

    path = f"{sock_dir}/agent.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)

    def stop_refusing():
        dead.close()
        os.unlink(path)
    assert len(_agent_comes_during_the_first_wait(fake, path, monkeypatch, stop_refusing)) == 1


def test_permission_denied_names_the_group_and_the_setting(sock_dir, monkeypatch):
    import grp

    path = f"{sock_dir}/agent.sock"
    with open(path, "w"):
        pass
    os.chmod(path, 0o660)
    group = grp.getgrgid(os.stat(path).st_gid).gr_name

    def denied(sock, socket_path, timeout):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(client, "_connect", denied)
    monkeypatch.setattr(client.os, "getgroups", lambda: [])
    monkeypatch.setattr(client.os, "getgid", lambda: os.stat(path).st_gid + 1)
    with pytest.raises(AgentUnreachable) as caught:
        request(path, "GET", "/v1/health", busy_retry=30)
    assert str(caught.value) == (
        f"permission denied on {path} (group {group}, mode 0660): join group {group} (then log in "
        "again), or set the agent's [agent] socket_group to a group you are in (SocketGroup= with "
        "numa-agent.socket)")
    assert "is the agent running" not in str(caught.value)


def test_permission_denied_in_the_group_names_the_mode(sock_dir, monkeypatch):
    path = f"{sock_dir}/agent.sock"
    with open(path, "w"):
        pass
    os.chmod(path, 0o640)
    monkeypatch.setattr(client.os, "getgid", lambda: os.stat(path).st_gid)
    assert 'socket_mode = "0660"' in permission_message(path)


