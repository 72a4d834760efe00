"""Minimal client of the agent's local API.

Imports only the standard library's raw `_socket` (the `socket` module's own
imports, selectors and all, cost numa-run several ms) and `os`, and writes and
reads its JSON with numa_agent.api.wirejson (json's import, re and all, costs
more), so that `numa-run` starts fast: it runs before every latency-sensitive
program. One request per connection, matching the server.
"""

from __future__ import annotations

import _socket
import errno
import os
import sys
import time

from numa_agent.api import wirejson

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run imports this)
if TYPE_CHECKING:
    from typing import Callable

_MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class ClientError(Exception):
    """Base of the client's own failures (not the agent's refusals)."""


class AgentUnreachable(ClientError):
    """No agent answers on the socket path."""


class BadResponse(ClientError):
    """The agent answered something that is not an HTTP/JSON response."""


class NoAnswerInTime(BadResponse):
    """The agent took the request but did not answer within the timeout."""


class UntrustedAgent(ClientError):
    """Whatever listens on the socket runs as a user the caller does not trust."""


# Set to a user name or uid when the agent runs as a dedicated user.
AGENT_USER_ENV = "NUMA_AGENT_USER"


def trusted_uids(environ=os.environ) -> frozenset[int]:
    """Who may answer as the agent: root, the caller itself (an agent of one's
    own has no more rights than its user) and the configured agent user."""
    uids = {0, os.getuid()}
    configured = environ.get(AGENT_USER_ENV, "").strip()
    if configured.isdigit():
        uids.add(int(configured))
    elif configured:
        import pwd  # only when configured by name: numa-run starts fast otherwise

        try:
            uids.add(pwd.getpwnam(configured).pw_uid)
        except KeyError:
            pass  # an unknown name adds nobody
    return frozenset(uids)


def check_peer(sock: _socket.socket, socket_path: str, trusted: frozenset[int]) -> None:
    """Refuse a server whose peer credentials are not a trusted user's: an
    impostor on a world-writable path must not decide what numa-run runs."""
    # struct ucred: three native ints (pid, uid, gid)
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid, uid = (int.from_bytes(creds[i:i + 4], sys.byteorder, signed=True) for i in (0, 4))
    if uid not in trusted:
        allowed = ", ".join(str(u) for u in sorted(trusted))
        raise UntrustedAgent(
            f"refusing the server on {socket_path}: it runs as uid {uid} (pid {pid}), not as root or a trusted "
            f"agent user (uids {allowed}); if the agent runs as a dedicated user, set {AGENT_USER_ENV}")


# How long a client waits out a busy or restarting agent: "busy" and "request
# timeout" are answered before the request reaches the service, a refused socket (or a missing one
# while an agent is starting: agent_starting) took nothing, and
# a connection closed (or an answer not come in time) is retried only for a request that
# is safe to repeat (not a POST, or one carrying a request id the agent
# deduplicates). Overridden by $NUMA_AGENT_RETRY_SECONDS (0: no retry).
RETRY_SECONDS = 30.0
RETRY_ENV = "NUMA_AGENT_RETRY_SECONDS"
_NOTICE_AFTER = 1.0


class _Retry(Exception):
    """A failure worth another try; `final` is what to raise once out of time."""

    def __init__(self, why: str, final: ClientError) -> None:
        super().__init__(why)
        self.why = why
        self.final = final


def retry_budget(environ=os.environ) -> float:
    raw = environ.get(RETRY_ENV, "").strip()
    try:
        value = float(raw) if raw else RETRY_SECONDS
    except ValueError:
        value = RETRY_SECONDS
    return max(0.0, min(value, 3600.0))


def new_request_id() -> str:
    """A random 128-bit id (hex) that makes retrying an admission safe."""
    return os.urandom(16).hex()


