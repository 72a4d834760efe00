"""A gate in front of a server that cannot bound connections per peer (grpcio).

grpcio offers no hook before the HTTP/2 handshake, so by itself it can only
bound the total: one member of the socket's group holding that many
handshaken, idle connections would shut every other client out. The gate
owns the public socket instead. One thread multiplexes it with `selectors`:
it accepts, reads the peer's uid (SO_PEERCRED, as /metrics does), closes a
connection beyond the total bound (`busy`) or beyond the peer's share of it
(`per_peer_limit`), and splices each admitted one byte for byte to the
server's own listening socket, which lives in a directory only the agent's
user can enter. What is turned away is counted by reason (`stats()`, and the
`numa_agent_pod_resources_refused_connections` family) and logged at most
once a second.

A pair ends when the server closes its side (what it sent is passed on
first, for at most FLUSH_SECONDS), or on any error; a client's end of input
is passed on as a half-close, so the server still answers it.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from numa_agent.views.metrics import PREFIX, _peer_of, metrics_per_peer_cap

log = logging.getLogger("numa_agent.kubelet")

REFUSAL_REASONS = ("busy", "per_peer_limit")
CHUNK = 64 * 1024  # bytes read at once, and held at most per direction
FLUSH_SECONDS = 5.0  # the server closed: what it sent reaches a reader within this, or is dropped

_LISTENING = object()
_WAKING = object()


class _End:
    """One socket of a pair, and what waits to be written to it."""

    __slots__ = ("sock", "pair", "out", "eof_in")

    def __init__(self, sock: socket.socket, pair: "_Pair") -> None:
        self.sock = sock
        self.pair = pair
        self.out = b""  # to be written to this socket
        self.eof_in = False  # this socket said it sends nothing more


class _Pair:
    __slots__ = ("client", "server", "peer", "closing_at")

    def __init__(self, client: socket.socket, server: socket.socket, peer: tuple[str, Any]) -> None:
        self.client = _End(client, self)
        self.server = _End(server, self)
        self.peer = peer
        self.closing_at = 0.0  # set when the server has closed: the pair ends by then

    def other(self, end: _End) -> _End:
        return self.server if end is self.client else self.client


class ConnectionGate:
    """Accepts on `listener`, passes each admitted connection to `upstream`
    (a Unix socket path). Run `serve_forever` in a thread; `shutdown` and
    `server_close` from another."""

    def __init__(self, listener: socket.socket, upstream: str, *, max_connections: int,
                 max_per_peer: int | None = None, what: str = "PodResources",
                 peer_of: Callable[[socket.socket, Any], tuple[str, Any]] = _peer_of) -> None:
        self.socket = listener
        self.upstream = upstream
        self.what = what
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer or metrics_per_peer_cap(max_connections)
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self._peer_of = peer_of
        self._pairs: set[_Pair] = set()
        self._per_peer: dict[tuple[str, Any], int] = {}
        self._closing: deque[_Pair] = deque()
        self._unlogged: dict[str, int] = {}
        self._logged_at = -1e9
        self._paused_until = 0.0
        self._accepting = True
        self._running = True
        self._done = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (listener, self._wake_r, self._wake_w):
            end.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, _LISTENING)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKING)

    def stats(self) -> dict[str, Any]:
        """Connections open and turned away so far, by reason (base units, stable keys)."""
        return {"open_connections": len(self._pairs), "max_connections": self.max_connections,
                "max_per_peer": self.max_per_peer, "refused_connections_total": dict(self.refused)}

    # -- lifecycle ---------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while self._running:
                for key, mask in self._sel.select(self._timeout(time.monotonic())):
                    self._ready(key.data, mask)
                self._expire(time.monotonic())
        finally:
            for pair in list(self._pairs):
                self._close(pair)
            self._done.set()

    def stop_accepting(self) -> None:
        """New connections wait in the backlog (and fail when the socket goes); held ones go on."""
        self._accepting = False
        self._wake()

    def shutdown(self) -> None:
        self._running = False
        self._wake()
        self._done.wait(timeout=5)

    def server_close(self) -> None:
        self._sel.close()
        for end in (self.socket, self._wake_r, self._wake_w):
            end.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    # -- the loop ----------------------------------------------------------------
    def _timeout(self, now: float) -> float:
        wait = 0.5
        if self._closing:
            wait = min(wait, self._closing[0].closing_at - now)
        if self._paused_until:
            wait = min(wait, self._paused_until - now)
        return max(0.0, wait)

    def _ready(self, data: Any, mask: int) -> None:
        if data is _LISTENING:
            self._accept()
        elif data is _WAKING:
            try:
                while self._wake_r.recv(64):
                    pass
            except OSError:
                pass
            if not self._accepting and self._listening():
                self._sel.unregister(self.socket)
        else:
            try:
                self._on_event(data, mask)
            except Exception:  # one connection's trouble must not stop the endpoint
                log.exception("%s connection handling failed", self.what)
                self._close(data.pair)

    def _listening(self) -> bool:
        try:
            return self._sel.get_key(self.socket).data is _LISTENING
        except KeyError:
            return False

    def _accept(self) -> None:
        for _ in range(64):
            if not self._accepting:
                return
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                log.warning("cannot accept %s connections: %s; pausing accepts for 0.1 s", self.what, exc)
                self._sel.unregister(self.socket)
                self._paused_until = time.monotonic() + 0.1
                return
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        if len(self._pairs) >= self.max_connections:
            self._refuse(sock, "busy")
            return
        try:
            peer = self._peer_of(sock, address)
        except OSError:
            sock.close()
            return
        if self._per_peer.get(peer, 0) >= self.max_per_peer:
            self._refuse(sock, "per_peer_limit")
            return
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.setblocking(False)
        try:
            server.connect(self.upstream)
        except OSError as exc:  # the server's backlog is full (EAGAIN) or it is gone
            server.close()
            if exc.errno not in (errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT):
                log.warning("cannot reach the %s server at %s: %s", self.what, self.upstream, exc)
            self._refuse(sock, "busy")
            return
        sock.setblocking(False)
        pair = _Pair(sock, server, peer)
        self._pairs.add(pair)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._sel.register(sock, selectors.EVENT_READ, pair.client)
        self._sel.register(server, selectors.EVENT_READ, pair.server)

    def _refuse(self, sock: socket.socket, reason: str) -> None:
        sock.close()
        self.refused[reason] += 1
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            log.warning("%s connections turned away in the last second or so: %s (at most %d at once, "
                        "%d per user)", self.what,
                        ", ".join(f"{n} {why}" for why, n in sorted(self._unlogged.items())),
                        self.max_connections, self.max_per_peer)
            self._unlogged.clear()
            self._logged_at = now

    def _on_event(self, end: _End, mask: int) -> None:
        pair = end.pair
        if pair not in self._pairs:
            return
        if mask & selectors.EVENT_WRITE and end.out and not self._flush(end):
            return
        if mask & selectors.EVENT_READ and not end.eof_in and not self._pass_on(end):
            return
        self._interest(pair.client)
        self._interest(pair.server)

    def _send(self, end: _End) -> bool:
        """Write what waits for `end`; False when the pair has ended."""
        try:
            sent = end.sock.send(end.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(end.pair)
            return False
        end.out = end.out[sent:]
        return True

    def _flush(self, end: _End) -> bool:
        pair = end.pair
        if not self._send(end):
            return False
        if not end.out:
            if pair.closing_at and end is pair.client:
                self._close(pair)  # all the server said has been passed on
                return False
            if pair.other(end).eof_in:
                self._half_close(end)
        return True

    def _half_close(self, end: _End) -> None:
        try:
            end.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _pass_on(self, end: _End) -> bool:
        """Read from `end` into what waits for the other; False when the pair has ended."""
        pair, dst = end.pair, end.pair.other(end)
        try:
            chunk = end.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            self._close(pair)
            return False
        if chunk:
            dst.out += chunk
            return self._send(dst)  # most often it goes at once
        end.eof_in = True
        if end is pair.server:  # the server closed: pass on what is left, then end
            if not dst.out:
                self._close(pair)
                return False
            pair.closing_at = time.monotonic() + FLUSH_SECONDS
            self._closing.append(pair)
        elif not dst.out:
            self._half_close(dst)
        return True

    def _interest(self, end: _End) -> None:
        """Read while nothing waits for the other end; write while something waits for this one."""
        events = 0
        if not end.eof_in and not end.pair.other(end).out:
            events |= selectors.EVENT_READ
        if end.out:
            events |= selectors.EVENT_WRITE
        try:
            key = self._sel.get_key(end.sock)
        except KeyError:
            key = None
        if events == 0:
            if key is not None:
                self._sel.unregister(end.sock)  # until there is something to do with it again
        elif key is None:
            self._sel.register(end.sock, events, end)
        elif key.events != events:
            self._sel.modify(end.sock, events, end)

    def _expire(self, now: float) -> None:
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            if self._accepting:
                self._sel.register(self.socket, selectors.EVENT_READ, _LISTENING)
        while self._closing and self._closing[0].closing_at <= now:
            self._close(self._closing.popleft())

    def _close(self, pair: _Pair) -> None:
        if pair not in self._pairs:
            return
        self._pairs.discard(pair)
        left = self._per_peer.get(pair.peer, 0) - 1
        if left > 0:
            self._per_peer[pair.peer] = left
        else:
            self._per_peer.pop(pair.peer, None)
        for end in (pair.client, pair.server):
            try:
                self._sel.unregister(end.sock)
            except (KeyError, ValueError):
                pass
            end.sock.close()


class GateCollector:
    """The gate's own refusals, as `numa_agent_<name>_refused_connections` (and open/max gauges)."""

    def __init__(self, gate: Callable[[], ConnectionGate | None], name: str, what: str) -> None:
        self._gate = gate
        self._name = name
        self._what = what

    def collect(self) -> Iterator[Metric]:
        gate = self._gate()
        if gate is None:
            return
        stats = gate.stats()
        refused = CounterMetricFamily(
            PREFIX + self._name + "_refused_connections",
            f"{self._what} connections turned away: busy (connection bound), per_peer_limit "
            "(one uid at its share).", labels=["reason"])
        for reason in REFUSAL_REASONS:
            refused.add_metric([reason], float(stats["refused_connections_total"][reason]))
        yield refused
        yield GaugeMetricFamily(PREFIX + self._name + "_open_connections",
                                f"{self._what} connections open now.", value=float(stats["open_connections"]))
        yield GaugeMetricFamily(PREFIX + self._name + "_max_connections",
                                f"{self._what} connections held at most at once.",
                                value=float(stats["max_connections"]))
