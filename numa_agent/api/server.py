"""The agent's local API: HTTP/1.1 + JSON over a Unix socket.

Why threads on `socketserver.ThreadingMixIn` + `UnixStreamServer` rather than
asyncio: the service is synchronous and serializes admissions with its own
lock, and the caller's identity comes from `getsockopt` on the accepted
socket, both of which fit a thread per connection directly. A slow or
hostile client only ties up its own thread (bounded by a per-connection
deadline and a cap on concurrent connections), never the others. The
standard library's `http.server` is not used because its limits (header
count, line length, no overall deadline, no body cap) are not the ones this
API needs; the small parser below enforces exactly those.

One request per connection: every response carries `Connection: close`,
which is plain HTTP/1.1 and what `curl --unix-socket` and our client expect.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
import time
from typing import Any, Callable
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
from numa_agent.api.validation import MAX_BODY_BYTES, parse_admit_request, validate_name
from numa_agent.enforcement.processes import process_identity
from numa_agent.service.caller import Caller

log = logging.getLogger("numa_agent.api")

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
REQUEST_DEADLINE_SECONDS = 5.0
MAX_CONNECTIONS = 64
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            409: "Conflict", 411: "Length Required", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


class SocketInUse(RuntimeError):
    """Another process is already serving on the socket path."""


class _Request:
    __slots__ = ("method", "path", "query", "headers", "body")

    def __init__(self, method: str, path: str, query: str,
                 headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body


# ---------------------------------------------------------------- reading
def _read_request(conn: socket.socket, deadline: float) -> _Request:
    """Read one request within `deadline` (a time.monotonic() value)."""
    buf = b""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(buf) > MAX_HEAD_BYTES:
            raise HeadersTooLarge(f"request head exceeds {MAX_HEAD_BYTES} bytes")
        chunk = _recv(conn, deadline, 4096)
        if not chunk:
            raise BadRequest("connection closed before the request head was complete")
        buf += chunk
    if end > MAX_HEAD_BYTES:
        raise HeadersTooLarge(f"request head exceeds {MAX_HEAD_BYTES} bytes")
    head, rest = buf[:end], buf[end + 4:]
    try:
        text = head.decode("ascii")
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
    body = _read_body(conn, deadline, method, headers, rest)
    path, _, query = target.partition("?")
    return _Request(method, path, query, headers, body)


def _read_body(conn: socket.socket, deadline: float, method: str,
               headers: dict[str, str], rest: bytes) -> bytes:
    if "transfer-encoding" in headers:
        raise LengthRequired("chunked or other transfer encodings are not accepted; send Content-Length")
    raw = headers.get("content-length")
    if raw is None:
        if method == "POST":
            raise LengthRequired("POST needs a Content-Length header")
        return b""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise BadRequest(f"invalid Content-Length {raw[:20]!r}")
    length = int(raw)
    if length > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES}")
    body = rest
    while len(body) < length:
        chunk = _recv(conn, deadline, length - len(body))
        if not chunk:
            raise BadRequest(f"connection closed after {len(body)} of {length} body bytes")
        body += chunk
    return body[:length]


def _recv(conn: socket.socket, deadline: float, size: int) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise RequestTimeout(f"request not received within {REQUEST_DEADLINE_SECONDS:g} s")
    conn.settimeout(remaining)
    try:
        return conn.recv(size)
    except socket.timeout:
        raise RequestTimeout(f"request not received within {REQUEST_DEADLINE_SECONDS:g} s") from None


# ---------------------------------------------------------------- identity
def peer_caller(conn: socket.socket) -> Caller:
    """The connecting process as the kernel reports it, with a pidfd pinned.

    SO_PEERPIDFD (Linux 6.5+) yields a pidfd for the very process that
    connected; otherwise pidfd_open(pid) right away narrows the PID-reuse
    window to the time since connect.
    """
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
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
    return Caller(pid=pid, uid=uid, gid=gid, pidfd=pidfd, identity=identity)


# ---------------------------------------------------------------- routing
def _json_body(status: int, payload: Any) -> bytes:
    body = msgspec.json.encode(payload)
    reason = _REASONS.get(status, "Unknown")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


def _dry_run_flag(query: str) -> bool:
    dry_run = False
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key != "dry_run":
            raise BadRequest(f"unknown query parameter {key[:40]!r}")
        if value in ("1", "true", ""):
            dry_run = True
        elif value in ("0", "false"):
            dry_run = False
        else:
            raise BadRequest(f"dry_run must be 1 or 0, got {value[:20]!r}")
    return dry_run


def _no_query(query: str) -> None:
    if query:
        raise BadRequest("this route takes no query parameters")


def allocatable_view(status: dict[str, Any]) -> dict[str, Any]:
    """Per-node capacity and free amounts, cut from the service's status()."""
    nodes = []
    for node in status.get("nodes", []):
        entry: dict[str, Any] = {"id": node["id"]}
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

    def __init__(self, service: Any) -> None:
        self.service = service

    def dispatch(self, req: _Request, caller: Caller) -> tuple[int, Any]:
        path = req.path
        if path.startswith("/v1/workloads/"):
            return self._workload(req, caller, path[len("/v1/workloads/"):])
        fixed: dict[str, dict[str, Callable[[], tuple[int, Any]]]] = {
            "/v1/health": {"GET": lambda: (200, self.service.health())},
            "/v1/topology": {"GET": lambda: (200, self.service.topology())},
            "/v1/status": {"GET": lambda: (200, self.service.status(caller.uid))},
            "/v1/allocatable": {"GET": lambda: (200, allocatable_view(self.service.status(caller.uid)))},
            "/v1/workloads": {
                "GET": lambda: (200, {"workloads": self.service.list_workloads(caller.uid)}),
                "POST": lambda: self._admit(req, caller),
            },
        }
        methods = fixed.get(path)
        if methods is None:
            raise NotFound(f"no route {path[:100]!r}; see /v1/health, /v1/topology, "
                           "/v1/status, /v1/allocatable, /v1/workloads")
        handler = methods.get(req.method)
        if handler is None:
            raise MethodNotAllowed(f"{req.method[:20]} is not allowed on {path}",
                                   details={"allowed": sorted(methods)})
        if req.method != "POST":
            _no_query(req.query)
        return handler()

    def _admit(self, req: _Request, caller: Caller) -> tuple[int, Any]:
        dry_run = _dry_run_flag(req.query)
        request = parse_admit_request(req.body)
        result = self.service.admit(request, caller, dry_run=dry_run)
        return (200 if dry_run else 201), result

    def _workload(self, req: _Request, caller: Caller, raw_name: str) -> tuple[int, Any]:
        if req.method != "DELETE":
            raise MethodNotAllowed(f"{req.method[:20]} is not allowed on /v1/workloads/NAME",
                                   details={"allowed": ["DELETE"]})
        _no_query(req.query)
        try:
            name = unquote(raw_name, errors="strict")
        except UnicodeDecodeError:
            raise BadRequest("workload name is not valid UTF-8") from None
        validate_name(name, "workload name")
        return 200, self.service.release(name, caller)


