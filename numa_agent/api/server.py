"""The agent's local API: HTTP/1.1 + JSON over a Unix socket.

One I/O thread on `selectors` accepts and reads every connection without
blocking, into per-connection buffers with a deadline from the accept; a
small fixed pool of worker threads runs the complete requests (the service
is synchronous and serialises admissions with its own lock). So a slow,
idle or hostile client costs a buffer and two descriptors, never a thread,
and a burst of clients waits in the listen queue and the workers' queue
(each user's in turn) rather than being turned away. The caller's identity comes from
SO_PEERCRED (and a pidfd) on the accepted socket. The standard library's
`http.server` is not used because its limits (header count, line length, no
overall deadline, no body cap) are not the ones this API needs; the small
parser below enforces exactly those, as a pure function of the bytes so far.

One request per connection: every response carries `Connection: close`,
which is plain HTTP/1.1 and what `curl --unix-socket` and our client expect.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import selectors
import socket
import struct
import threading
import time
from collections import deque
from typing import Any, Callable, MutableMapping
from urllib.parse import unquote

import msgspec

from numa_agent.api.errors import (
    ApiError,
    BadRequest,
    HeadersTooLarge,
    LengthRequired,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServerBusy,
)
from numa_agent.api.refusals import api_error
from numa_agent.api.validation import (
    MAX_BODY_BYTES,
    parse_admit_request,
    parse_request_id,
    parse_resize_request,
    validate_name,
)
from numa_agent.core.caller import Caller
from numa_agent.enforcement.processes import process_identity
from numa_agent.service.ports import AgentApi
from numa_agent.service.refusals import ServiceRefusal
from numa_agent.state.socket_file import SocketInUse, place_socket, remove_socket
from numa_agent.views.metrics import metrics_connection_cap

log = logging.getLogger("numa_agent.api")

__all__ = ["ApiServer", "SocketInUse"]

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
# The whole request (head and body) must arrive within this of the accept.
REQUEST_DEADLINE_SECONDS = 2.0
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            409: "Conflict", 411: "Length Required", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


class _Request:
    __slots__ = ("method", "path", "query", "headers", "body")

    def __init__(self, method: str, path: str, query: str,
                 headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body


# ---------------------------------------------------------------- parsing
class _Head:
    """A parsed request head and how many body bytes follow it."""

    __slots__ = ("method", "target", "headers", "body_start", "length")

    def __init__(self, method: str, target: str, headers: dict[str, str],
                 body_start: int, length: int) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body_start = body_start
        self.length = length


def parse_head(buf: bytes) -> _Head | None:
    """The head of the request in `buf`, or None while it is incomplete.
    Raises the ApiError for a head that can never become valid (too large,
    malformed, bad Content-Length) as soon as that is known."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise HeadersTooLarge(f"request head exceeds {MAX_HEAD_BYTES} bytes")
        return None
    if end > MAX_HEAD_BYTES:
        raise HeadersTooLarge(f"request head exceeds {MAX_HEAD_BYTES} bytes")
    try:
        text = buf[:end].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("request head is not ASCII") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].startswith("/"):
        raise BadRequest(f"malformed request line {lines[0][:80]!r}")
    method, target = parts[0], parts[1]
    if any(c < "!" or c == "\x7f" for c in target):
        raise BadRequest("control character in the request target")
    if len(lines) - 1 > MAX_HEADERS:
        raise HeadersTooLarge(f"more than {MAX_HEADERS} header fields")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c < "!" or c > "~" for c in name):
            raise BadRequest(f"malformed header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        if any((c < " " and c != "\t") or c == "\x7f" for c in value):
            # RFC 9110: a field value holds no control characters; a NUL
            # smuggled through here would reach logs and comparisons.
            raise BadRequest(f"control character in the value of header {name[:40]!r}")
        if key in headers and headers[key] != value:
            if key == "content-length":
                raise BadRequest("conflicting Content-Length headers")
            value = headers[key] + ", " + value
        headers[key] = value
    return _Head(method, target, headers, end + 4, _body_length(method, headers))


def _body_length(method: str, headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise LengthRequired("chunked or other transfer encodings are not accepted; send Content-Length")
    raw = headers.get("content-length")
    if raw is None:
        if method in ("POST", "PATCH"):
            raise LengthRequired(f"{method} needs a Content-Length header")
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise BadRequest(f"invalid Content-Length {raw[:20]!r}")
    length = int(raw)
    if length > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES}")
    return length


def parse_request(buf: bytes, head: _Head | None = None) -> tuple[_Head | None, _Request | None]:
    """Pure: (head, request) from the bytes received so far; the request is
    None until the whole body is there. Pass the head back in to skip
    re-parsing it."""
    if head is None:
        head = parse_head(buf)
        if head is None:
            return None, None
    if len(buf) - head.body_start < head.length:
        return head, None
    body = buf[head.body_start:head.body_start + head.length]
    path, _, query = head.target.partition("?")
    return head, _Request(head.method, path, query, head.headers, body)


# ---------------------------------------------------------------- identity
Credentials = tuple[int, int, int]  # pid, uid, gid


def peer_credentials(conn: socket.socket) -> Credentials:
    """(pid, uid, gid) of the connecting process, as the kernel recorded them at connect."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def pinned_caller(conn: socket.socket, creds: Credentials) -> Caller:
    """The caller with a pidfd pinned.

    SO_PEERPIDFD (Linux 6.5+) yields a pidfd for the very process that
    connected; otherwise pidfd_open(pid) right away narrows the PID-reuse
    window to the time since connect.
    """
    pid, uid, gid = creds
    pidfd: int | None = None
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        if pid > 0:  # 0: the peer lives in a PID namespace we cannot see
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                pidfd = None  # already gone; the service sees pidfd=None
    identity = process_identity(pid) if pidfd is not None else None
    return Caller(pid=pid, uid=uid, gid=gid, pidfd=pidfd, identity=identity, groups=peer_groups(conn))


SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13+


def peer_groups(conn: socket.socket) -> tuple[int, ...]:
    """The peer's supplementary groups as the kernel recorded them at connect; () if not known."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 256)
    except OSError:
        return ()
    return struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])


