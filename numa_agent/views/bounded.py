"""The skeleton both of the agent's selector-loop servers share: /metrics
(views/metrics.py, `MetricsListener`) and the PodResources gate
(kubelet/gate.py, `ConnectionGate`).

One thread multiplexes a listening socket and its connections with
`selectors`. It accepts up to 64 connections a turn, and when the accept
itself fails (out of descriptors, most often) it stops accepting for 0.1 s
rather than spin. A connection beyond `max_connections` open at once is
turned away as `busy`, one beyond its peer's share (`max_per_peer`: a uid,
or a remote address) as `per_peer_limit`. What is turned away is counted by
reason and logged at most once a second. `shutdown()` and `server_close()`
are called from another thread; a socket pair wakes the loop for them.

A subclass says what a connection is and does: `_open` (an admitted
socket), `_on_event` (one of its selector events), `_drop` (its trouble),
`_close_all`, `_open_count`, and optionally `_next_deadline` and
`_expire_connections` for what it times out.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from typing import Any, Callable

LISTENING = object()
WAKING = object()

PeerOf = Callable[[socket.socket, Any], tuple[str, Any]]


class BoundedListener:
    """Accepts on `listener` from one thread, within a total and a per-peer bound."""

    what = "listener"  # the connections' name in logs and refusal texts
    log = logging.getLogger("numa_agent")

    def __init__(self, listener: socket.socket, *, max_connections: int, max_per_peer: int,
                 reasons: tuple[str, ...], peer_of: PeerOf) -> None:
        self.socket = listener
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.refused = dict.fromkeys(reasons, 0)
        self._peer_of = peer_of
        self._per_peer: dict[tuple[str, Any], int] = {}
        self._paused_until = 0.0
        self._unlogged: dict[str, int] = {}
        self._logged_at = -1e9
        self._accepting = True
        self._running = True  # from here: a shutdown() before the thread runs still ends it
        self._done = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (listener, self._wake_r, self._wake_w):
            end.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, LISTENING)
        self._sel.register(self._wake_r, selectors.EVENT_READ, WAKING)

    @property
    def server_address(self) -> Any:
        return self.socket.getsockname()

    def stats(self) -> dict[str, Any]:
        """Connections open and turned away so far, by reason (base units, stable keys)."""
        return {"open_connections": self._open_count(), "max_connections": self.max_connections,
                "max_per_peer": self.max_per_peer, "refused_connections_total": dict(self.refused)}

    # -- what a subclass says ------------------------------------------------------
    def _open_count(self) -> int:
        raise NotImplementedError

    def _open(self, sock: socket.socket, peer: tuple[str, Any]) -> None:
        """Take an admitted, non-blocking `sock`; call `_hold(peer)` once it is kept."""
        raise NotImplementedError

    def _on_event(self, data: Any, mask: int) -> None:
        raise NotImplementedError

    def _drop(self, data: Any) -> None:
        """Close what `data` (a selector key's data) belongs to after its handling failed."""
        raise NotImplementedError

    def _close_all(self) -> None:
        raise NotImplementedError

    def _next_deadline(self) -> float | None:
        return None

    def _expire_connections(self, now: float) -> None:
        pass

    def _refusal_detail(self) -> str:
        return ""

    # -- lifecycle (serve_forever in its thread; the rest from another) -------------
    def serve_forever(self) -> None:
        try:
            while self._running:
                for key, mask in self._sel.select(self._timeout(time.monotonic())):
                    self._ready(key.data, mask)
                self._expire(time.monotonic())
        finally:
            self._close_all()
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

    # -- the loop ------------------------------------------------------------------
    def _timeout(self, now: float) -> float:
        wait = 0.5
        deadline = self._next_deadline()
        if deadline is not None:
            wait = min(wait, deadline - now)
        if self._paused_until:
            wait = min(wait, self._paused_until - now)
        return max(0.0, wait)

    def _ready(self, data: Any, mask: int) -> None:
        if data is LISTENING:
            self._accept()
        elif data is WAKING:
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
                self.log.exception("%s connection handling failed", self.what)
                self._drop(data)

    def _listening(self) -> bool:
        try:
            return self._sel.get_key(self.socket).data is LISTENING
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
                # Out of descriptors (or worse): stop accepting for a moment, never spin.
                self.log.warning("cannot accept %s connections: %s; pausing accepts for 0.1 s", self.what, exc)
                self._sel.unregister(self.socket)
                self._paused_until = time.monotonic() + 0.1
                return
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        sock.setblocking(False)
        if self._open_count() >= self.max_connections:
            self._refuse(sock, "busy", f"at the limit of {self.max_connections} {self.what} connections")
            return
        try:
            peer = self._peer_of(sock, address)
        except OSError:
            sock.close()
            return
        if self._per_peer.get(peer, 0) >= self.max_per_peer:
            self._refuse(sock, "per_peer_limit", f"{self.max_per_peer} {self.what} connections open from "
                                                 f"{peer[0]} {peer[1]}")
            return
        self._open(sock, peer)

    def _expire(self, now: float) -> None:
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            if self._accepting:
                self._sel.register(self.socket, selectors.EVENT_READ, LISTENING)
        self._expire_connections(now)

    # -- the bookkeeping -------------------------------------------------------------
    def _hold(self, peer: tuple[str, Any]) -> None:
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1

    def _release(self, peer: tuple[str, Any]) -> None:
        left = self._per_peer.get(peer, 0) - 1
        if left > 0:
            self._per_peer[peer] = left
        else:
            self._per_peer.pop(peer, None)

    def _forget(self, sock: socket.socket) -> None:
        """Stop watching a connection's socket (if it is watched) and close it."""
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def _refuse(self, sock: socket.socket, reason: str, text: str = "") -> None:
        """Close a connection turned away (a subclass may first tell it `text`) and count it."""
        sock.close()
        self._count(reason)

    def _count(self, reason: str) -> None:
        self.refused[reason] += 1
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            self.log.warning("%s connections turned away in the last second or so: %s%s", self.what,
                             ", ".join(f"{n} {why}" for why, n in sorted(self._unlogged.items())),
                             self._refusal_detail())
            self._unlogged.clear()
            self._logged_at = now
