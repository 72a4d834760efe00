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
import time
from collections import deque
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from numa_agent.views.bounded import BoundedListener
from numa_agent.views.metrics import PREFIX, _peer_of, metrics_per_peer_cap

log = logging.getLogger("numa_agent.kubelet")

REFUSAL_REASONS = ("busy", "per_peer_limit")
CHUNK = 64 * 1024  # bytes read at once, and held at most per direction
FLUSH_SECONDS = 5.0  # the server closed: what it sent reaches a reader within this, or is dropped


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


class ConnectionGate(BoundedListener):
    """Accepts on `listener`, passes each admitted connection to `upstream`
    (a Unix socket path). Run `serve_forever` in a thread; `shutdown` and
    `server_close` from another. The loop, the bounds and the refusal
    bookkeeping are `BoundedListener`'s (views/bounded.py); the splice is
    this class's."""

    log = log

    def __init__(self, listener: socket.socket, upstream: str, *, max_connections: int,
                 max_per_peer: int | None = None, what: str = "PodResources",
                 peer_of: Callable[[socket.socket, Any], tuple[str, Any]] = _peer_of) -> None:
        self.upstream = upstream
        self.what = what
        self._pairs: set[_Pair] = set()
        self._closing: deque[_Pair] = deque()
        super().__init__(listener, max_connections=max_connections,
                         max_per_peer=max_per_peer or metrics_per_peer_cap(max_connections),
                         reasons=REFUSAL_REASONS, peer_of=peer_of)

    # -- what BoundedListener asks of it ------------------------------------------
    def _open_count(self) -> int:
        return len(self._pairs)

    def _open(self, sock: socket.socket, peer: tuple[str, Any]) -> None:
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
        pair = _Pair(sock, server, peer)
        self._pairs.add(pair)
        self._hold(peer)
        self._sel.register(sock, selectors.EVENT_READ, pair.client)
        self._sel.register(server, selectors.EVENT_READ, pair.server)

    def _drop(self, end: _End) -> None:
        self._close(end.pair)

    def _close_all(self) -> None:
        for pair in list(self._pairs):
            self._close(pair)

    def _next_deadline(self) -> float | None:
        return self._closing[0].closing_at if self._closing else None

    def _expire_connections(self, now: float) -> None:
        while self._closing and self._closing[0].closing_at <= now:
            self._close(self._closing.popleft())

    def _refusal_detail(self) -> str:
        return f" (at most {self.max_connections} at once, {self.max_per_peer} per user)"

    # -- the splice ------------------------------------------------------------------
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

    def _close(self, pair: _Pair) -> None:
        if pair not in self._pairs:
            return
        self._pairs.discard(pair)
        self._release(pair.peer)
        for end in (pair.client, pair.server):
            self._forget(end.sock)


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