# ---------------------------------------------------------------- routing
def _json_body(status: int, payload: Any) -> bytes:
    body = msgspec.json.encode(payload)
    reason = _REASONS.get(status, "Unknown")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


def _query_flag(query: str, name: str) -> bool:
    """The one query parameter a route takes, a flag (`?NAME=1`)."""
    flag = False
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key != name:
            raise BadRequest(f"unknown query parameter {key[:40]!r}")
        if value in ("1", "true", ""):
            flag = True
        elif value in ("0", "false"):
            flag = False
        else:
            raise BadRequest(f"{name} must be 1 or 0, got {value[:20]!r}")
    return flag


def _query_request_id(query: str) -> str | None:
    """DELETE's one optional parameter, `?request_id=ID`: release the workload
    only if that admission made it (an OCI hook names its container so)."""
    if not query:
        return None
    key, _, value = query.partition("=")
    if key != "request_id" or "&" in value:
        raise BadRequest(f"unknown query parameter {query[:40]!r}; this route takes request_id=ID")
    return parse_request_id(value)


def _no_query(query: str) -> None:
    if query:
        raise BadRequest("this route takes no query parameters")


def allocatable_view(status: dict[str, Any]) -> dict[str, Any]:
    """Per-node capacity and free amounts, cut from the service's status()."""
    nodes = []
    for node in status.get("nodes", []):
        entry: dict[str, Any] = {key: node[key] for key in ("id", "kind", "distances") if key in node}
        for key in ("cpus", "memory_bytes"):
            if key in node:
                entry[key] = {"capacity": node[key].get("capacity"), "free": node[key].get("free")}
        for key in ("hugepages", "devices"):
            entry[key] = {size: {"capacity": v.get("capacity"), "free": v.get("free")}
                          for size, v in node.get(key, {}).items()}
        nodes.append(entry)
    return {"nodes": nodes, "shared_pool": status.get("shared_pool")}