def request(socket_path: str, method: str, path: str, body: dict | None = None,
            timeout: float = 30, trusted: frozenset[int] | None = None,
            busy_retry: float | None = None,
            while_waiting: Callable[[], object] | None = None) -> tuple[int, dict]:
    """Send one request; return (HTTP status, decoded JSON body). The server
    must run as one of `trusted` (default: trusted_uids()). A busy or
    restarting agent is retried with backoff for up to `busy_retry` seconds
    (default retry_budget()), saying so on stderr after the first second.
    `while_waiting`, if given, runs once, right after the request is first sent and
    before the answer is read: work the caller needs next, done while the agent
    works (it must not raise)."""
    budget = retry_budget() if busy_retry is None else busy_retry
    repeatable = method != "POST" or "dry_run=1" in path or bool(body and body.get("request_id"))
    started = time.monotonic()
    deadline = started + budget
    delay, noticed = 0.01, False
    pending = [while_waiting] if while_waiting is not None else []

    def once() -> None:  # the first attempt that sends runs it; a retry does not again
        if pending:
            pending.pop()()
    final: ClientError | None
    why: str | None
    while True:
        try:
            status, answer = _request_once(socket_path, method, path, body, timeout, trusted,
                                           repeatable, once)
        except _Retry as exc:
            why, final = exc.why, exc.final
            status, answer = 0, {}
        else:
            why = _retry_reason(status, answer)
            if why is None:
                return status, answer
            final = None
        if time.monotonic() + delay > deadline:
            if final is not None:
                raise final
            return status, answer
        if not noticed and time.monotonic() - started >= _NOTICE_AFTER:
            print(f"waiting: the agent at {socket_path} {why}; retrying for up to {budget:g} s",
                  file=sys.stderr)
            noticed = True
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _retry_reason(status: int, answer: dict) -> str | None:
    """Why an answer is worth another try, or None. Both are answered before
    the request reaches the service, so repeating it cannot book twice."""
    error = answer.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    if status == 503 and code == "busy":
        return "is busy"
    if status == 408 and code == "request_timeout":
        # Our own request came too slowly (this machine overloaded): send it again.
        return "did not receive our request in time"
    return None


