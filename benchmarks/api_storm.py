"""The API under a storm, against a real agent (of this checkout, or of
others given with --checkout, e.g. main, to compare):

1. 200 `numa-run --cpus 1 -- true` started at once: how many were admitted,
   refused for capacity, turned away busy (after the client's own retries),
   or failed otherwise; and how many met a busy answer on the way.
2. Good requests (GET /v1/health, POST /v1/workloads?dry_run=1) one after
   another while another user keeps 64 slowloris and 1,000 idle connections
   open on the API, and 1,000 idle ones each on /metrics and PodResources
   (reopening what the agent closes): answered, busy, failed, and the
   latency p50/p99 of the answered ones.

Figures only; nothing here asserts. Needs root for the attacker to run as
another user (nobody); otherwise it runs as the same user, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stats import fmt, percentile, table

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534


class BenchError(RuntimeError):
    """The benchmark could not measure; the message says what failed."""


def _env(checkout: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout)
    env.pop("NUMA_AGENT_RETRY_SECONDS", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """The checkout's real agent: affinity fallback, no hotplug, socket open to all
    (so that the attacker, another user, can connect)."""

    def __init__(self, checkout: Path, workdir: Path) -> None:
        self.checkout = checkout
        self.socket = str(workdir / "agent.sock")
        self.metrics_port = _free_port()
        # Where the attacker also squats: /metrics and PodResources (beside the socket).
        self.other_listeners = f"tcp:{self.metrics_port},unix:{workdir / 'pod-resources.sock'}"
        config = workdir / "config.toml"
        config.write_text('[agent]\nsocket_mode = "0666"\n')
        self.argv = [sys.executable, "-m", "numa_agent.cli.numa_agent", "serve", "--config", str(config),
                     "--state-dir", str(workdir / "state"), "--socket", self.socket,
                     "--metrics-address", f"127.0.0.1:{self.metrics_port}", "--no-hotplug",
                     "--cgroup-root", "none", "--log-level", "warning"]
        self.log = open(workdir / "agent.log", "ab")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Agent":
        self.proc = subprocess.Popen(self.argv, cwd=self.checkout, env=_env(self.checkout),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the agent of {self.checkout} exited with {self.proc.returncode}")
            status, _ = raw_request(self.socket, "GET", "/v1/health", timeout=2)
            if status == 200:
                return self
            time.sleep(0.05)
        raise BenchError(f"the agent of {self.checkout} did not answer in 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def raw_request(path: str, method: str, target: str, body: bytes = b"",
                timeout: float = 30) -> tuple[int, str]:
    """One exchange without any retry: (status, error code or ""); status 0
    when there was no HTTP answer."""
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall(head.encode() + b"\r\n" + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except OSError:
        return 0, "connection"
    finally:
        sock.close()
    raw = b"".join(chunks)
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    try:
        status = int(head_bytes.split(b" ")[1])
    except (IndexError, ValueError):
        return 0, "incomplete"
    code = ""
    if status >= 400:
        try:
            code = json.loads(payload)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = "?"
    return status, code


# ------------------------------------------------------------ 1. burst
def burst(agent: Agent, clients: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket, "--cpus", "1", "--", "true"]
    env = _env(agent.checkout)
    started = time.monotonic()
    procs = [subprocess.Popen(argv, cwd=agent.checkout, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(clients)]
    outcomes = {"admitted": 0, "capacity_refusal": 0, "busy": 0, "error": 0}
    met_busy, errors = 0, []
    for p in procs:
        _, err = p.communicate(timeout=120)
        if "is busy" in err:
            met_busy += 1
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if p.returncode == 0:
            outcomes["admitted"] += 1
        elif "busy" in last or "too many concurrent" in last:
            outcomes["busy"] += 1
        elif "refused" in err or "TopologyAffinityError" in err or "insufficient" in err:
            outcomes["capacity_refusal"] += 1
        else:
            outcomes["error"] += 1
            errors.append(last or f"exit {p.returncode}")
    return {"clients": clients, "outcomes": outcomes, "met_busy_on_the_way": met_busy,
            "seconds": time.monotonic() - started, "error_samples": errors[:3]}


# ------------------------------------------------------------ 2. slow and idle
ATTACKER = textwrap.dedent("""
    import os, resource, selectors, socket, sys, time
    path, slow, idle, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    uid = int(sys.argv[5])
    others = [t for t in sys.argv[6].split(",") if t] if len(sys.argv) > 6 else []
    if uid >= 0 and os.getuid() == 0:
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    def connect(kind, where=None):
        where = where or "unix:" + path
        tcp = where.startswith("tcp:")
        s = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", int(where[4:])) if tcp else where[5:])
        except OSError:
            s.close(); return
        s.setblocking(False)
        if kind == "slow":
            try: s.send(b"POST /v1/workloads HTTP/1.1\\r\\nContent-Length: 100\\r\\n\\r\\n{")
            except OSError: pass
        sel.register(s, selectors.EVENT_READ, (kind, where))
    for _ in range(slow): connect("slow")
    for _ in range(idle): connect("idle")
    for where in others:
        for _ in range(idle): connect("idle", where)
    print("ready", flush=True)
    end = time.monotonic() + seconds
    reopened = 0
    while time.monotonic() < end:
        for key, _ in sel.select(0.2):
            s = key.fileobj
            try: data = s.recv(4096)
            except OSError: data = b""
            if not data or data.startswith(b"HTTP/"):
                sel.unregister(s); s.close(); connect(*key.data); reopened += 1
    print("reopened", reopened, flush=True)