class _Router:
    """Maps (method, path) to a service call; raises ApiError subclasses."""

    def __init__(self, service: AgentApi | None, kubelet_documents: Callable[[], dict] | None = None) -> None:
        self._service = service  # None: bound before the service exists, never served so (attach)
        # GET /v1/kubelet, answered by the kubelet's adapter (kubelet/files.py); None: not served.
        self.kubelet_documents = kubelet_documents

    @property
    def service(self) -> AgentApi:
        assert self._service is not None, "served only once a service is attached"
        return self._service

    def dispatch(self, req: _Request, caller: Caller) -> tuple[int, Any]:
        try:
            return self._route(req, caller)
        except ServiceRefusal as refusal:
            raise api_error(refusal) from None

    def _route(self, req: _Request, caller: Caller) -> tuple[int, Any]:
        path = req.path
        if path.startswith("/v1/workloads/"):
            return self._workload(req, caller, path[len("/v1/workloads/"):])
        fixed: dict[str, dict[str, Callable[[], tuple[int, Any]]]] = {
            "/v1/health": {"GET": lambda: (200, self.service.health())},
            "/v1/topology": {"GET": lambda: (200, self.service.topology())},
            "/v1/status": {"GET": lambda: (200, self.service.status(
                caller.uid, memory=_query_flag(req.query, "memory")))},
            "/v1/allocatable": {"GET": lambda: (200, allocatable_view(self.service.status(caller.uid)))},
            "/v1/kubelet": {"GET": lambda: (200, self._kubelet())},
            "/v1/nrt": {"GET": lambda: (200, self._nrt())},
            "/v1/workloads": {
                "GET": lambda: (200, {"workloads": self.service.list_workloads(caller.uid)}),
                "POST": lambda: self._admit(req, caller),
            },
        }
        methods = fixed.get(path)
        if methods is None:
            raise NotFound(f"no route {path[:100]!r}; see /v1/health, /v1/topology, "
                           "/v1/status, /v1/allocatable, /v1/workloads, /v1/kubelet, /v1/nrt")
        handler = methods.get(req.method)
        if handler is None:
            raise MethodNotAllowed(f"{req.method[:20]} is not allowed on {path}",
                                   details={"allowed": sorted(methods)})
        if req.method != "POST" and path != "/v1/status":
            _no_query(req.query)
        return handler()

    def _kubelet(self) -> dict:
        if self.kubelet_documents is None:
            raise NotFound("this agent serves no kubelet-shaped documents")
        return self.kubelet_documents()

    def _nrt(self) -> dict:
        """This node's NodeResourceTopology object, named by the host name (views/nrt.py)."""
        from numa_agent.api.errors import ServiceUnavailable
        from numa_agent.views.nrt import node_resource_topology

        view = self.service.view()
        if view is None:
            raise ServiceUnavailable("the agent has not discovered the machine yet")
        machine, state = view
        return node_resource_topology(machine, state, socket.gethostname())

    def _admit(self, req: _Request, caller: Caller) -> tuple[int, Any]:
        dry_run = _query_flag(req.query, "dry_run")
        request = parse_admit_request(req.body)
        result = self.service.admit(request, caller, dry_run=dry_run)
        return (200 if dry_run else 201), result

    def _workload(self, req: _Request, caller: Caller, raw_name: str) -> tuple[int, Any]:
        if req.method not in ("DELETE", "PATCH"):
            raise MethodNotAllowed(f"{req.method[:20]} is not allowed on /v1/workloads/NAME",
                                   details={"allowed": ["DELETE", "PATCH"]})
        try:
            name = unquote(raw_name, errors="strict")
        except UnicodeDecodeError:
            raise BadRequest("workload name is not valid UTF-8") from None
        validate_name(name, "workload name")
        if req.method == "PATCH":
            _no_query(req.query)
            resize = parse_resize_request(req.body)
            return 200, self.service.resize(name, caller, cpus=resize.cpus, memory_bytes=resize.memory_bytes)
        request_id = _query_request_id(req.query)
        if request_id is None:
            return 200, self.service.release(name, caller)
        return 200, self.service.release(name, caller, request_id=request_id)


# ---------------------------------------------------------------- activation
SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): passed sockets start at fd 3
LISTEN_FD_NAME = "api"  # FileDescriptorName= of systemd/numa-agent.socket


class ActivationError(RuntimeError):
    """systemd passed something the API cannot serve on."""


def activated_socket(environ: MutableMapping[str, str], pid: int, *,
                     start: int = SD_LISTEN_FDS_START, name: str = LISTEN_FD_NAME) -> socket.socket | None:
    """The listening Unix socket systemd passed us, or None when not socket
    activated. LISTEN_* are removed from `environ` once read, so children
    do not take them for theirs."""
    listen_pid = environ.get("LISTEN_PID", "")
    raw_count = environ.get("LISTEN_FDS", "")
    names = environ.get("LISTEN_FDNAMES", "").split(":")
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(key, None)  # as sd_listen_fds(1): whether or not they were for us
    if listen_pid != str(pid):
        return None  # absent, or meant for the process that execed us
    if not raw_count.isdigit() or int(raw_count) < 1:
        return None
    count = int(raw_count)
    index = names.index(name) if len(names) == count and name in names else 0
    fd = start + index
    for other in range(start, start + count):
        if other != fd:
            os.set_inheritable(other, False)
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ActivationError(f"systemd passed fd {fd}, which is not a socket: {exc}") from None
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.detach()
        raise ActivationError(f"systemd passed fd {fd}, which is not a listening Unix stream socket "
                              "(check ListenStream= in numa-agent.socket)")
    sock.set_inheritable(False)
    return sock