def _request_once(socket_path: str, method: str, path: str, body: dict | None,
                  timeout: float, trusted: frozenset[int] | None,
                  repeatable: bool = False,
                  while_waiting: Callable[[], object] | None = None) -> tuple[int, dict]:
    payload = b"" if body is None else wirejson.dumps(body).encode("utf-8")
    head = (f"{method} {path} HTTP/1.1\r\nHost: numa-agent\r\nConnection: close\r\n"
            f"Accept: application/json\r\n")
    if body is not None or method in ("POST", "PUT"):
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            _connect(sock, socket_path, timeout)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.ENOENT:
                # No socket at all: worth waiting for only while an agent is starting.
                missing = f"cannot reach the agent at {socket_path}: {reason}; "
                starting = agent_starting(socket_path)
                if starting is None:
                    raise AgentUnreachable(
                        f"{missing}no agent runs or starts there: {START_HINT}") from None
                raise _Retry(f"is starting ({starting})", AgentUnreachable(
                    f"{missing}it did not come up in time although {starting}: see its log "
                    "(`journalctl -u numa-agent`, or its own output)")) from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise AgentUnreachable(permission_message(socket_path)) from None
            unreachable = AgentUnreachable(
                f"cannot reach the agent at {socket_path}: {reason}; is the agent running? {START_HINT}")
            if exc.errno in (errno.ECONNREFUSED, errno.EAGAIN):
                # Nothing was sent: the socket is there but nobody accepts (an agent restarting).
                raise _Retry(f"does not answer ({reason.lower()})", unreachable) from None
            raise unreachable from None
        check_peer(sock, socket_path, trusted_uids() if trusted is None else trusted)
        try:
            sock.sendall(head.encode("ascii") + b"\r\n" + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (e.g. 413) before reading everything
        except TimeoutError:
            raise BadResponse(f"timed out sending to the agent at {socket_path}") from None
        if while_waiting is not None:
            while_waiting()
        try:
            raw = _read_all(sock, socket_path)
        except NoAnswerInTime as exc:
            if not repeatable:
                raise  # it may still be booking: asking again could book twice
            # A saturated machine; a repeat is safe (a request id is answered once).
            raise _Retry("did not answer in time", exc) from None
    finally:
        sock.close()
    if repeatable and b"\r\n\r\n" not in raw:
        # Closed before answering: the agent stopped (restart) with our request unanswered.
        try:
            _parse_response(raw, socket_path)
        except BadResponse as exc:
            raise _Retry("closed the connection before answering", exc) from None
    return _parse_response(raw, socket_path)


START_HINT = ("start it (`systemctl start numa-agent` where it is installed as a service, "
              "`numa-agent serve` otherwise), or name a running agent's socket with --socket "
              "or $NUMA_AGENT_SOCKET")

# Where a starting agent's state directory lock may be: scripts/agent's layout (state/
# beside the socket), and with the default socket the default state directory
# (numa_agent.daemon.config.DEFAULT_STATE_DIR; the client may not import the daemon).
DEFAULT_STATE_DIR = "/var/lib/numa-agent"
_LOCK_NAME = "lock"  # numa_agent.state.directory.LOCK_NAME
_UNIT = "numa-agent"


def agent_starting(socket_path: str, proc_locks: str = "/proc/locks",
                   systemd: Callable[[], str | None] | None = None) -> str | None:
    """Why a socket path with no socket is worth waiting for (an agent is starting and
    will bind it), or None. Read without disturbing the agent: the state directory's
    lock through /proc/locks (taking the lock, even shared, could make the agent's own
    attempt fail), systemd's view through `systemctl show`. `systemd` replaces that
    call in tests: it returns what `systemctl show` would print, or None."""
    from numa_agent.core.names import DEFAULT_SOCKET

    directory = os.path.dirname(os.path.abspath(socket_path))
    candidates = [os.path.join(directory, "state", _LOCK_NAME), os.path.join(directory, _LOCK_NAME)]
    if os.path.abspath(socket_path) == DEFAULT_SOCKET:
        candidates.append(os.path.join(DEFAULT_STATE_DIR, _LOCK_NAME))
    held = _flocked(candidates, proc_locks)
    if held is not None:
        return f"an agent holds its state directory's lock ({held})"
    return _systemd_starting(socket_path, (systemd or _systemctl_show)())


def _flocked(paths: list[str], proc_locks: str) -> str | None:
    """The first of `paths` some process holds a flock on, from the kernel's list."""
    ids = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue  # absent, or in a directory closed to us: cannot tell
        ids[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = path
    if not ids:
        return None
    try:
        with open(proc_locks) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 9549 fe:00:2146337 0 EOF"
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        major, _, rest = fields[5].partition(":")
        minor, _, inode = rest.partition(":")
        try:
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if key in ids:
            return ids[key]
    return None


def _systemctl_show() -> str | None:
    """`systemctl show` of the agent's service and socket units, or None without systemd."""
    if not os.path.isdir("/run/systemd/system"):
        return None  # not booted with systemd
    import subprocess  # only when no socket is there: numa-run starts fast otherwise

    try:
        done = subprocess.run(["systemctl", "show", "--property=Id,ActiveState,Listen",
                               f"{_UNIT}.service", f"{_UNIT}.socket"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _systemd_starting(socket_path: str, shown: str | None) -> str | None:
    """From `systemctl show` blocks: the service activating (a start, or a restart
    waiting out RestartSec=), or a socket unit listening on `socket_path`."""
    for block in (shown or "").split("\n\n"):
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        unit, state = props.get("Id", ""), props.get("ActiveState", "")
        if unit.endswith(".service") and state == "activating":
            return f"{unit} is activating"
        listens = props.get("Listen", "").split()
        if (unit.endswith(".socket") and state in ("active", "activating")
                and os.path.abspath(socket_path) in listens):
            return f"{unit} holds {socket_path}"
    return None


def permission_message(socket_path: str) -> str:
    """Why connecting to the socket was denied, and the remedy: the socket's group and
    mode (the agent's [agent] socket_group and socket_mode, or numa-agent.socket's)."""
    try:
        st = os.stat(socket_path)
    except OSError:
        directory = os.path.dirname(os.path.abspath(socket_path))
        return (f"permission denied on {socket_path}: its directory {directory} is closed to you "
                "(the agent's socket directory should be 0755)")
    import grp  # only on this error: numa-run starts fast otherwise

    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    mode = st.st_mode & 0o7777
    where = f"permission denied on {socket_path} (group {group}, mode {mode:04o})"
    if st.st_gid in (os.getgid(), *os.getgroups()):
        if not mode & 0o020:
            return (f"{where}: you are in group {group}, which may not write it: set the agent's "
                    f"[agent] socket_mode = \"0660\" (SocketMode= with numa-agent.socket)")
        return (f"{where}: you are in group {group}, which may write it: a directory above it "
                "is closed to you, or a security module (SELinux, AppArmor) denies it")
    return (f"{where}: join group {group} (then log in again), or set the agent's [agent] "
            f"socket_group to a group you are in (SocketGroup= with numa-agent.socket)")


def _connect(sock: _socket.socket, socket_path: str, timeout: float) -> None:
    # A Unix socket with a timeout fails at once with EAGAIN while the agent's
    # listen queue is full (many numa-runs starting together): wait our turn.
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            sock.connect(socket_path)
            return
        except BlockingIOError:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _read_all(sock: _socket.socket, socket_path: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise NoAnswerInTime(f"the agent at {socket_path} did not answer in time") from None
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > _MAX_RESPONSE_BYTES:
            raise BadResponse(f"response from {socket_path} is too large")
    return b"".join(chunks)


def _parse_response(raw: bytes, socket_path: str) -> tuple[int, dict]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise BadResponse(f"incomplete HTTP response from {socket_path}")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise BadResponse(f"not an HTTP response from {socket_path}: {lines[0][:60]!r}")
    status = int(parts[1])
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            body = body[:int(value.strip())]
    if not body:
        return status, {}
    try:
        data = wirejson.loads(body)
    except (ValueError, RecursionError):  # (nested past the parser's depth)
        raise BadResponse(f"response from {socket_path} is not JSON (status {status})") from None
    if not isinstance(data, dict):
        data = {"items": data}
    return status, data

