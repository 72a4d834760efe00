"""An NRI plugin session on a connected socket: register, serve the runtime's calls.

The session speaks NRI's wire (mux.py, ttrpc.py) and nothing more: what a
container's creation means is the `NriHandler`'s. On one connected socket:

- the plugin registers (RegisterPlugin on connection 2: its name and a
  two-digit index, which orders the plugins the runtime calls);
- the runtime calls the plugin on connection 1: Configure (answered with the
  events the agent needs), Synchronize (the pods and containers the runtime
  has, handed to the handler, its updates answered), CreateContainer,
  UpdateContainer, StopContainer and StateChange (handed to the handler),
  Shutdown. Any other method is answered with ttrpc's "unimplemented".

Answers within the runtime's deadline. The runtime gives each call 2 s by
default (the request's `timeout_nano` says how long) and treats a plugin that
misses it as broken. One thread reads the socket and never runs a handler:
it decodes each request, answers at once those that need no handler
(Configure, Shutdown, unknown methods) and queues the rest for one worker
thread, which calls the handler in the order the runtime sent the calls (the
handler is the agent's one state owner: calls in order, never two at once).
A timer per request answers DEADLINE_EXCEEDED at 90% of the call's time if
the handler has not answered by then; whichever answer comes first is sent,
the other dropped (a late handler result is logged, and a call whose time
passed while it queued never reaches the handler). So a slow handler can
delay the handler calls queued behind it, each still answered in its time,
but never the reading of the next call nor the answers that need no handler.

Events for a container the runtime never announced (in Synchronize or
CreateContainer) do not reach the handler: UpdateContainer for one is
answered with an error, StopContainer and StateChange with an empty answer.
A handler that raises `NriRefusal` answers its one line as the call's error
(a refused CreateContainer fails the container's creation with that line);
any other exception is answered as an internal error, in one line, and the
session goes on.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from numa_agent.nri import mux, ttrpc
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.state.trusted_dir import UntrustedDirectory, agent_owners, open_directory

log = logging.getLogger("numa_agent.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
REGISTRATION_TIMEOUT = 5.0  # the runtime's plugin_registration_timeout, by default
REQUEST_TIMEOUT = 2.0  # the runtime's plugin_request_timeout, by default
ANSWER_SHARE = 0.9  # of a call's time, after which the session answers for a slow handler

# The events the agent subscribes to (api.proto's Event enum; bit e-1 for event e).
EVENTS = ("RUN_POD_SANDBOX", "STOP_POD_SANDBOX", "REMOVE_POD_SANDBOX", "CREATE_CONTAINER", "UPDATE_CONTAINER",
          "STOP_CONTAINER", "REMOVE_CONTAINER")


def event_mask(names: Iterable[str]) -> int:
    mask = 0
    for name in names:
        mask |= 1 << (api.Event.Value(name) - 1)
    return mask


class NriError(Exception):
    """The NRI socket cannot be used, or the session broke; one line."""


class NriRefusal(Exception):
    """Raised by a handler: the call fails with this one line (the runtime shows it)."""


class NriHandler(Protocol):
    """What the runtime's calls mean. Called from one thread, in the runtime's order."""

    def synchronize(self, pods: Sequence[Any], containers: Sequence[Any]) -> Sequence[Any]:
        """The runtime's pods (api.PodSandbox) and containers (api.Container) at
        registration; returns the updates (api.ContainerUpdate) to make."""
        ...

    def create_container(self, request: Any) -> Any:
        """api.CreateContainerRequest -> api.CreateContainerResponse."""
        ...

    def update_container(self, request: Any) -> Any:
        """api.UpdateContainerRequest -> api.UpdateContainerResponse."""
        ...

    def stop_container(self, request: Any) -> Any:
        """api.StopContainerRequest -> api.StopContainerResponse."""
        ...

    def state_change(self, event: Any) -> None:
        """api.StateChangeEvent: a pod's run, stop or removal; a container's removal."""
        ...


def check_index(index: str) -> str:
    if len(index) != 2 or not index.isascii() or not index.isdigit():
        raise NriError(f"NRI plugin index {index!r} is not two digits (00 to 99)")
    return index


def connect(path: str = DEFAULT_SOCKET, *, owners: Iterable[int] | None = None) -> socket.socket:
    """A unix socket connected to the runtime's NRI socket at `path`, once the
    socket and its directory are trusted (state/trusted_dir's rule: owned by
    root or the agent's user, writable by nobody else). NriError, one line, otherwise."""
    trusted = frozenset(agent_owners() if owners is None else owners)
    parent, name = os.path.split(os.path.abspath(path))
    try:
        directory = open_directory(parent, "the NRI socket's directory", owners=trusted)
    except UntrustedDirectory as e:
        raise NriError(f"NRI socket {path} refused: {e}") from None
    except FileNotFoundError:
        raise NriError(f"NRI socket {path} does not exist (nor its directory): is NRI enabled in the "
                       "runtime's configuration, and the runtime running?") from None
    except OSError as e:
        raise NriError(f"NRI socket {path}: {e.strerror}") from None
    with directory:
        try:
            st = directory.lstat(name)
        except FileNotFoundError:
            raise NriError(f"NRI socket {path} does not exist: is NRI enabled in the runtime's configuration, "
                           "and the runtime running?") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise NriError(f"NRI socket {path} is not a socket")
        if st.st_uid not in trusted:
            raise NriError(f"NRI socket {path} refused: it is owned by uid {st.st_uid}, not by root or the "
                           "agent's user, so it is not the runtime's")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(directory.proc_path(name))
        except OSError as e:
            sock.close()
            raise NriError(f"NRI socket {path}: cannot connect: {e.strerror}") from None
    return sock


@dataclass
class _Call:
    stream_id: int
    request: Any  # ttrpc_wire_pb2.Request
    answered: bool = False
    timer: threading.Timer | None = None


# method -> (request type, response type)
_METHODS: dict[str, tuple[Any, Any]] = {
    "Configure": (api.ConfigureRequest, api.ConfigureResponse),
    "Synchronize": (api.SynchronizeRequest, api.SynchronizeResponse),
    "Shutdown": (api.Empty, api.Empty),
    "CreateContainer": (api.CreateContainerRequest, api.CreateContainerResponse),
    "UpdateContainer": (api.UpdateContainerRequest, api.UpdateContainerResponse),
    "StopContainer": (api.StopContainerRequest, api.StopContainerResponse),
    "StateChange": (api.StateChangeEvent, api.Empty),
}

_INLINE = frozenset({"Configure", "Shutdown"})  # answered by the reading thread: no handler involved


class PluginSession:
    """One registration on one connected socket. `run()` registers and serves
    until the runtime closes the connection or breaks the protocol."""

    def __init__(self, sock: socket.socket, handler: NriHandler, name: str, index: str, *,
                 events: Iterable[str] = EVENTS, registration_timeout: float = REGISTRATION_TIMEOUT) -> None:
        self.sock = sock
        self.handler = handler
        self.name = name
        self.index = check_index(index)
        self.events = event_mask(events)
        self.registration_timeout = registration_timeout
        self.runtime = ""  # "name version", once configured
        self._demux = mux.Demux()
        self._write_lock = threading.Lock()
        self._answer_lock = threading.Lock()
        self._ids = ttrpc.StreamIds()
        self._pending: dict[int, queue.Queue[tuple[int, str, bytes] | BaseException]] = {}
        self._pending_lock = threading.Lock()
        self._work: queue.Queue[_Call | None] = queue.Queue()
        self._containers: set[str] = set()  # announced by the runtime, not yet removed
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, name="nri-read", daemon=True)
        self._worker = threading.Thread(target=self._work_loop, name="nri-handler", daemon=True)

    @property
    def dropped_frames(self) -> int:
        """Frames the runtime sent for a connection nobody opened (dropped, as the runtime does)."""
        return self._demux.dropped

    # --- the session's life

    def start(self) -> None:
        self._reader.start()
        self._worker.start()

    def run(self) -> None:
        """Register, then serve until the runtime goes; NriError (one line) when
        the runtime refused the plugin or broke the protocol."""
        self.start()
        try:
            self.register()
            self.wait()
        finally:
            self.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the connection ends (True), or `timeout` passes (False). NriError if it broke."""
        if not self._closed.wait(timeout):
            return False
        if self._error is not None:
            raise NriError(f"NRI: {self._error}") from None
        return True

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader.is_alive():
            self._reader.join(5)
        self.sock.close()
        self._work.put(None)

    # --- the plugin's calls to the runtime (connection 2)

    def register(self) -> None:
        request = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        try:
            self.call("RegisterPlugin", request, api.Empty, self.registration_timeout)
        except ttrpc.RemoteError as e:
            raise NriError(f"the runtime refused to register NRI plugin {self.index}-{self.name}: "
                           f"{e.status_message}") from None
        log.info("registered as NRI plugin %s-%s", self.index, self.name)

    def update_containers(self, updates: Sequence[Any], evictions: Sequence[Any] = ()) -> Any:
        """Unsolicited updates: api.UpdateContainersResponse (the updates that failed)."""
        request = api.UpdateContainersRequest(update=updates, evict=evictions)
        return self.call("UpdateContainers", request, api.UpdateContainersResponse, REQUEST_TIMEOUT)

    def call(self, method: str, request: Any, response_type: Any, timeout: float) -> Any:
        """Call the runtime (from any thread, the handler's included): the decoded answer;
        NriError for a connection that broke or a runtime that did not answer in
        `timeout`, ttrpc.RemoteError for a runtime that answered an error."""
        answer: queue.Queue[tuple[int, str, bytes] | BaseException] = queue.Queue(1)
        with self._pending_lock:  # ids and the pending table together: callers on several threads
            if self._closed.is_set():
                raise NriError(f"NRI: the connection is closed; {method} not sent")
            stream_id = self._ids.next()
            self._pending[stream_id] = answer
        try:
            payload = ttrpc.encode_request(RUNTIME_SERVICE, method, request.SerializeToString(),
                                           timeout_nano=int(timeout * 1e9))
            try:
                self._send(mux.RUNTIME_SERVICE_CONN, ttrpc.encode_frame(stream_id, ttrpc.TYPE_REQUEST, payload))
            except OSError as e:
                raise NriError(f"NRI: cannot send {method} to the runtime: {e.strerror}") from None
            try:
                got = answer.get(timeout=timeout)
            except queue.Empty:
                raise NriError(f"NRI: the runtime did not answer {method} within {timeout:g} s") from None
        finally:
            with self._pending_lock:
                self._pending.pop(stream_id, None)
        if isinstance(got, BaseException):
            raise NriError(f"NRI: {method}: {got}") from None
        code, message, body = got
        if code != ttrpc.OK:
            raise ttrpc.RemoteError(code, message)
        response = response_type()
        try:
            response.ParseFromString(body)
        except DecodeError:
            raise NriError(f"NRI: the runtime's answer to {method} is no {response_type.__name__}") from None
        return response

    # --- reading (one thread, never runs a handler: it answers at once what needs
    # none, Configure, Shutdown and unknown methods, and queues the rest)

    def _send(self, conn_id: int, frame: bytes) -> None:
        with self._write_lock:
            self.sock.sendall(mux.encode(conn_id, frame))

    def _read_loop(self) -> None:
        demux = self._demux
        readers = {mux.PLUGIN_SERVICE_CONN: ttrpc.FrameReader(), mux.RUNTIME_SERVICE_CONN: ttrpc.FrameReader()}
        try:
            while True:
                try:
                    data = self.sock.recv(1 << 16)
                except OSError as e:
                    if self._closed.is_set():
                        return
                    raise ttrpc.TtrpcError(f"reading the NRI socket: {e.strerror}") from None
                if not data:
                    demux.close()
                    for reader in readers.values():
                        reader.close()
                    log.debug("the runtime closed the NRI connection")  # wait() returns: its caller says it
                    return
                for conn_id, chunk in demux.feed(data):
                    for frame in readers[conn_id].feed(chunk):
                        self._on_frame(conn_id, frame)
        except ttrpc.TtrpcError as e:
            self._error = e  # wait() raises it: its caller (nri/adapter.py) says it, in one line
            log.debug("NRI: %s", e)
        except Exception as e:  # never a dead thread that says nothing: wait() raises it
            self._error = ttrpc.TtrpcError(f"{type(e).__name__}: {e}")
            log.debug("NRI: the session failed: %s: %s", type(e).__name__, e)
        finally:
            with self._pending_lock:
                self._closed.set()
                for answer in self._pending.values():
                    _deliver(answer, self._error or ttrpc.TtrpcError("the runtime closed the connection"))
            self._work.put(None)

    def _on_frame(self, conn_id: int, frame: ttrpc.Frame) -> None:
        if conn_id == mux.RUNTIME_SERVICE_CONN:
            if frame.type != ttrpc.TYPE_RESPONSE:
                log.warning("NRI: a ttrpc message of type %d on the plugin's own connection, dropped", frame.type)
                return
            with self._pending_lock:
                answer = self._pending.get(frame.stream_id)
            if answer is None:
                log.warning("NRI: an answer to stream %d, which awaits none, dropped", frame.stream_id)
                return
            try:
                _deliver(answer, ttrpc.decode_response(frame.payload))
            except ttrpc.TtrpcError as e:
                _deliver(answer, e)
            return
        if frame.type != ttrpc.TYPE_REQUEST:
            log.warning("NRI: a ttrpc message of type %d where the runtime sends requests, dropped", frame.type)
            return
        try:
            request = ttrpc.decode_request(frame.payload)
        except ttrpc.TtrpcError as e:
            self._send(mux.PLUGIN_SERVICE_CONN, _response_frame(frame.stream_id, ttrpc.encode_response(
                code=ttrpc.INVALID_ARGUMENT, message=str(e))))
            log.warning("NRI: %s", e)
            return
        if request.service != PLUGIN_SERVICE or request.method in _INLINE or request.method not in _METHODS:
            # Needs no handler: answered here, at once, whatever the handler is doing.
            self._send(mux.PLUGIN_SERVICE_CONN, _response_frame(frame.stream_id, self._dispatch(request)))
            return
        call = _Call(frame.stream_id, request)
        seconds = request.timeout_nano / 1e9 if request.timeout_nano > 0 else REQUEST_TIMEOUT
        call.timer = threading.Timer(seconds * ANSWER_SHARE, self._too_late, (call,))
        call.timer.daemon = True
        call.timer.start()
        self._work.put(call)

    # --- answering (the worker thread, and the deadline timers)

    def _answer(self, call: _Call, payload: bytes) -> bool:
        with self._answer_lock:
            if call.answered:
                return False
            call.answered = True
        if call.timer is not None:
            call.timer.cancel()
        try:
            self._send(mux.PLUGIN_SERVICE_CONN, _response_frame(call.stream_id, payload))
        except OSError as e:
            log.warning("NRI: cannot answer %s: %s", call.request.method, e.strerror)
        return True

    def _too_late(self, call: _Call) -> None:
        if self._answer(call, ttrpc.encode_response(code=ttrpc.DEADLINE_EXCEEDED, message=(
                f"numa-agent did not decide {call.request.method} in time"))):
            log.error("NRI: %s not answered in time by the handler; the runtime was told it failed",
                      call.request.method)

    def _work_loop(self) -> None:
        while (call := self._work.get()) is not None:
            if call.answered:  # its deadline passed while it queued
                continue
            payload = self._dispatch(call.request)
            if not self._answer(call, payload):
                log.warning("NRI: the handler's late answer to %s dropped", call.request.method)

    def _dispatch(self, request: Any) -> bytes:
        """The call's answer (a ttrpc Response), whatever the handler does."""
        types = _METHODS.get(request.method) if request.service == PLUGIN_SERVICE else None
        if types is None:
            return ttrpc.encode_response(code=ttrpc.UNIMPLEMENTED, message=(
                f"{request.service}/{request.method} is not implemented by numa-agent"))
        request_type, _ = types
        message = request_type()
        try:
            message.ParseFromString(request.payload)
        except DecodeError:
            return ttrpc.encode_response(code=ttrpc.INVALID_ARGUMENT, message=(
                f"{request.method}'s payload is no {request_type.__name__}"))
        method: Callable[[Any], Any] = getattr(self, f"_on_{request.method}")
        try:
            response = method(message)
        except NriRefusal as e:
            return ttrpc.encode_response(code=ttrpc.FAILED_PRECONDITION, message=_one_line(e))
        except Exception as e:  # the session goes on; the runtime hears one line
            log.error("NRI: the handler failed on %s: %s: %s", request.method, type(e).__name__, _one_line(e))
            return ttrpc.encode_response(code=ttrpc.INTERNAL, message=(
                f"numa-agent failed on {request.method}: {type(e).__name__}: {_one_line(e)}"))
        return ttrpc.encode_response(response.SerializeToString())

    def _on_Configure(self, request: Any) -> Any:  # noqa: N802 (ttrpc's method names)
        self.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        log.info("NRI: configured by %s", self.runtime or "an unnamed runtime")
        return api.ConfigureResponse(events=self.events)

    def _on_Synchronize(self, request: Any) -> Any:  # noqa: N802
        self._containers = {c.id for c in request.containers}
        updates = self.handler.synchronize(list(request.pods), list(request.containers))
        return api.SynchronizeResponse(update=list(updates))

    def _on_Shutdown(self, request: Any) -> Any:  # noqa: N802
        log.info("NRI: the runtime is shutting down")
        return api.Empty()

    def _on_CreateContainer(self, request: Any) -> Any:  # noqa: N802
        response = self.handler.create_container(request)
        self._containers.add(request.container.id)
        return response

    def _on_UpdateContainer(self, request: Any) -> Any:  # noqa: N802
        if request.container.id not in self._containers:
            raise NriRefusal(f"container {request.container.id} was never announced to numa-agent")
        return self.handler.update_container(request)

    def _on_StopContainer(self, request: Any) -> Any:  # noqa: N802
        if request.container.id not in self._containers:
            log.warning("NRI: StopContainer for container %s, never announced: ignored", request.container.id)
            return api.StopContainerResponse()
        return self.handler.stop_container(request)

    def _on_StateChange(self, event: Any) -> Any:  # noqa: N802
        container = event.container.id if event.HasField("container") else ""
        if container and container not in self._containers:
            log.warning("NRI: %s for container %s, never announced: ignored", api.Event.Name(event.event)
                        if event.event in api.Event.values() else event.event, container)
            return api.Empty()
        self.handler.state_change(event)
        if container and event.event == api.REMOVE_CONTAINER:
            self._containers.discard(container)
        return api.Empty()


def _deliver(answer: queue.Queue[Any], item: Any) -> None:
    """The first answer to a call counts (a second, or the end after an answer, is dropped)."""
    try:
        answer.put_nowait(item)
    except queue.Full:
        pass


def _response_frame(stream_id: int, payload: bytes) -> bytes:
    return ttrpc.encode_frame(stream_id, ttrpc.TYPE_RESPONSE, payload)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__

