"""/metrics holds a bounded number of connections, each with a deadline for its
whole request head, and turns away what is beyond the bound (503) or a peer's
share of it; an idle or trickling client is dropped, never kept for ever."""

from __future__ import annotations

import os
import socket

import pytest

from numa_agent.views.metrics import (
    METRICS_CONNECTIONS_CEILING,
    METRICS_CONNECTIONS_FLOOR,
    _peer_of,
    build_registry,
    metrics_connection_cap,
    metrics_per_peer_cap,
    render_scrape,
    start_metrics_server,
)

SNAPSHOT = {"status": {"enforcement": "simulated"}, "counters": {}}
# A bound on how long a test waits for the server to act, never a measured figure.
PATIENCE = 30.0


@pytest.fixture(params=["tcp", "unix"])
def serve(request, tmp_path):
    servers = []

    def start(**limits):
        address = "127.0.0.1:0" if request.param == "tcp" else f"unix:{tmp_path / 'metrics.sock'}"
        server = start_metrics_server(address, build_registry(lambda: SNAPSHOT, version="t"), **limits)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def connect(server) -> socket.socket:
    if server.url.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(server.url[len("unix:"):])
    else:
        s = socket.create_connection((server.host, server.port))
    s.settimeout(PATIENCE)
    return s


def read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def scrape(server) -> tuple[bytes, bytes]:
    with connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head, _, body = read_all(s).partition(b"\r\n\r\n")
    return head, body


def settled(server, open_connections: int) -> None:
    """Wait (a bound, not a measure) until the server holds `open_connections`."""
    import time

    give_up = time.monotonic() + PATIENCE
    while server.stats()["open_connections"] != open_connections and time.monotonic() < give_up:
        time.sleep(0.01)
    assert server.stats()["open_connections"] == open_connections


def test_idle_connections_beyond_the_bound_are_answered_503_and_a_scrape_works_once_they_expire(serve):
    server = serve(max_connections=4, deadline=0.5)
    per_peer = server.stats()["max_per_peer"]
    assert per_peer == 1  # a quarter of 4: here every connection is the same peer
    idle = [connect(server) for _ in range(per_peer)]
    settled(server, per_peer)
    extra = [connect(server) for _ in range(20)]
    for s in extra:  # turned away at once, not held open
        assert read_all(s).startswith(b"HTTP/1.1 503 ")
        s.close()
    assert server.stats()["open_connections"] == per_peer
    for s in idle:  # the deadline drops them, though they never send a byte
        assert read_all(s).startswith(b"HTTP/1.1 408 ")
        s.close()
    head, body = scrape(server)
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    assert b'numa_agent_metrics_refused_connections_total{reason="per_peer_limit"} 20.0' in body
    assert b'numa_agent_metrics_refused_connections_total{reason="timeout"} 1.0' in body


def test_the_bound_holds_across_peers(serve):
    server = serve(max_connections=4, deadline=60)
    server._httpd.max_per_peer = 4  # every connection here is one peer: let the total bind first
    held = [connect(server) for _ in range(4)]
    settled(server, 4)
    with connect(server) as s:
        assert read_all(s).startswith(b"HTTP/1.1 503 ")
    assert server.stats()["refused_connections_total"]["busy"] == 1
    held.pop().close()
    settled(server, 3)
    head, _ = scrape(server)
    assert head.startswith(b"HTTP/1.1 200 OK")
    for s in held:
        s.close()


def test_a_client_trickling_its_head_is_dropped_at_the_deadline_for_the_whole_head(serve):
    server = serve(max_connections=8, deadline=0.5)
    with connect(server) as s:
        s.settimeout(0.05)
        answer = b""
        for _ in range(int(PATIENCE / 0.05)):  # a byte every 50 ms, never a blank line
            try:
                s.send(b"X")
                answer = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                answer = b"closed"
            break
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b"closed"
    assert server.stats()["refused_connections_total"]["timeout"] == 1


def test_a_half_request_then_nothing_is_dropped(serve):
    server = serve(max_connections=8, deadline=0.5)
    with connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: loc")
        assert read_all(s).startswith(b"HTTP/1.1 408 ")
    settled(server, 0)