# ---------------------------------------------------------------- limits
LISTEN_BACKLOG = 65535  # the kernel caps it at net.core.somaxconn
FD_RESERVE = 256  # descriptors kept for the checkpoint, cgroup files, netlink, logs
MAX_CONNECTIONS_CEILING = 16384
MAX_INCOMPLETE_PER_UID = 1024
ACCEPT_BATCH = 256  # accepts per loop turn, so reads of accepted ones are not starved
READ_WORKERS = 2  # GET: snapshots, never behind the admission lock
WRITE_WORKERS = 2  # POST/DELETE: serialised by the service's lock anyway


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft if soft != resource.RLIM_INFINITY else MAX_CONNECTIONS_CEILING * 2 + FD_RESERVE


def listeners_share(nofile: int) -> int:
    """Descriptors the other listeners hold at most for an open-file limit:
    /metrics and PodResources (kubelet/grpc_server.py) each bound their
    connections to `metrics_connection_cap`. Left out of the API's bound, so
    that clients holding connections there never take an admission's."""
    return 2 * metrics_connection_cap(nofile)


def connection_cap(nofile: int) -> int:
    """Connections served at once for an open-file limit: each holds its
    socket and the caller's pidfd; the reserve and the other listeners'
    share come first."""
    return max(16, min(MAX_CONNECTIONS_CEILING, (nofile - FD_RESERVE - listeners_share(nofile)) // 2))


def incomplete_cap(max_connections: int) -> int:
    """Unfinished connections one uid may hold: a quarter of the bound (at most
    MAX_INCOMPLETE_PER_UID), so no one user's idle clients take every slot
    when a small open-file limit makes the bound small."""
    return max(1, min(MAX_INCOMPLETE_PER_UID, max_connections // 4))


# ---------------------------------------------------------------- server
_READING, _QUEUED, _WRITING, _CLOSED = range(4)
_LISTENER = object()
_WAKE = object()
REFUSAL_REASONS = ("busy", "timeout", "per_uid_limit")


class _Conn:
    """One client connection: its buffer, deadline and where it stands."""

    __slots__ = ("sock", "caller", "pidfd", "buf", "scanned", "head", "deadline", "out", "state")

    def __init__(self, sock: socket.socket, caller: Caller, deadline: float) -> None:
        self.sock = sock
        self.caller = caller
        self.pidfd = caller.pidfd
        self.buf = bytearray()
        self.scanned = 0  # head bytes already searched for the blank line
        self.head: _Head | None = None
        self.deadline = deadline
        self.out: memoryview | None = None
        self.state = _READING

    def close_pidfd(self) -> None:
        # The service dups any pidfd it keeps; ours is closed here, once.
        pidfd, self.pidfd = self.pidfd, None
        if pidfd is not None:
            try:
                os.close(pidfd)
            except OSError:
                pass


class _RateLog:
    """A warning at most once a second, with how many events it covers."""

    def __init__(self, text: Callable[[int], str]) -> None:
        self._text = text
        self._unlogged = 0
        self._logged_at = -1e9

    def note(self, now: float) -> None:
        self._unlogged += 1
        self.flush(now)

    def flush(self, now: float) -> None:
        if self._unlogged and now - self._logged_at >= 1.0:
            log.warning("%s", self._text(self._unlogged))
            self._unlogged, self._logged_at = 0, now


class _FairLane:
    """Complete requests waiting for a worker, taken in turn by uid: each uid's own in
    the order they completed, one uid's next only after one of every other uid waiting.
    A user who sends a flood of complete requests (each costs the agent a decision)
    waits behind their own flood, never puts it in front of another user's request.
    None (stop) is taken only once no request waits, as a FIFO would give it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._by_uid: dict[int, deque[tuple[_Conn, _Request]]] = {}
        self._turns: deque[int] = deque()  # uids with requests waiting, next first
        self._stops = 0

    def put(self, item: tuple[_Conn, _Request] | None) -> None:
        with self._cond:
            if item is None:
                self._stops += 1
            else:
                uid = item[0].caller.uid
                waiting = self._by_uid.get(uid)
                if waiting is None:
                    waiting = self._by_uid[uid] = deque()
                    self._turns.append(uid)
                waiting.append(item)
            self._cond.notify()

    def get(self) -> tuple[_Conn, _Request] | None:
        with self._cond:
            while not self._turns and not self._stops:
                self._cond.wait()
            if not self._turns:
                self._stops -= 1
                return None
            uid = self._turns.popleft()
            waiting = self._by_uid[uid]
            item = waiting.popleft()
            if waiting:
                self._turns.append(uid)
            else:
                del self._by_uid[uid]
            return item

    def qsize(self) -> int:
        with self._cond:
            return sum(len(waiting) for waiting in self._by_uid.values())


class ApiServer:
    """Serves `service` (the AgentService contract) on a Unix socket.

    One I/O thread multiplexes every connection with `selectors`: it accepts,
    reads into per-connection buffers and parses; a connection that has not
    sent its whole request within `request_deadline` of its accept is
    answered 408 and closed. Complete requests go to a small fixed pool of
    workers (reads and writes in separate lanes, so status and health never
    queue behind admissions, which the service serialises anyway), each lane
    taken in turn by uid and in the order they completed within one uid
    (_FairLane). A slow or idle client costs a buffer and two descriptors
    (socket, pidfd), never a thread.

    Limits: `max_connections` at once (default: from the open-file limit,
    raised to its hard limit when serving starts) and
    `max_incomplete_per_uid` connections per peer uid that have not finished
    sending their request (default: a quarter of `max_connections`, at most
    MAX_INCOMPLETE_PER_UID), so one user's slow clients cannot starve
    another's; root and the agent's own uid count like any other. What is
    turned away is counted (`stats()`, and `service.counters.api_refused`
    for the metrics) and logged at most once a second.

    Who may connect, and so admit, is decided by the socket file's mode and
    group: it is created under a umask that leaves it private, then chowned
    to `socket_group` and chmodded to `socket_mode` before it is moved into
    place. A stale socket left by a crashed agent is replaced; a path where
    an agent still answers raises SocketInUse. Under systemd socket
    activation the passed socket is served instead and never unlinked.
    """

    def __init__(self, service: AgentApi | None, socket_path: str, socket_mode: int = 0o660,
                 socket_group: str | None = None, *,
                 request_deadline: float = REQUEST_DEADLINE_SECONDS,
                 max_connections: int | None = None,
                 max_incomplete_per_uid: int | None = None,
                 poll_interval: float = 0.5,
                 credentials: Callable[[socket.socket], Credentials] = peer_credentials,
                 environ: MutableMapping[str, str] | None = None,
                 listen_fds_start: int = SD_LISTEN_FDS_START) -> None:
        self.service = service
        self.socket_path = os.path.abspath(socket_path)
        self.socket_mode = socket_mode
        self.socket_group = socket_group
        self.request_deadline = request_deadline
        self.max_connections = max_connections
        self.max_incomplete_per_uid = max_incomplete_per_uid  # None: incomplete_cap(max_connections)
        self.poll_interval = poll_interval  # longest select() wait
        self.router = _Router(service)
        self.activated = False
        self._credentials = credentials
        self._environ = os.environ if environ is None else environ
        self._listen_fds_start = listen_fds_start
        self._listener: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._lanes: dict[str, _FairLane] = {}
        self._sel: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._running = False
        self._loop_done = threading.Event()
        self._hand_lock = threading.Lock()
        self._handback: list[_Conn] = []
        self._accept_handbacks = False
        self._live_lock = threading.Lock()
        self._live = 0
        self._incomplete: dict[int, int] = {}
        self._read_deadlines: deque[tuple[float, _Conn]] = deque()
        self._write_deadlines: deque[tuple[float, _Conn]] = deque()
        self._accept_paused_until = 0.0
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self._refusal_logs = {
            "busy": _RateLog(lambda n: f"at the limit of {self.max_connections} concurrent connections: "
                                       f"{n} client(s) told to retry"),
            "per_uid_limit": _RateLog(lambda n: f"a user at the limit of {self.max_incomplete_per_uid} "
                                                f"unfinished connections: {n} client(s) told to retry"),
            "timeout": _RateLog(lambda n: f"{n} connection(s) closed: request not complete (or "
                                          f"response not read) within {self.request_deadline:g} s"),
        }

    # -- socket file ----------------------------------------------------
    def _bind(self, sock: socket.socket) -> None:
        self._inode = place_socket(self.socket_path, self.socket_mode, self.socket_group, sock.bind)

    def _remove_socket(self) -> None:
        remove_socket(self.socket_path, self._inode)  # None when socket activated: the file is systemd's

    def _ensure_listener(self) -> socket.socket:
        if self._listener is not None:
            return self._listener
        passed = activated_socket(self._environ, os.getpid(), start=self._listen_fds_start)
        if passed is not None:
            self.activated = True
            bound = passed.getsockname()
            if bound != self.socket_path:
                log.warning("systemd passed a socket on %s, not the configured %s: serving on it; "
                            "clients must use that path", bound or "(unnamed)", self.socket_path)
            passed.setblocking(False)
            self._listener = passed
            log.info("API listening on %s (socket activation: mode and group are the socket unit's)",
                     bound or self.socket_path)
            return passed
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._bind(sock)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._listener = sock
        log.info("API listening on %s (mode %o, group %s)", self.socket_path,
                 self.socket_mode, self.socket_group or "-")
        return sock

    # -- lifecycle ------------------------------------------------------
    def bind(self) -> "ApiServer":
        """Take the socket path now and listen, serving nothing until start():
        start-up claims it before anything is written, and clients that
        connect meanwhile wait in the listen queue."""
        self._ensure_listener()
        return self

    def attach(self, service: AgentApi, kubelet_documents: Callable[[], dict] | None = None) -> None:
        """The service to serve, when it exists only after bind(), and what
        answers GET /v1/kubelet."""
        self.service = service
        self.router = _Router(service, kubelet_documents)

    def _prepare(self) -> None:
        listener = self._ensure_listener()
        if self._running:
            raise RuntimeError("the API server is already serving")
        nofile = raise_nofile_limit()
        if self.max_connections is None:
            self.max_connections = connection_cap(nofile)
        if self.max_incomplete_per_uid is None:
            self.max_incomplete_per_uid = incomplete_cap(self.max_connections)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._running = True
        self._accept_handbacks = True
        self._loop_done.clear()
        self._lanes = {"read": _FairLane(), "write": _FairLane()}
        self._workers = []
        for lane, count in (("read", READ_WORKERS), ("write", WRITE_WORKERS)):
            for i in range(count):
                t = threading.Thread(target=self._work, args=(self._lanes[lane],),
                                     name=f"numa-agent-api-{lane}-{i}", daemon=True)
                t.start()
                self._workers.append(t)

    def start(self) -> "ApiServer":
        """Bind and serve in a background thread; returns once connectable."""
        self._prepare()
        self._thread = threading.Thread(target=self._loop, name="numa-agent-api", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Bind and serve in the calling thread until stop() is called from
        another thread (e.g. the one handling SIGTERM)."""
        self._prepare()
        self._loop()

    def stop(self, leave_socket: bool = False) -> None:
        """Stop accepting and close unfinished connections (their clients
        retry), let the workers answer the requests already complete (for a
        few seconds at most), close the socket and remove our socket file;
        with `leave_socket`, the file stays (an agent stopping after it served)."""
        listener = self._listener
        if listener is None:
            return
        if self._running:
            self._running = False
            self._wake()
            if threading.current_thread() is not self._thread:
                self._loop_done.wait(timeout=5)
            if self._thread is not None:
                self._thread.join(timeout=5)
                self._thread = None
        self._listener = None
        listener.close()
        if not leave_socket:
            self._remove_socket()
        for lane in self._lanes.values():
            for _ in range(READ_WORKERS + WRITE_WORKERS):
                lane.put(None)
        give_up = time.monotonic() + 5
        for t in self._workers:
            t.join(timeout=max(0.0, give_up - time.monotonic()))
        self._workers = []
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        self._wake_r = self._wake_w = None

    def __enter__(self) -> "ApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        """Connections now open and refused so far, by reason (base units, stable keys)."""
        with self._live_lock:
            live = self._live
        return {"open_connections": live, "max_connections": self.max_connections,
                "refused_connections_total": dict(self.refused)}

    # -- the I/O thread -------------------------------------------------
    def _wake(self) -> None:
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"\0")
            except OSError:
                pass  # full: a wake-up is already pending

    def _loop(self) -> None:
        sel = self._sel
        assert sel is not None
        try:
            while self._running:
                now = time.monotonic()
                for key, _mask in sel.select(self._timeout(now)):
                    data = key.data
                    try:
                        if data is _LISTENER:
                            self._accept()
                        elif data is _WAKE:
                            self._drain_wake()
                        elif data.state == _READING:
                            self._on_read(data)
                        elif data.state == _WRITING:
                            self._on_write(data)
                    except Exception:  # one connection's trouble must not stop the API
                        log.exception("API connection handling failed")
                        if isinstance(data, _Conn):
                            self._close(data)
                self._take_handbacks()
                now = time.monotonic()
                self._expire(now)
                for rate_log in self._refusal_logs.values():
                    rate_log.flush(now)
        finally:
            with self._hand_lock:
                self._accept_handbacks = False
                pending, self._handback = self._handback, []
            for conn in pending:
                self._close(conn)
            for key in list(sel.get_map().values()):
                if isinstance(key.data, _Conn):
                    self._close(key.data)
            sel.close()
            self._read_deadlines.clear()
            self._write_deadlines.clear()
            self._incomplete.clear()
            self._loop_done.set()

    def _timeout(self, now: float) -> float:
        wait = self.poll_interval
        for dq in (self._read_deadlines, self._write_deadlines):
            if dq:
                wait = min(wait, dq[0][0] - now)
        if self._accept_paused_until:
            wait = min(wait, self._accept_paused_until - now)
        return max(0.0, wait)

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None and self._sel is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: stop accepting for a moment instead of spinning.
                    log.warning("cannot accept API connections: %s; pausing accepts for 0.1 s", exc)
                    self._sel.unregister(listener)
                    self._accept_paused_until = time.monotonic() + 0.1
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            sock.setblocking(False)
            self._admit_connection(sock)

    def _admit_connection(self, sock: socket.socket) -> None:
        assert self.max_connections is not None and self.max_incomplete_per_uid is not None
        assert self._sel is not None
        with self._live_lock:
            full = self._live >= self.max_connections
        if full:
            self._refuse(sock, "busy", ServerBusy("too many concurrent connections; retry"))
            return
        try:
            creds = self._credentials(sock)
        except OSError:
            sock.close()
            return
        uid = creds[1]
        if self._incomplete.get(uid, 0) >= self.max_incomplete_per_uid:
            self._refuse(sock, "per_uid_limit", ServerBusy(
                f"uid {uid} has {self.max_incomplete_per_uid} unfinished connections open; retry"))
            return
        try:
            caller = pinned_caller(sock, creds)
        except OSError:
            sock.close()
            return
        conn = _Conn(sock, caller, time.monotonic() + self.request_deadline)
        self._incomplete[uid] = self._incomplete.get(uid, 0) + 1
        with self._live_lock:
            self._live += 1
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self._read_deadlines.append((conn.deadline, conn))

    def _refuse(self, sock: socket.socket, reason: str, error: ApiError) -> None:
        self._count(reason)  # before the answer: whoever reads it finds the refusal counted
        try:
            sock.send(_json_body(error.status, error.to_dict()))
        except OSError:
            pass
        sock.close()

    def _count(self, reason: str) -> None:
        self.refused[reason] += 1
        counters = getattr(self.service, "counters", None)
        note = getattr(counters, "api_refused", None)
        if callable(note):
            note(reason)
        self._refusal_logs[reason].note(time.monotonic())

    def _not_incomplete(self, conn: _Conn) -> None:
        uid = conn.caller.uid
        left = self._incomplete.get(uid, 0) - 1
        if left > 0:
            self._incomplete[uid] = left
        else:
            self._incomplete.pop(uid, None)

    def _on_read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not chunk:
            # Gone (or half-closed) before a whole request: not worth a warning
            # each, a flood of them would flood the log.
            log.debug("pid %s uid %s closed its connection after %d bytes, before a whole request",
                      conn.caller.pid, conn.caller.uid, len(conn.buf))
            if conn.buf:
                self._fail(conn, BadRequest("connection closed before the request was complete"),
                           quiet=True)
            else:
                self._close(conn)
            return
        buf = conn.buf
        buf += chunk
        if conn.head is None:
            # Search only the new bytes (and 3 before) for the end of the head.
            if buf.find(b"\r\n\r\n", max(0, conn.scanned - 3)) < 0:
                conn.scanned = len(buf)
                if len(buf) > MAX_HEAD_BYTES:
                    self._fail(conn, HeadersTooLarge(f"request head exceeds {MAX_HEAD_BYTES} bytes"))
                return
        try:
            conn.head, req = parse_request(bytes(buf), conn.head)
        except ApiError as exc:
            self._fail(conn, exc)
            return
        if req is None:
            return
        # Complete: the connection leaves the selector; a worker owns it now.
        assert self._sel is not None
        self._sel.unregister(conn.sock)
        self._not_incomplete(conn)
        conn.state = _QUEUED
        conn.buf = bytearray()
        lane = "read" if req.method in ("GET", "HEAD") else "write"
        self._lanes[lane].put((conn, req))

    def _fail(self, conn: _Conn, exc: ApiError, *, quiet: bool = False) -> None:
        """Answer a request that never became complete or valid."""
        if not quiet:
            log.warning("- - from pid %s uid %s -> %d %s: %s", conn.caller.pid, conn.caller.uid,
                        exc.status, exc.code, exc.message)
        self._not_incomplete(conn)
        conn.close_pidfd()
        assert self._sel is not None
        self._sel.unregister(conn.sock)
        self._start_write(conn, _json_body(exc.status, exc.to_dict()))

    def _start_write(self, conn: _Conn, data: bytes) -> None:
        """(I/O thread) Send what fits now; the rest when the socket is writable."""
        conn.state = _WRITING
        conn.out = memoryview(data)
        self._on_write(conn, registered=False)

    def _on_write(self, conn: _Conn, registered: bool = True) -> None:
        assert conn.out is not None and self._sel is not None
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            if registered:
                self._sel.unregister(conn.sock)
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            if registered:
                self._sel.unregister(conn.sock)
            self._finish(conn)
            return
        if not registered:
            conn.deadline = time.monotonic() + self.request_deadline
            self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
            self._write_deadlines.append((conn.deadline, conn))

    def _take_handbacks(self) -> None:
        with self._hand_lock:
            pending, self._handback = self._handback, []
        for conn in pending:
            assert conn.out is not None
            self._start_write(conn, bytes(conn.out))

    def _expire(self, now: float) -> None:
        assert self._sel is not None
        if self._accept_paused_until and now >= self._accept_paused_until and self._listener is not None:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
        reads = self._read_deadlines
        while reads and reads[0][0] <= now:
            _, conn = reads.popleft()
            if conn.state == _READING:
                self._count("timeout")
                self._fail(conn, RequestTimeout(
                    f"request not received within {self.request_deadline:g} s"), quiet=True)
        writes = self._write_deadlines
        while writes and writes[0][0] <= now:
            deadline, conn = writes.popleft()
            if conn.state == _WRITING and conn.deadline == deadline:
                self._count("timeout")
                self._sel.unregister(conn.sock)
                self._close(conn)

    # -- closing (any thread; a connection has one owner at a time) -------
    def _finish(self, conn: _Conn) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        if conn.state == _READING:
            self._not_incomplete(conn)
            if self._sel is not None:
                try:
                    self._sel.unregister(conn.sock)
                except (KeyError, ValueError):
                    pass
        conn.state = _CLOSED
        conn.close_pidfd()
        conn.sock.close()
        with self._live_lock:
            self._live -= 1

    # -- workers ----------------------------------------------------------
    def _work(self, lane: _FairLane) -> None:
        while True:
            item = lane.get()
            if item is None:
                return
            conn, req = item
            try:
                data = self._handle(conn, req)
            except Exception:
                log.exception("API worker failed")
                self._close(conn)
                continue
            self._respond(conn, data)

    def _handle(self, conn: _Conn, req: _Request) -> bytes:
        caller = conn.caller
        try:
            status, payload = self.router.dispatch(req, caller)
        except ApiError as exc:
            status, payload = exc.status, exc.to_dict()
            log.warning("%s %s from pid %s uid %s -> %d %s: %s", req.method, req.path[:100],
                        caller.pid, caller.uid, status, exc.code, exc.message)
        except Exception:  # a bug in the service must not kill the server
            log.exception("%s %s failed", req.method, req.path[:100])
            status = 500
            payload = {"error": {"code": "internal_error",
                                 "message": "internal error; see the agent's log", "details": {}}}
        else:
            log.debug("%s %s from pid %s uid %s -> %d", req.method, req.path[:100],
                      caller.pid, caller.uid, status)
        finally:
            conn.close_pidfd()
        return _json_body(status, payload)

    def _respond(self, conn: _Conn, data: bytes) -> None:
        """(worker) Send the answer if it fits the socket buffer, else hand the
        rest to the I/O thread, or, once it has stopped, finish with a
        bounded blocking write."""
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            log.debug("client went away before the response: %s", exc)
            self._close(conn)
            return
        if sent == len(data):
            self._finish(conn)
            return
        conn.out = memoryview(data)[sent:]
        with self._hand_lock:
            if self._accept_handbacks:
                self._handback.append(conn)
                self._wake()
                return
        try:
            conn.sock.settimeout(self.request_deadline)
            conn.sock.sendall(conn.out)
        except OSError as exc:
            log.debug("client went away before the response: %s", exc)
        self._finish(conn)
