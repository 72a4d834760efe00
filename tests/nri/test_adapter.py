"""The adapter that keeps the NRI plugin connected, against the fake runtime: it
waits for a missing socket, refuses one another user owns, reconnects after the
runtime closes, restarts, speaks garbage or closes mid-message, starts each
session with the runtime's Synchronize, counts and times the handler's calls,
and stops. Its waits and its clock are the test's: nothing here sleeps."""

from __future__ import annotations

import logging
import os
import socket
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from numa_agent.nri import adapter as nri_adapter
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri import plugin
from numa_agent.views.metrics import NriCollector
from tests.nri.fake_runtime import FakeRuntime
from tests.nri.test_plugin import EmptyHandler

SETTLE = 10  # seconds a test waits for the adapter's thread at most (never reached when it works)


class Settings:
    def __init__(self, path: str, index: str = "10") -> None:
        self.nri_socket, self.nri_plugin_name, self.nri_plugin_index = path, "numa-agent", index


class Handler(EmptyHandler):
    """The session tests' handler: records the calls; refuses containers named in `refuse`."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()

    def synchronize(self, pods, containers):
        self.calls.append(("synchronize", sorted(c.id for c in containers)))
        return []

    def create_container(self, request):
        if request.container.id in self.refuse:
            self.calls.append(("create", request.container.id))
            raise plugin.NriRefusal("TopologyAffinityError: no NUMA node fits")
        return super().create_container(request)


class Waits:
    """The adapter's sleep: records each wait and returns only when the test lets it
    (`allow`: that many waits return), so the test decides how many attempts are made
    between its steps."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._allowed = 0
        self._done = False
        self._cv = threading.Condition()

    def __call__(self, seconds: float) -> None:
        with self._cv:
            self.asked.append(seconds)
            self._cv.notify_all()
            assert self._cv.wait_for(lambda: self._allowed > 0 or self._done, SETTLE)
            if self._allowed:
                self._allowed -= 1

    def until(self, count: int) -> list[float]:
        """Once the adapter has asked for `count` waits: the waits asked."""
        with self._cv:
            assert self._cv.wait_for(lambda: len(self.asked) >= count, SETTLE), self.asked
            return list(self.asked)

    def allow(self, count: int = 1) -> None:
        with self._cv:
            self._allowed += count
            self._cv.notify_all()

    def finish(self) -> None:
        with self._cv:
            self._done = True
            self._cv.notify_all()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Runtime(FakeRuntime):
    """The fake runtime, accepting the plugin's next connection afresh."""

    def accept_next(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self._buf, self._next_stream = None, b"", 1
        self._streams = {1: b"", 2: b""}
        self.accept(SETTLE)

    def begin(self, containers=()) -> api.RegisterPluginRequest:
        """Accept the plugin, answer its registration, Configure and Synchronize it."""
        self.accept_next()
        registered = self.expect_register()
        self.call("Configure", api.ConfigureRequest(runtime_name="fake", runtime_version="1"), api.ConfigureResponse)
        code, _, _ = self.call("Synchronize", api.SynchronizeRequest(containers=list(containers)),
                               api.SynchronizeResponse)
        assert code == 0
        return registered

    def nobody_knocked(self) -> bool:
        self.listener.setblocking(False)
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return True
        finally:
            self.listener.setblocking(True)
        conn.close()
        return False


def _container(i: str) -> api.Container:
    return api.Container(id=f"ctr-{i}", pod_sandbox_id="pod-1", name=f"c{i}")


def _create(rt: Runtime, i: str):
    return rt.call("CreateContainer", api.CreateContainerRequest(pod=api.PodSandbox(id="pod-1"),
                                                                 container=_container(i)))


def _wait_for(predicate) -> bool:
    done = threading.Event()
    for _ in range(SETTLE * 100):
        if predicate():
            return True
        done.wait(0.01)
    return predicate()


@pytest.fixture
def waits():
    w = Waits()
    yield w
    w.finish()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def handler():
    return Handler()


@pytest.fixture
def make(tmp_path, waits, clock, handler):
    made: list[nri_adapter.NriAdapter] = []

    def make_adapter(path=None, **kw) -> nri_adapter.NriAdapter:
        a = nri_adapter.NriAdapter(Settings(str(path or tmp_path / "nri.sock")), handler, sleep=waits,
                                   clock=clock, jitter=lambda: 0.0, **kw)
        made.append(a.start())
        return a

    yield make_adapter
    waits.finish()
    for a in made:
        a.stop()


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_missing_socket_is_waited_for_said_once_then_connected(tmp_path, make, waits, caplog, handler):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    adapter = make()
    waits.allow(4)
    assert waits.until(5) == [0.5, 1.0, 2.0, 4.0, 8.0]  # doubling, not a tight loop
    waits.allow(4)
    waits.until(9)
    assert len(_lines(caplog, "does not exist")) == 1  # nine attempts, one line
    assert adapter.health()["connected"] is False and "does not exist" in adapter.health()["error"]
    rt = Runtime(str(tmp_path / "nri.sock"))  # the runtime starts after the agent
    waits.allow()
    registered = rt.begin([_container("0")])
    assert (registered.plugin_name, registered.plugin_idx) == ("numa-agent", "10")
    assert _wait_for(lambda: adapter.health()["connected"])
    assert adapter.health() == {"enabled": True, "connected": True, "socket": rt.path, "plugin": "10-numa-agent",
                                "runtime": "fake 1", "error": None, "connections": 1}
    assert handler.calls == [("synchronize", ["ctr-0"])]
    rt.close()


def test_the_waits_grow_to_30_seconds_jittered_down_never_up(tmp_path, handler):
    asked: list[float] = []
    draws = iter([0.0, 1.0, 0.5] + [1.0] * 20)

    def sleep(seconds):
        asked.append(seconds)
        if len(asked) == 12:
            a.stop()

    a = nri_adapter.NriAdapter(Settings(str(tmp_path / "nri.sock")), handler, sleep=sleep,
                               jitter=lambda: next(draws))
    a.run()
    assert asked[:3] == [0.5, 1.0 * 0.8, 2.0 * 0.9]
    assert asked[3:] == [x * 0.8 for x in (4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0)]


def test_the_runtime_closing_the_socket_ends_the_session_and_the_adapter_reconnects(tmp_path, make, waits, clock,
                                                                                    handler, caplog):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    adapter = make()
    waits.allow(1)
    assert waits.until(2) == [0.5, 1.0]
    rt = Runtime(str(tmp_path / "nri.sock"))
    waits.allow(1)
    rt.begin()
    assert _create(rt, "1")[0] == 0
    clock.now += 3600  # a session that lasted: the backoff starts again from its first wait
    rt.conn.close()
    assert waits.until(3) == [0.5, 1.0, 0.5]  # not 2.0
    assert adapter.health()["connected"] is False
    ended = _lines(caplog, "ended after 3600.0 s")
    assert len(ended) == 1 and "fake 1" in ended[0] and "reconnecting" in ended[0]
    waits.allow()
    rt.begin()  # a new session, begun by the runtime's Synchronize, through the handler
    assert _wait_for(lambda: adapter.health()["connections"] == 2)
    assert handler.calls == [("synchronize", []), ("create", "ctr-1"), ("synchronize", [])]
    rt.close()


def test_the_runtime_restarting_removes_and_makes_the_socket_again(tmp_path, make, waits, handler, caplog):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    path = str(tmp_path / "nri.sock")
    rt = Runtime(path)
    adapter = make()
    rt.begin()
    rt.close()
    os.unlink(path)
    waits.until(1)
    waits.allow(2)
    waits.until(3)  # the socket is missing while the runtime restarts
    assert len(_lines(caplog, "does not exist")) == 1
    rt = Runtime(path)
    waits.allow()
    rt.begin([_container("7")])
    assert _wait_for(lambda: adapter.health()["connected"])
    assert handler.calls == [("synchronize", []), ("synchronize", ["ctr-7"])]
    rt.close()


@pytest.mark.parametrize(("garbage", "says"), [
    (b"\x00\x00\x00\x01\xff\xff\xff\xff", "multiplexer frame of 4294967295 bytes, over the limit"),
    (b"\x00\x00\x00\x01\x00\x00\x00\x10abc", "in the middle of a multiplexer frame"),  # then closed
])
def test_a_runtime_that_breaks_the_wire_ends_the_session_in_one_line_and_touches_nothing(
        tmp_path, make, waits, handler, caplog, garbage, says):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    rt = Runtime(str(tmp_path / "nri.sock"))
    adapter = make()
    rt.begin()
    assert _create(rt, "1")[0] == 0
    rt.send_raw(garbage)
    if "middle" in says:
        rt.conn.shutdown(socket.SHUT_WR)
    waits.until(1)
    ended = _lines(caplog, "reconnecting")
    assert len(ended) == 1 and says in ended[0] and "\n" not in ended[0]
    assert len(_lines(caplog, says)) == 1  # one line for the broken session, not one more from the session
    assert handler.calls == [("synchronize", []), ("create", "ctr-1")]  # nothing released, nothing asked
    waits.allow()
    rt.begin([_container("1")])
    assert _wait_for(lambda: adapter.health()["connections"] == 2)
    assert handler.calls[-1] == ("synchronize", ["ctr-1"])
    rt.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the socket to another user needs root")
def test_a_socket_owned_by_another_user_is_refused_in_one_line_never_connected_and_retried(
        tmp_path, make, waits, caplog):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    rt = Runtime(str(tmp_path / "nri.sock"))
    os.chown(rt.path, 65534, 65534)
    adapter = make()
    waits.until(1)
    waits.allow(3)
    waits.until(4)
    refused = _lines(caplog, "refused")
    assert len(refused) == 1 and rt.path in refused[0] and "owned by uid 65534" in refused[0]
    assert rt.nobody_knocked()
    assert adapter.health()["error"] == refused[0]
    os.chown(rt.path, 0, 0)  # the runtime's own again: the next attempt connects
    waits.allow()
    rt.begin()
    assert _wait_for(lambda: adapter.health()["connected"])
    rt.close()


def test_a_socket_in_a_directory_others_can_write_is_refused(tmp_path, make, waits, caplog):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    shared = tmp_path / "shared"
    shared.mkdir()
    rt = Runtime(str(shared / "nri.sock"))
    shared.chmod(0o777)
    make(shared / "nri.sock")
    waits.until(1)
    waits.allow(2)
    waits.until(3)
    refused = _lines(caplog, "refused")
    assert len(refused) == 1 and "writable by its group or by others" in refused[0]
    assert rt.nobody_knocked()
    rt.close()


def test_the_handlers_calls_are_counted_timed_and_refusals_counted(tmp_path, make, clock, handler):
    rt = Runtime(str(tmp_path / "nri.sock"))
    handler.refuse.add("ctr-2")
    took = iter([0.003, 0.0004])
    real = handler.create_container

    def timed(request):
        clock.now += next(took)
        return real(request)

    handler.create_container = timed
    adapter = make()
    rt.begin()
    assert _create(rt, "1")[0] == 0
    code, message, _ = _create(rt, "2")
    assert code != 0 and message == "TopologyAffinityError: no NUMA node fits"
    # The session serves the runtime from its own thread as soon as it is registered; the
    # adapter's thread records the registration when register() returns, which a loaded
    # machine may schedule after the calls above.
    assert _wait_for(lambda: adapter.stats()["connected"])
    stats = adapter.stats()
    assert stats["connected"] is True and stats["connections_total"] == 1 and stats["refusals_total"] == 1
    assert stats["requests_total"] == {"Synchronize": 1, "CreateContainer": 2, "UpdateContainer": 0,
                                       "StopContainer": 0, "StateChange": 0}
    created = stats["request_duration_seconds"]["CreateContainer"]
    assert created["count"] == 2 and created["sum"] == pytest.approx(0.0034)
    assert dict(map(tuple, created["buckets"]))[0.0005] == 1 and dict(map(tuple, created["buckets"]))[0.005] == 2
    # as the metrics give them: base units, one bounded `call` label, every call from the start
    registry = CollectorRegistry()
    registry.register(NriCollector(adapter.stats))
    text = generate_latest(registry).decode()
    for line in ("numa_agent_nri_connected 1.0", "numa_agent_nri_connections_total 1.0",
                 'numa_agent_nri_requests_total{call="CreateContainer"} 2.0',
                 'numa_agent_nri_requests_total{call="StateChange"} 0.0',
                 'numa_agent_nri_request_duration_seconds_bucket{call="CreateContainer",le="0.0005"} 1.0',
                 'numa_agent_nri_request_duration_seconds_bucket{call="CreateContainer",le="+Inf"} 2.0',
                 'numa_agent_nri_request_duration_seconds_count{call="Synchronize"} 1.0',
                 "numa_agent_nri_refusals_total 1.0"):
        assert line in text.splitlines(), line
    rt.close()


def test_stop_closes_the_session_and_ends_the_thread(tmp_path, make, handler):
    rt = Runtime(str(tmp_path / "nri.sock"))
    adapter = make()
    rt.begin()
    assert _wait_for(lambda: adapter.health()["connected"])
    adapter.stop()
    assert adapter.stopped and adapter.health()["connected"] is False
    rt.conn.settimeout(SETTLE)
    assert rt.conn.recv(1) == b""  # the runtime sees the plugin go
    rt.close()


def test_stop_ends_a_wait_between_attempts_at_once(tmp_path, handler, caplog):
    caplog.set_level(logging.INFO, "numa_agent.nri")
    adapter = nri_adapter.NriAdapter(Settings(str(tmp_path / "nri.sock")), handler).start()  # its own waits
    assert _wait_for(lambda: _lines(caplog, "does not exist"))
    adapter.stop()
    assert adapter.stopped and _lines(caplog, "stopped")


def test_a_bad_index_is_refused_before_any_thread_starts(tmp_path, handler):
    with pytest.raises(plugin.NriError, match="two digits"):
        nri_adapter.NriAdapter(Settings(str(tmp_path / "nri.sock"), index="5"), handler)


def test_a_new_sessions_calls_wait_for_the_broken_ones_last_call(tmp_path, make, waits, handler):
    rt = Runtime(str(tmp_path / "nri.sock"))
    inside, most = [0], [0]
    entered, synchronizing = threading.Event(), threading.Event()

    def counted(method):
        def call(*args):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            try:
                return method(*args)
            finally:
                inside[0] -= 1
        return call

    def stuck(request):
        # Held until the next session's Synchronize is inside the handler too, which the
        # adapter never lets happen: so held for the half second, then let go.
        entered.set()
        synchronizing.wait(0.5)
        return api.CreateContainerResponse()

    def synchronize(pods, containers):
        synchronizing.set()
        return []

    handler.create_container, handler.synchronize = counted(stuck), counted(synchronize)
    make()
    rt.begin()
    synchronizing.clear()
    rt.send_call("CreateContainer", api.CreateContainerRequest(container=_container("1")), timeout_nano=60 * 10**9)
    assert entered.wait(SETTLE)
    rt.conn.close()  # the session breaks while its handler call runs
    waits.until(1)
    waits.allow()
    rt.accept_next()
    rt.expect_register()
    synchronize_call = rt.send_call("Synchronize", api.SynchronizeRequest(), timeout_nano=60 * 10**9)
    assert rt.read_answer(synchronize_call).status.code == 0
    assert most[0] == 1  # never two handler calls at once
    rt.close()
