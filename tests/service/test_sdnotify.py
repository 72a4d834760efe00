import os
import socket

import pytest

from numa_agent.daemon import sdnotify


@pytest.fixture
def listener(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield str(path), sock
    sock.close()


def test_no_socket_is_a_noop():
    assert sdnotify.notify("READY=1", env={}) is False
    assert sdnotify.ready(env={"OTHER": "x"}) is False


def test_ready_status_stopping_watchdog_reach_the_socket(listener):
    path, sock = listener
    env = {"NOTIFY_SOCKET": path}
    assert sdnotify.ready(env) is True
    assert sock.recv(4096) == b"READY=1"
    assert sdnotify.status("admitted 3\nrefused 1", env) is True
    assert sock.recv(4096) == b"STATUS=admitted 3 refused 1"
    assert sdnotify.watchdog_ping(env) is True
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert sdnotify.stopping(env) is True
    assert sock.recv(4096) == b"STOPPING=1"


def test_abstract_socket():
    name = f"numa-agent-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        assert sdnotify.notify("READY=1\nSTATUS=up", env={"NOTIFY_SOCKET": "@" + name}) is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"
    finally:
        sock.close()


def test_uses_process_environment(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert sdnotify.ready() is True
    assert sock.recv(4096) == b"READY=1"


def test_missing_socket_logs_and_returns_false(tmp_path, caplog):
    env = {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}
    with caplog.at_level("WARNING", logger="numa_agent.sdnotify"):
        assert sdnotify.ready(env) is False
    assert "sd_notify: cannot send 'READY=1' to" in caplog.text
    assert "No such file or directory" in caplog.text


def test_relative_socket_is_refused_with_message(caplog):
    with caplog.at_level("WARNING", logger="numa_agent.sdnotify"):
        assert sdnotify.ready({"NOTIFY_SOCKET": "relative.sock"}) is False
    assert "neither an absolute path nor an @abstract name" in caplog.text


def test_watchdog_interval():
    me = str(os.getpid())
    assert sdnotify.watchdog_interval({}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": me}) == 30.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None


def test_watchdog_interval_malformed_is_logged(caplog):
    with caplog.at_level("WARNING", logger="numa_agent.sdnotify"):
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30s"}) is None
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "1", "WATCHDOG_PID": "abc"}) is None
    assert "ignoring malformed WATCHDOG_USEC='30s'" in caplog.text
    assert "ignoring malformed WATCHDOG_PID='abc'" in caplog.text
