"""PodResources v1 over gRPC on its own Unix socket. Read-only.

grpcio serves from its own threads. They never take the service's lock:
each answer is built from the (machine, state) pair the service last
published (`AgentService.view`), an immutable value read in one step, so an
admission never waits for a List, and a List never sees half of one. The
encoded List answer is kept per pod and encoded again only for the pods a
change names: a hundred clients asking about one state cost one update, and
an update after an admission costs that admission's pod.

Who may connect is decided, as for the HTTP API, by the socket file's mode
and group (the same `socket_mode` / `socket_group`), set before the path
exists (numa_agent.state.socket_file). Bad input (garbage bytes, a client that
never finishes its request) is grpcio's to refuse; it holds no worker thread.
Connections are bounded (`connection_cap`: as many as fit, three descriptors
each, in the share of the open-file limit the API leaves alone), in total and per user: grpcio offers
no hook before the HTTP/2 handshake, so the public socket is served by a gate
of ours (kubelet/gate.py) that reads each peer's uid (SO_PEERCRED), closes a
connection beyond the bound or beyond its user's quarter of it, and splices
the rest to grpcio's own socket in a directory only the agent's user can
enter. One member of the group holding idle connections cannot shut root's
monitoring agent or the kubelet's consumers out. A connection that has not
finished the HTTP/2 handshake (preface and settings) within
HANDSHAKE_TIMEOUT_MS is closed by grpcio, and so by the gate.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import grpc

from numa_agent.kubelet import pod_resources
from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet.gate import ConnectionGate, GateCollector
from numa_agent.service.ports import PublishedView
from numa_agent.state.socket_file import place_socket, remove_socket
from numa_agent.views.metrics import metrics_connection_cap, nofile_limit

log = logging.getLogger("numa_agent.kubelet")

SERVICE = "v1.PodResourcesLister"
WORKERS = 2
# Requests are empty or two names: anything larger is not a client of this API.
MAX_REQUEST_BYTES = 64 * 1024
# A connection lives at most this long (then is closed gracefully; clients
# reconnect): a client that never finishes holds nothing for ever.
MAX_CONNECTION_AGE_MS = 10 * 60 * 1000
MAX_CONNECTION_IDLE_MS = 60 * 1000  # no call in flight: closed gracefully (GOAWAY), clients reconnect
GRACE_MS = 30 * 1000
# Connect, then nothing (or the preface and nothing): closed after this.
HANDSHAKE_TIMEOUT_MS = 5 * 1000


# Descriptors one connection holds: the client's socket and the gate's to
# grpcio, both in the gate, and grpcio's own end.
DESCRIPTORS_PER_CONNECTION = 3


def descriptor_share(nofile: int) -> int:
    """Descriptors PodResources' connections hold at most: the same share of the
    open-file limit as /metrics, which the API's bound leaves (api/server.py,
    `listeners_share`)."""
    return metrics_connection_cap(nofile)


def connection_cap(nofile: int) -> int:
    """Connections PodResources holds at once: as many as fit in its descriptor share."""
    return max(2, descriptor_share(nofile) // DESCRIPTORS_PER_CONNECTION)


class PodResourcesServer:
    """bind() takes the socket path (start-up fails there if it cannot),
    attach() names the service once it exists, start() serves, stop() ends."""

    def __init__(self, socket_path: str, namespace: str = pod_resources.DEFAULT_NAMESPACE, *,
                 socket_mode: int = 0o660, socket_group: str | None = None, workers: int = WORKERS,
                 max_connections: int | None = None) -> None:
        self.socket_path = os.path.abspath(socket_path)
        self.max_connections = max_connections or connection_cap(nofile_limit())
        self.namespace = namespace
        self.socket_mode = socket_mode
        self.socket_group = socket_group
        self.workers = workers
        self.service: PublishedView | None = None
        self._server: Any = None
        self._gate: ConnectionGate | None = None
        self._gate_thread: threading.Thread | None = None
        self._private_dir: str | None = None
        self._inode: tuple[int, int] | None = None
        # The List answer, kept per pod and for the state it was last built
        # for; the lock serialises its use by grpcio's workers.
        self._encoder = pod_resources.ListEncoder(namespace)
        self._list_lock = threading.Lock()
        self._allocatable: tuple[object, bytes] | None = None

    # ---- lifecycle ---------------------------------------------------------------
    def bind(self) -> "PodResourcesServer":
        # grpcio's own socket: in a fresh directory only this user may enter
        # (mkdtemp: 0700, created exclusively), reached only through the gate.
        private_dir = tempfile.mkdtemp(prefix="numa-agent-podresources-", dir=_private_parent())
        private_path = os.path.join(private_dir, "grpc.sock")
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="numa-agent-podresources"),
            handlers=[grpc.method_handlers_generic_handler(SERVICE, self._handlers())],
            options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                     ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
                     ("grpc.max_connection_age_grace_ms", GRACE_MS),
                     ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
                     # The gate holds the bound; grpcio's own is room for the
                     # connections the gate has closed and grpcio not yet.
                     ("grpc.max_allowed_incoming_connections", 2 * self.max_connections),
                     ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
                     ("grpc.so_reuseport", 0)])
        listener: list[socket.socket] = []

        def bind_at(path: str) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(path)
                sock.listen(128)
            except BaseException:
                sock.close()
                raise
            listener.append(sock)

        try:
            server.add_insecure_port(f"unix:{private_path}")  # raises RuntimeError when it cannot bind
            self._inode = place_socket(self.socket_path, self.socket_mode, self.socket_group, bind_at,
                                       option="--pod-resources-socket")
        except BaseException:
            server.stop(None)
            for sock in listener:
                sock.close()
            shutil.rmtree(private_dir, ignore_errors=True)
            raise
        self._gate = ConnectionGate(listener[0], private_path, max_connections=self.max_connections)
        self._private_dir = private_dir
        self._server = server
        return self

    def stats(self) -> dict[str, Any] | None:
        """The gate's counts (connections open, turned away by reason), once bound."""
        gate = self._gate
        return gate.stats() if gate is not None else None

    def collector(self) -> GateCollector:
        """`numa_agent_pod_resources_refused_connections{reason}` and the open/max gauges."""
        return GateCollector(lambda: self._gate, "pod_resources", "PodResources")

    def attach(self, service: PublishedView) -> None:
        self.service = service

    def start(self) -> "PodResourcesServer":
        if self._server is None:
            self.bind()
        assert self._server is not None and self._gate is not None
        self._server.start()
        self._gate_thread = threading.Thread(target=self._gate.serve_forever, name="numa-agent-podresources-gate",
                                             daemon=True)
        self._gate_thread.start()
        log.info("PodResources v1 listening on %s (mode %o, group %s, namespace %s, at most %d connections, "
                 "%d per user)", self.socket_path, self.socket_mode, self.socket_group or "-", self.namespace,
                 self._gate.max_connections, self._gate.max_per_peer)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        gate, self._gate = self._gate, None
        if server is None:
            return
        if gate is not None:
            gate.stop_accepting()
        server.stop(1).wait(5)  # calls in flight finish; their answers pass the gate
        if gate is not None:
            if self._gate_thread is not None:
                gate.shutdown()
                self._gate_thread.join(5)
                self._gate_thread = None
            gate.server_close()
        remove_socket(self.socket_path, self._inode)
        self._inode = None
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    # ---- the answers --------------------------------------------------------------
    def _handlers(self) -> dict[str, Any]:
        def handler(fn: Callable[[Any, Any], bytes], request_type: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                self._guarded(fn), request_deserializer=request_type.FromString,
                response_serializer=_as_is)

        return {"List": handler(self._list, pb.ListPodResourcesRequest),
                "GetAllocatableResources": handler(self._allocatable_resources, pb.AllocatableResourcesRequest),
                "Get": handler(self._get, pb.GetPodResourcesRequest)}

    def _guarded(self, fn: Callable[[Any, Any], bytes]) -> Callable[[Any, Any], bytes]:
        def call(request: Any, context: Any) -> bytes:
            view = self.service.view() if self.service is not None else None
            if view is None:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the agent is starting")
            try:
                return fn(view, request)
            except _NotFound as exc:
                context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            except Exception:  # an answer failed: said to the client and logged, never the agent's end
                log.exception("PodResources %s failed", fn.__name__.lstrip("_"))
                context.abort(grpc.StatusCode.INTERNAL, "the agent could not build the answer; see its log")
            raise AssertionError("unreachable")  # context.abort raises

        call.__name__ = fn.__name__
        return call

    def _list(self, view: tuple[Any, Any], request: Any) -> bytes:
        machine, state = view
        with self._list_lock:
            return self._encoder.update(machine, state)

    def _allocatable_resources(self, view: tuple[Any, Any], request: Any) -> bytes:
        machine = view[0]
        kept = self._allocatable
        if kept is not None and kept[0] is machine:
            return kept[1]
        data = pod_resources.allocatable_response(machine).SerializeToString()
        self._allocatable = (machine, data)
        return data

    def _get(self, view: tuple[Any, Any], request: Any) -> bytes:
        machine, state = view
        found = None
        if request.pod_namespace == self.namespace:
            found = pod_resources.pod(machine, state, request.pod_name, self.namespace)
        if found is None:  # a Kubernetes pod of containers their runtime enforces (NRI)
            found = pod_resources.runtime_pod(machine, state, request.pod_namespace, request.pod_name)
        if found is None:
            raise _NotFound(f"pod {request.pod_name!r} not found in namespace {request.pod_namespace!r} "
                            f"(this agent's pods are in {self.namespace!r})")
        return pb.GetPodResourcesResponse(pod_resources=found).SerializeToString()


class _NotFound(Exception):
    pass


def _as_is(data: bytes) -> bytes:
    return data


def _private_parent() -> str | None:
    """/run when this process may write there (the agent as root), else the temporary directory."""
    return "/run" if os.access("/run", os.W_OK) else None