""")


def slow_and_idle(agent: Agent, slow: int, idle: int, requests: int) -> dict[str, Any]:
    uid = NOBODY if os.getuid() == 0 else -1
    attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, agent.socket, str(slow), str(idle),
                                 "600", str(uid), agent.other_listeners], stdout=subprocess.PIPE, text=True)
    try:
        assert attacker.stdout is not None
        if attacker.stdout.readline().strip() != "ready":
            raise BenchError("the attacker did not start")
        latencies, outcomes = [], {"answered": 0, "busy": 0, "error": 0}
        started = time.monotonic()
        for i in range(requests):
            method, target, body = (("GET", "/v1/health", b"") if i % 2 == 0 else
                                    ("POST", "/v1/workloads?dry_run=1", b'{"cpus": 1}'))
            t0 = time.perf_counter()
            status, code = raw_request(agent.socket, method, target, body)
            elapsed = time.perf_counter() - t0
            if status in (200, 201):
                outcomes["answered"] += 1
                latencies.append(elapsed * 1000)
            elif code == "busy":
                outcomes["busy"] += 1
            else:
                outcomes["error"] += 1
        seconds = time.monotonic() - started
    finally:
        attacker.terminate()
        attacker.wait(10)
    return {"slowloris": slow, "idle": idle, "attacker_uid": uid if uid >= 0 else os.getuid(),
            "requests": requests, "outcomes": outcomes, "seconds": seconds,
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99)}


def measure(checkout: Path, clients: int, requests: int, slow: int = 64, idle: int = 1000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-api-storm-") as tmp:
        os.chmod(tmp, 0o755)  # the attacker (nobody) reaches the socket
        workdir = Path(tmp)
        agent = Agent(checkout, workdir).start()
        try:
            rev = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
                                 capture_output=True, text=True).stdout.strip()[:60]
            return {"checkout": str(checkout), "revision": rev,
                    "burst": burst(agent, clients),
                    "slow_and_idle": slow_and_idle(agent, slow, idle, requests)}
        finally:
            agent.stop()


def render(reports: list[dict[str, Any]]) -> str:
    b_rows, s_rows = [], []
    for r in reports:
        b, s = r["burst"], r["slow_and_idle"]
        o = b["outcomes"]
        b_rows.append([r["checkout"], str(o["admitted"]), str(o["capacity_refusal"]), str(o["busy"]),
                       str(o["error"]), str(b["met_busy_on_the_way"]), fmt(b["seconds"], 1)])
        so = s["outcomes"]
        s_rows.append([r["checkout"], str(so["answered"]), str(so["busy"]), str(so["error"]),
                       fmt(s["p50_ms"], 1), fmt(s["p99_ms"], 1), fmt(s["seconds"], 1)])
    clients = reports[0]["burst"]["clients"]
    s0 = reports[0]["slow_and_idle"]
    lines = [f"{clients} concurrent `numa-run --cpus 1 -- true`:",
             table(["checkout", "admitted", "capacity refusal", "busy", "error", "met busy", "s"], b_rows),
             "", f"{s0['requests']} good requests with {s0['slowloris']} slowloris + {s0['idle']} idle "
                 f"connections open, and {s0['idle']} idle on /metrics and on PodResources "
                 f"(attacker uid {s0['attacker_uid']}):",
             table(["checkout", "answered", "busy", "error", "p50 ms", "p99 ms", "s"], s_rows)]
    for r in reports:
        lines.append(f"  {r['checkout']}: {r['revision']}")
        for e in r["burst"]["error_samples"]:
            lines.append(f"    error sample: {e}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench-api-storm", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", action="append", type=Path,
                   help="checkout whose agent and numa-run to measure (repeatable; default: this one)")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--slowloris", type=int, default=64)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if min(args.clients, args.requests) < 1 or min(args.slowloris, args.idle) < 0:
            raise BenchError("--clients and --requests must be at least 1, --slowloris and --idle at least 0")
        reports = [measure(c.resolve(), args.clients, args.requests, args.slowloris, args.idle)
                   for c in (args.checkout or [ROOT])]
    except BenchError as exc:
        print(f"bench-api-storm: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(reports, indent=1) if args.json else render(reports))
    return 0
