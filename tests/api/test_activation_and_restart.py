"""systemd socket activation, and clients riding out an agent restart."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from numa_agent.api.client import AgentUnreachable, BadResponse, new_request_id, request
from numa_agent.api.server import ActivationError, ApiServer, activated_socket

from .fake_service import FakeService

REPO = Path(__file__).resolve().parents[2]


def listening_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)  # what the socket unit's SocketMode= set, not the agent's mode
    sock.listen(16)
    return sock


def activation_env(fds: int = 1, names: str | None = "api") -> dict[str, str]:
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": str(fds), "OTHER": "kept"}
    if names is not None:
        env["LISTEN_FDNAMES"] = names
    return env


# ------------------------------------------------------------ activation
def test_serves_on_the_passed_socket_and_never_unlinks_it(fake, sock_dir):
    path = f"{sock_dir}/agent.sock"
    systemd_side = listening_socket(path)
    passed_fd = os.dup(systemd_side.fileno())
    env = activation_env()
    srv = ApiServer(fake, path, socket_mode=0o600, environ=env, listen_fds_start=passed_fd,
                    poll_interval=0.05).start()
    try:
        assert srv.activated
        assert env == {"OTHER": "kept"}  # LISTEN_* taken, nothing else touched
        assert request(path, "GET", "/v1/health")[0] == 200
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666  # the unit's mode, not re-chmodded
    finally:
        srv.stop()
    # systemd's socket is still there and still listening: a client queues for the next agent.
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(path)
    probe.close()
    with pytest.raises(OSError):
        os.fstat(passed_fd)  # ours was closed
    systemd_side.close()


def test_second_fd_is_chosen_by_name(sock_dir):
    a = listening_socket(f"{sock_dir}/a.sock")
    b = listening_socket(f"{sock_dir}/b.sock")
    # Two consecutive fds, as systemd passes them.
    first = os.dup(a.fileno())
    second = first + 1
    try:
        os.dup2(b.fileno(), second)
        env = activation_env(fds=2, names="metrics:api")
        sock = activated_socket(env, os.getpid(), start=first)
        assert sock is not None and sock.getsockname() == f"{sock_dir}/b.sock"
        sock.close()
    finally:
        os.close(first)
        a.close()
        b.close()


def test_not_for_us_or_absent_is_ignored(fake, sock_dir):
    assert activated_socket({}, os.getpid()) is None
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "OTHER": "kept"}  # meant for another process
    assert activated_socket(env, os.getpid()) is None
    assert env == {"OTHER": "kept"}  # unset all the same, as sd_listen_fds(1) does
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", environ=env).start()  # binds as usual
    try:
        assert not srv.activated and request(srv.socket_path, "GET", "/v1/health")[0] == 200
    finally:
        srv.stop()
    assert not os.path.exists(f"{sock_dir}/agent.sock")


@pytest.mark.parametrize("kind", ["datagram", "not listening", "tcp"])
def test_a_passed_fd_that_is_no_listening_unix_stream_socket_is_refused(sock_dir, kind):
    if kind == "datagram":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    elif kind == "tcp":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(f"{sock_dir}/x.sock")
    try:
        with pytest.raises(ActivationError, match="not a listening Unix stream socket"):
            activated_socket(activation_env(), os.getpid(), start=sock.fileno())
        os.fstat(sock.fileno())  # left open for its owner
    finally:
        sock.close()


def test_real_fd_3_activation_in_a_child(sock_dir):
    """As systemd does it: fd 3, LISTEN_PID of the served process itself."""
    path = f"{sock_dir}/agent.sock"
    systemd_side = listening_socket(path)
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from numa_agent.api.server import ApiServer
        from tests.api.fake_service import FakeService
        srv = ApiServer(FakeService(), {path!r}, poll_interval=0.05).start()
        print(srv.activated, "LISTEN_PID" in os.environ, flush=True)
        sys.stdin.readline()
        srv.stop()
    """)
    fd = systemd_side.fileno()
    # What systemd does between fork and exec: the socket to fd 3, LISTEN_PID its own pid.
    launcher = (f"import os, sys; os.dup2({fd}, 3); os.close({fd}); "
                "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
                "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])")
    child = subprocess.Popen([sys.executable, "-c", launcher, script], pass_fds=(fd,),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().split() == ["True", "False"]
        assert request(path, "GET", "/v1/health")[0] == 200
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait(10) == 0
        assert os.path.exists(path)
    finally:
        child.kill()
        systemd_side.close()


# ------------------------------------------------------------ restarts
def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            out["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_client_waits_for_a_restarted_server(fake, sock_dir, capsys):
    path = f"{sock_dir}/agent.sock"
    ApiServer(fake, path, poll_interval=0.05).start().stop()  # the agent stopped: no socket
    os.mkdir(f"{sock_dir}/state")
    lock = os.open(f"{sock_dir}/state/lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # its successor starting: it holds the state directory
    body = {"cpus": 1, "request_id": new_request_id()}
    t, out = _in_thread(lambda: request(path, "POST", "/v1/workloads", body, busy_retry=20))
    time.sleep(1.5)
    assert t.is_alive()  # still waiting
    successor = ApiServer(fake, path, poll_interval=0.05).start()
    try:
        t.join(20)
    finally:
        successor.stop()
        os.close(lock)
    assert out.get("value", out.get("error"))[0] == 201
    assert "is starting (an agent holds its state directory's lock" in capsys.readouterr().err


def test_client_retries_a_refused_connection(fake, sock_dir):
    path = f"{sock_dir}/agent.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)  # a socket file nobody listens on: ECONNREFUSED
    t, out = _in_thread(lambda: request(path, "GET", "/v1/health", busy_retry=20))
    time.sleep(0.5)
    dead.close()
    srv = ApiServer(fake, path, poll_interval=0.05).start()
    try:
        t.join(20)
    finally:
        srv.stop()
    assert out["value"][0] == 200


def test_server_stop_mid_request_is_retried_when_safe(fake, sock_dir):
    """A stop closes unfinished connections; a repeatable request comes back
    to the next server, a POST without request id reports the failure."""
    path = f"{sock_dir}/agent.sock"
    hangup = listening_socket(path)  # accepts, then closes without an answer

    def drop(n):
        for _ in range(n):
            conn, _ = hangup.accept()
            conn.recv(65536)
            conn.close()
    dropper = threading.Thread(target=drop, args=(2,))
    dropper.start()
    with pytest.raises(BadResponse, match="incomplete HTTP response"):
        request(path, "POST", "/v1/workloads", {"cpus": 1}, busy_retry=20)
    t, out = _in_thread(lambda: request(path, "POST", "/v1/workloads",
                                        {"cpus": 1, "request_id": new_request_id()}, busy_retry=20))
    dropper.join(10)
    hangup.close()
    os.unlink(path)
    srv = ApiServer(fake, path, poll_interval=0.05).start()
    try:
        t.join(20)
    finally:
        srv.stop()
    assert out["value"][0] == 201
    assert len(fake.workloads) == 1


def test_stop_answers_requests_already_complete(sock_dir):
    """Requests that reached a worker before stop() are answered, not dropped."""
    fake = FakeService()
    gate = threading.Event()
    original = fake.admit

    def slow(req, caller, dry_run=False):
        gate.wait(10)
        return original(req, caller, dry_run)
    fake.admit = slow
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", poll_interval=0.05).start()
    t, out = _in_thread(lambda: request(srv.socket_path, "POST", "/v1/workloads", {"cpus": 1},
                                        busy_retry=0))
    time.sleep(0.3)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    time.sleep(0.3)
    gate.set()
    stopper.join(10)
    t.join(10)
    assert out["value"][0] == 201


def test_no_retry_budget_fails_at_once(sock_dir, monkeypatch):
    monkeypatch.setenv("NUMA_AGENT_RETRY_SECONDS", "0")
    started = time.monotonic()
    with pytest.raises(AgentUnreachable, match="no agent runs or starts there"):
        request(f"{sock_dir}/none.sock", "GET", "/v1/health")
    print(f"\nfailed after {time.monotonic() - started:.3f} s")


def test_a_request_timed_out_by_the_agent_is_sent_again(fake, sock_dir):
    """On an overloaded machine a client may be descheduled past the agent's
    deadline; the 408 comes before the service saw anything, so it retries."""
    path = f"{sock_dir}/agent.sock"
    slow_side = listening_socket(path)

    def answer_408():
        conn, _ = slow_side.accept()
        conn.sendall(b'HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n'
                     b'Connection: close\r\n\r\n{"error": {"code": "request_timeout", '
                     b'"message": "request not received within 2 s", "details": {}}}')
        conn.close()
        slow_side.close()
        os.unlink(path)
        out["server"] = ApiServer(fake, path, poll_interval=0.05).start()

    out: dict = {}
    t = threading.Thread(target=answer_408)
    t.start()
    try:
        status, body = request(path, "POST", "/v1/workloads", {"cpus": 1}, busy_retry=20)
    finally:
        t.join(10)
        out["server"].stop()
    assert status == 201 and len(fake.workloads) == 1


def test_an_answer_not_in_time_is_asked_again_only_when_safe(fake, sock_dir):
    """A stalled agent (a saturated machine) takes the request and answers
    late: a request with a request id asks again, one without fails."""
    path = f"{sock_dir}/agent.sock"
    stalled = listening_socket(path)
    held = []

    def take(n):
        for _ in range(n):
            conn, _ = stalled.accept()
            held.append(conn)  # read nothing, answer nothing
    taker = threading.Thread(target=take, args=(2,))
    taker.start()
    with pytest.raises(BadResponse, match="did not answer in time"):
        request(path, "POST", "/v1/workloads", {"cpus": 1}, timeout=0.5, busy_retry=20)
    t, out = _in_thread(lambda: request(path, "POST", "/v1/workloads",
                                        {"cpus": 1, "request_id": new_request_id()}, timeout=0.5, busy_retry=20))
    taker.join(10)
    time.sleep(0.7)  # the second attempt timed out too
    stalled.close()
    os.unlink(path)
    srv = ApiServer(fake, path, poll_interval=0.05).start()
    try:
        t.join(20)
    finally:
        srv.stop()
        for conn in held:
            conn.close()
    assert out["value"][0] == 201 and len(fake.workloads) == 1


def test_an_answer_nested_past_the_parsers_depth_is_a_bad_response(sock_dir):
    """Whatever listens on the socket path, numa-run says one line, not a RecursionError."""
    path = f"{sock_dir}/agent.sock"
    impostor = listening_socket(path)
    body = b"[" * 100_000 + b"]" * 100_000

    def answer():
        conn, _ = impostor.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        conn.close()
    t = threading.Thread(target=answer)
    t.start()
    try:
        with pytest.raises(BadResponse, match="is not JSON"):
            request(path, "GET", "/v1/health", busy_retry=0)
    finally:
        t.join(10)
        impostor.close()
