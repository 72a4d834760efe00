"""The client runs the caller's next work while the agent answers: after the
request is sent, before the answer is read, and once however often it retries."""

from __future__ import annotations

import threading

from numa_agent.api.client import request
from tests.api.test_activation_and_restart import listening_socket

CREATED = (b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n'
           b'{"name": "wl-1"}')
BUSY = (b'HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n'
        b'Connection: close\r\n\r\n{"error": {"code": "busy", "message": "busy", "details": {}}}')


def _agent(path: str, answers: list[bytes], received: threading.Event, ran: threading.Event,
           seen: list[bool]):
    """Answers each connection in turn, each only once the request came in full and,
    for the last, once `ran` is set (or 10 s passed: the test then fails on `seen`)."""
    sock = listening_socket(path)

    def serve():
        try:
            for i, answer in enumerate(answers):
                conn, _ = sock.accept()
                with conn:
                    data = b""
                    while b'"cpus"' not in data:
                        data += conn.recv(65536)
                    received.set()
                    if i == len(answers) - 1:
                        seen.append(ran.wait(10))
                    conn.sendall(answer)
        finally:
            sock.close()
    thread = threading.Thread(target=serve, daemon=True)  # a client that never came leaves it
    thread.start()
    return thread


def test_the_waiting_work_runs_after_the_request_is_sent_and_before_the_answer(sock_dir):
    path = f"{sock_dir}/agent.sock"
    received, ran, seen, calls = threading.Event(), threading.Event(), [], []

    def prepare():
        calls.append(received.wait(10))  # the agent has the whole request already
        ran.set()
    agent = _agent(path, [CREATED], received, ran, seen)
    try:
        status, answer = request(path, "POST", "/v1/workloads", {"cpus": 1}, busy_retry=0,
                                 while_waiting=prepare)
    finally:
        agent.join(20)
    assert (status, answer) == (201, {"name": "wl-1"})
    assert calls == [True]   # after the send
    assert seen == [True]    # and the agent answered only once it had run: before the read


def test_the_waiting_work_runs_once_across_retries(sock_dir):
    path = f"{sock_dir}/agent.sock"
    received, ran, seen, calls = threading.Event(), threading.Event(), [], []

    def prepare():
        calls.append(1)
        ran.set()
    agent = _agent(path, [BUSY, BUSY, CREATED], received, ran, seen)
    try:
        status, _ = request(path, "POST", "/v1/workloads", {"cpus": 1, "request_id": "ab" * 16},
                            busy_retry=20, while_waiting=prepare)
    finally:
        agent.join(20)
    assert status == 201 and seen == [True]
    assert calls == [1]