def test_a_head_too_large_is_refused(serve):
    server = serve(max_connections=8)
    with connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n")
        assert read_all(s).startswith(b"HTTP/1.1 431 ")


def test_the_bound_is_a_share_of_the_open_file_limit():
    assert metrics_connection_cap(64) == METRICS_CONNECTIONS_FLOOR
    assert metrics_connection_cap(1024) == 64 == METRICS_CONNECTIONS_CEILING
    assert metrics_connection_cap(512) == 32
    assert metrics_connection_cap(1 << 20) == METRICS_CONNECTIONS_CEILING
    assert metrics_per_peer_cap(64) == 16 and metrics_per_peer_cap(2) == 1


def test_the_peer_is_the_uid_on_a_unix_socket_and_the_address_on_tcp():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert _peer_of(a, "") == ("uid", os.getuid())
    with socket.socket() as s:
        assert _peer_of(s, ("192.0.2.7", 41000)) == ("address", "192.0.2.7")


def test_a_local_tcp_peer_is_its_uid_whichever_loopback_address_it_uses():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        for source in ("127.0.0.2", "127.0.0.3"):
            with socket.socket() as client:
                client.bind((source, 0))
                client.connect(listener.getsockname())
                conn, address = listener.accept()
                with conn:
                    assert address[0] == source
                    assert _peer_of(conn, address) == ("uid", os.getuid())


def test_one_local_user_cannot_take_every_slot_from_many_loopback_addresses():
    # 127.0.0.0/8 is all this host's: a user who binds each connection to another
    # loopback address is still one peer, held to its share of the bound.
    server = start_metrics_server("127.0.0.1:0", build_registry(lambda: SNAPSHOT, version="t"),
                                  max_connections=8, deadline=PATIENCE)
    held = []
    try:
        for source in ("127.0.0.2", "127.0.0.3"):
            for _ in range(2):  # a quarter of 8 per peer
                s = socket.socket()
                s.bind((source, 0))
                s.connect((server.host, server.port))
                s.settimeout(PATIENCE)
                held.append(s)
        assert read_all(held[2]).startswith(b"HTTP/1.1 503 ")
        assert server.stats()["refused_connections_total"]["per_peer_limit"] >= 1
    finally:
        for s in held:
            s.close()
        server.stop()


def test_render_scrape_answers_as_prometheus_client_does():
    registry = build_registry(lambda: SNAPSHOT, version="t")
    ok = render_scrape(registry, b"GET /metrics?name[]=numa_agent_info HTTP/1.1\r\nAccept: text/plain")
    head, _, body = ok.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in head
    assert body.startswith(b"# HELP numa_agent_info") and b"numa_agent_workloads" not in body
    zipped = render_scrape(registry, b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip")
    assert b"Content-Encoding: gzip" in zipped.partition(b"\r\n\r\n")[0]
    only_head = render_scrape(registry, b"HEAD /metrics HTTP/1.1")
    assert only_head.endswith(b"\r\n\r\n") and b"Content-Length: 0" not in only_head
    assert render_scrape(registry, b"POST /metrics HTTP/1.1").startswith(b"HTTP/1.1 405 ")
    assert render_scrape(registry, b"garbage").startswith(b"HTTP/1.1 400 ")


def test_a_stop_before_the_serving_thread_runs_still_ends_it(monkeypatch):
    import select

    from numa_agent.views import metrics

    serve = metrics.MetricsListener.serve_forever

    ended = []

    def late(self):
        waiting = select.poll()  # not select(): a full run's descriptors may number past 1023
        waiting.register(self._wake_r, select.POLLIN)
        waiting.poll(PATIENCE * 1000)  # shutdown() has told it to end by then
        try:
            serve(self)
        except Exception as exc:  # e.g. its selector closed under it by server_close()
            ended.append(exc)
        else:
            ended.append("cleanly")

    monkeypatch.setattr(metrics.MetricsListener, "serve_forever", late)
    server = start_metrics_server("127.0.0.1:0", build_registry(lambda: SNAPSHOT, version="t"))
    thread = server._thread
    server.stop()
    thread.join(PATIENCE)
    assert ended == ["cleanly"]