# ---------------------------------------------------------------- server
class _Handler(socketserver.BaseRequestHandler):
    server: "_UnixServer"

    def handle(self) -> None:
        conn: socket.socket = self.request
        api = self.server.api
        started = time.monotonic()
        caller: Caller | None = None
        method, path = "-", "-"
        try:
            caller = peer_caller(conn)
            req = _read_request(conn, started + api.request_deadline)
            method, path = req.method, req.path
            status, payload = api.router.dispatch(req, caller)
        except ApiError as exc:
            status, payload = exc.status, exc.to_dict()
            log.warning("%s %s from pid %s uid %s -> %d %s: %s", method, path[:100],
                        caller and caller.pid, caller and caller.uid, status, exc.code, exc.message)
        except Exception:  # a bug in the service must not kill the server
            log.exception("%s %s failed", method, path[:100])
            status = 500
            payload = {"error": {"code": "internal_error",
                                 "message": "internal error; see the agent's log", "details": {}}}
        else:
            log.debug("%s %s from pid %s uid %s -> %d", method, path[:100],
                      caller.pid, caller.uid, status)
        finally:
            # The service dups any pidfd it keeps; ours is closed here.
            if caller is not None and caller.pidfd is not None:
                os.close(caller.pidfd)
        self._send(conn, status, payload)

    def _send(self, conn: socket.socket, status: int, payload: Any) -> None:
        try:
            conn.settimeout(self.server.api.request_deadline)
            conn.sendall(_json_body(status, payload))
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            log.debug("client went away before the response: %s", exc)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default backlog of 5 turns a burst of numa-runs into
    # EAGAIN at connect; the kernel caps this at net.core.somaxconn.
    request_queue_size = 256
    api: "ApiServer"

    def __init__(self, api: "ApiServer") -> None:
        self.api = api
        self._slots = threading.BoundedSemaphore(api.max_connections)
        self._busy_unlogged = 0  # busy refusals since the last log line (at most one a second)
        self._busy_logged_at = 0.0
        super().__init__(api.socket_path, _Handler, bind_and_activate=False)

    def server_bind(self) -> None:
        self.api._bind(self.socket)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Cap concurrent connections so a flood cannot exhaust threads.
        if not self._slots.acquire(blocking=False):
            self._log_busy()
            try:
                request.sendall(_json_body(503, ServerBusy(
                    "too many concurrent connections; retry").to_dict()))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _log_busy(self) -> None:
        self._busy_unlogged += 1
        now = time.monotonic()
        if now - self._busy_logged_at >= 1.0:
            log.warning("at the limit of %d concurrent connections: %d client(s) told to retry",
                        self.api.max_connections, self._busy_unlogged)
            self._busy_unlogged, self._busy_logged_at = 0, now

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class ApiServer:
    """Serves `service` (the AgentService contract) on a Unix socket.

    Who may connect, and so admit, is decided by the socket file's mode and
    group: it is created under a umask that leaves it private, then chowned
    to `socket_group` and chmodded to `socket_mode` before it is moved into
    place. A stale socket left by a crashed agent is replaced; a path where
    an agent still answers raises SocketInUse.
    """

    def __init__(self, service: Any, socket_path: str, socket_mode: int = 0o660,
                 socket_group: str | None = None, *,
                 request_deadline: float = REQUEST_DEADLINE_SECONDS,
                 max_connections: int = MAX_CONNECTIONS,
                 poll_interval: float = 0.5) -> None:
        self.service = service
        self.socket_path = os.path.abspath(socket_path)
        self.socket_mode = socket_mode
        self.socket_group = socket_group
        self.request_deadline = request_deadline
        self.max_connections = max_connections
        self.poll_interval = poll_interval  # how soon stop() takes effect
        self.router = _Router(service)
        self._server: _UnixServer | None = None
        self._thread: threading.Thread | None = None
        self._inode: tuple[int, int] | None = None

    # -- socket file ----------------------------------------------------
    def _check_existing(self) -> None:
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUse(f"{self.socket_path} exists and is not a socket; "
                              "refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(self.socket_path)
        except (ConnectionRefusedError, FileNotFoundError):
            return  # stale: nobody listens; the bind below replaces it
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise SocketInUse(f"cannot tell whether {self.socket_path} is in use: {exc}") from None
            return
        finally:
            probe.close()
        raise SocketInUse(f"another agent is already serving on {self.socket_path}; "
                          "stop it first or choose another --socket")

    def _bind(self, sock: socket.socket) -> None:
        self._check_existing()
        parent = os.path.dirname(self.socket_path)
        os.makedirs(parent, mode=0o755, exist_ok=True)
        gid = -1
        if self.socket_group is not None:
            try:
                gid = grp.getgrnam(self.socket_group).gr_gid
            except KeyError:
                raise ValueError(f"socket group {self.socket_group!r} does not exist") from None
        # Bind under a temporary name with a private umask, fix owner and
        # mode, then rename: the final path never exists with loose rights.
        tmp = os.path.join(parent, f".{os.path.basename(self.socket_path)}.{os.getpid()}.tmp")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        old_umask = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old_umask)
        try:
            if gid != -1:
                os.chown(tmp, -1, gid)
            os.chmod(tmp, self.socket_mode)
            os.rename(tmp, self.socket_path)
        except BaseException:
            os.unlink(tmp)
            raise
        st = os.stat(self.socket_path)
        self._inode = (st.st_dev, st.st_ino)

    def _remove_socket(self) -> None:
        # Only unlink the path if it is still our socket (a successor may own it).
        try:
            st = os.stat(self.socket_path)
        except FileNotFoundError:
            return
        if self._inode == (st.st_dev, st.st_ino):
            os.unlink(self.socket_path)

    # -- lifecycle ------------------------------------------------------
    def bind(self) -> "ApiServer":
        """Take the socket path now and listen, serving nothing until start():
        start-up claims it before anything is written, and clients that
        connect meanwhile wait in the listen queue."""
        self._ensure_server()
        return self

    def attach(self, service: Any) -> None:
        """The service to serve, when it exists only after bind()."""
        self.service = service
        self.router = _Router(service)

    def _ensure_server(self) -> _UnixServer:
        if self._server is None:
            server = _UnixServer(self)
            try:
                server.server_bind()
                server.server_activate()
            except BaseException:
                server.server_close()
                raise
            self._server = server
            log.info("API listening on %s (mode %o, group %s)", self.socket_path,
                     self.socket_mode, self.socket_group or "-")
        return self._server

    def start(self) -> "ApiServer":
        """Bind and serve in a background thread; returns once connectable."""
        server = self._ensure_server()
        self._thread = threading.Thread(target=server.serve_forever, name="numa-agent-api",
                                        kwargs={"poll_interval": self.poll_interval}, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Bind and serve in the calling thread until stop() is called from
        another thread (e.g. the one handling SIGTERM)."""
        self._ensure_server().serve_forever(poll_interval=self.poll_interval)

    def stop(self) -> None:
        """Stop accepting, wait for the serving loop, remove our socket file.
        Requests already being handled finish on their own (daemon threads)."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:  # shutdown() waits for a serving loop: only if one runs
            server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._remove_socket()

    def __enter__(self) -> "ApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
