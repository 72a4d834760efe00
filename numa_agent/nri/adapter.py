"""The NRI plugin kept connected: one thread that connects to the runtime's NRI
socket, registers (plugin.PluginSession), serves until the session ends, and
connects again, until the agent stops.

- Between attempts it waits with capped exponential backoff: BACKOFF_FIRST
  seconds doubling to BACKOFF_CAP, each wait cut by up to JITTER of itself at
  random (so agents on many nodes do not knock on their runtimes in step). A
  session that lasted BACKOFF_CAP or longer was a working one: the next wait
  starts from BACKOFF_FIRST again (a runtime restart is met within a second);
  a runtime that breaks every session at once keeps the waits growing.
- A socket that is missing (the runtime not started yet, or NRI off in its
  configuration), or that is refused (owned by another user, or in a
  directory another user can write: `plugin.connect`'s trusted-directory
  rule) is tried again at every wait, but said once: one log line per
  distinct reason, again only after a session came and went.
- Each session begins as the runtime begins it: Configure, then Synchronize,
  which the session hands to the handler, so a new session (after the
  runtime or the agent restarted) rebuilds the handler's view from what the
  runtime has.
- A session the runtime breaks (garbage, a close mid-message) ends; the
  adapter says so in one line and reconnects. It calls nothing of the
  handler for it: what the handler booked stays until the next Synchronize
  says otherwise.
- The handler is called by one session at a time: a lock around every call
  keeps a broken session's last call and the next session's first apart
  (the handler is the agent's state owner: calls in order, never two at once).
- `stop()` closes the session and ends the thread within a second.

The adapter counts what the metrics give (`stats()`) and says how it stands
(`health()`); neither reads anything but its own fields.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from numa_agent.core.backoff import Backoff
from numa_agent.core.histogram import Histogram
from numa_agent.nri import plugin

log = logging.getLogger("numa_agent.nri")

BACKOFF_FIRST = 0.5  # seconds before the first reconnection
BACKOFF_CAP = 30.0  # the longest wait; a session that lasted this long resets the backoff
JITTER = 0.2  # each wait is cut by up to this share of itself, at random
STOP_WITHIN = 1.0  # seconds stop() waits for the thread
# The handler's calls, by their NRI method names: the metrics' `call` label (a fixed set).
CALLS = ("Synchronize", "CreateContainer", "UpdateContainer", "StopContainer", "StateChange")
# Seconds: an NRI call must be answered within the runtime's 2 s (plugin_request_timeout).
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


class NriSettings(Protocol):
    """The [nri] keys the adapter reads (daemon/config.py's AgentConfig has them)."""

    @property
    def nri_socket(self) -> str: ...

    @property
    def nri_plugin_name(self) -> str: ...

    @property
    def nri_plugin_index(self) -> str: ...


Connect = Callable[..., socket.socket]  # plugin.connect(path, owners=...)


class NriAdapter:
    """The plugin's connection to the runtime, kept up by a thread: start(), stop()."""

    def __init__(self, config: NriSettings, handler: plugin.NriHandler, *, connect: Connect = plugin.connect,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] | None = None,
                 jitter: Callable[[], float] = random.random, owners: Iterable[int] | None = None,
                 registration_timeout: float = plugin.REGISTRATION_TIMEOUT) -> None:
        self.socket_path = config.nri_socket
        self.name = config.nri_plugin_name
        self.index = plugin.check_index(config.nri_plugin_index)
        self.handler = handler
        self._connect = connect
        self._clock = clock
        self._stopping = threading.Event()
        # The waits between attempts; by default on the stop event, so stop() ends one at once.
        self._sleep = sleep if sleep is not None else self._stopping.wait
        self._jitter = jitter
        self._owners = None if owners is None else frozenset(owners)
        self._registration_timeout = registration_timeout
        self._lock = threading.Lock()  # the fields below; the current session
        self._handler_lock = threading.Lock()  # one handler call at a time, across sessions
        self._session: plugin.PluginSession | None = None
        self._thread: threading.Thread | None = None
        self._said: str | None = None  # the last reason logged for not being connected
        self.connected = False
        self.error: str | None = None  # why not connected now (None: connected, or not tried yet)
        self.connections_total = 0
        self.refusals_total = 0
        self.requests: dict[str, int] = dict.fromkeys(CALLS, 0)
        self.durations: dict[str, Histogram] = {call: Histogram(DURATION_BUCKETS) for call in CALLS}

    # --- the thread

    def start(self) -> NriAdapter:
        log.info("NRI: plugin %s-%s connects to %s", self.index, self.name, self.socket_path)
        self._thread = threading.Thread(target=self.run, name="numa-agent-nri", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            session = self._session
        if session is not None:
            _shut(session)
        if self._thread is not None:
            self._thread.join(STOP_WITHIN)

    @property
    def stopped(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def run(self) -> None:
        """Connect, serve, wait, again, until stop()."""
        backoff = Backoff.starting(BACKOFF_FIRST, BACKOFF_CAP)
        while not self._stopping.is_set():
            try:
                lasted = self._attempt()
            except Exception as e:  # the kernel refused a descriptor or a thread: one attempt lost, not the thread
                self._not_connected(f"NRI: connecting to {self.socket_path} failed: {type(e).__name__}: "
                                    f"{' '.join(str(e).split())}; retrying")
                lasted = None
            if self._stopping.is_set():
                break
            if lasted is not None and lasted >= BACKOFF_CAP:
                backoff = backoff.reset()
            self._sleep(backoff.jittered(JITTER, self._jitter))
            backoff = backoff.doubled()
        log.info("NRI: plugin %s-%s stopped", self.index, self.name)

    def _attempt(self) -> float | None:
        """One connection and its session: how long the session lasted (None: no session)."""
        try:
            sock = self._connect(self.socket_path, owners=self._owners)
        except plugin.NriError as e:
            self._not_connected(str(e))
            return None
        session = plugin.PluginSession(sock, _Counted(self), self.name, self.index,
                                       registration_timeout=self._registration_timeout)
        with self._lock:
            if self._stopping.is_set():
                sock.close()
                return None
            self._session = session
        began = self._clock()
        why = "the runtime closed the connection"
        try:
            session.start()
            session.register()
            with self._lock:
                self.connected, self.error, self._said = True, None, None
                self.connections_total += 1
            session.wait()
        except plugin.NriError as e:
            why = str(e)
        finally:
            _shut(session)
            with self._lock:
                was, self.connected, self._session = self.connected, False, None
        lasted = self._clock() - began
        if not self._stopping.is_set():
            if was:
                self._not_connected(f"NRI session with {session.runtime or 'the runtime'} ended after "
                                    f"{lasted:.1f} s: {why.removeprefix('NRI: ')}; reconnecting", again=True)
            else:
                self._not_connected(f"NRI: registering as plugin {self.index}-{self.name} on {self.socket_path} "
                                    f"failed: {why.removeprefix('NRI: ')}; retrying")
        return lasted

    def _not_connected(self, why: str, again: bool = False) -> None:
        """Logs `why` unless it was the last thing said (`again`: said, and forgotten:
        the next reason is said even if it is the same as before the session)."""
        with self._lock:
            self.error = why
            said, self._said = self._said, None if again else why
        if why != said:
            log.warning("%s", why)

    # --- what the handler is asked, counted and timed

    def _call(self, call: str, method: Callable[[Any], Any], argument: Any) -> Any:
        with self._handler_lock:
            began = self._clock()
            try:
                return method(argument)
            except plugin.NriRefusal:
                with self._lock:
                    self.refusals_total += 1
                raise
            finally:
                took = self._clock() - began
                with self._lock:
                    self.requests[call] += 1
                    self.durations[call].observe(took)

    # --- reports

    def stats(self) -> dict[str, Any]:
        """What the metrics give (views/metrics.py's nri families), as one consistent copy."""
        with self._lock:
            return {"connected": self.connected, "connections_total": self.connections_total,
                    "requests_total": dict(self.requests),
                    "request_duration_seconds": {call: h.snapshot() for call, h in self.durations.items()},
                    "refusals_total": self.refusals_total}

    def health(self) -> dict[str, Any]:
        """How the plugin stands, for `GET /v1/health` and `numa-agent status`."""
        with self._lock:
            runtime = self._session.runtime if self.connected and self._session is not None else ""
            return {"enabled": True, "connected": self.connected, "socket": self.socket_path,
                    "plugin": f"{self.index}-{self.name}", "runtime": runtime or None,
                    "error": None if self.connected else self.error, "connections": self.connections_total}


class _Counted:
    """The adapter's handler as the session sees it: each call counted, timed and
    made one at a time."""

    def __init__(self, adapter: NriAdapter) -> None:
        self._adapter = adapter

    def synchronize(self, pods: Sequence[Any], containers: Sequence[Any]) -> Sequence[Any]:
        adapter = self._adapter
        return adapter._call("Synchronize", lambda both: adapter.handler.synchronize(*both), (pods, containers))

    def create_container(self, request: Any) -> Any:
        return self._adapter._call("CreateContainer", self._adapter.handler.create_container, request)

    def update_container(self, request: Any) -> Any:
        return self._adapter._call("UpdateContainer", self._adapter.handler.update_container, request)

    def stop_container(self, request: Any) -> Any:
        return self._adapter._call("StopContainer", self._adapter.handler.stop_container, request)

    def state_change(self, event: Any) -> None:
        self._adapter._call("StateChange", self._adapter.handler.state_change, event)

    def answer_lost(self, method: str) -> None:  # no call of the runtime's: not counted
        with self._adapter._handler_lock:
            self._adapter.handler.answer_lost(method)


def _shut(session: plugin.PluginSession) -> None:
    try:
        session.close()
    except OSError:
        pass
