"""Admission cost against the number of live workloads, through the real API.

Starts a real agent (`numa-agent serve`, its own state directory, socket and
metrics port), fills it with N live workloads, each held by a real process
(a forked child that asks the agent for its workload through the HTTP client,
then execs `sleep`), and times admissions and releases of one more workload
through the same client, from a process that holds nothing else. Two modes:

- affinity: `--cgroup-root none`, the CPU-affinity fallback on this machine;
- simulated: `--sysfs-root SNAPSHOT`, a captured larger machine from
  tests/fixtures/sysfs with its simulated cgroup tree, where some of the
  fill and of the probes can be exclusive.

Each mode runs twice, with the kubelet interfaces on (the state files written
after every change, the PodResources gRPC server serving) and off
(`--kubelet-state-dir '' --pod-resources-socket ''`), unless `--kubelet`
picks one.

Prints p50/p99 per N, mode, kubelet setting and kind of probe, the ratio of
the largest N's figure to the smallest N's, and per N the p50 with the
kubelet interfaces on over off. `--profile` runs the agent under cProfile (only
while probes are timed) and prints its top functions. Figures only; nothing
here asserts a timing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import shutil
import signal
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stats import fmt, percentile, table

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests" / "fixtures" / "sysfs"
DEFAULT_COUNTS = (10, 100, 1000)
DEFAULT_SNAPSHOT = "arm64-kunpeng920-2s-4numa-clusters"
MODES = ("affinity", "simulated")
KINDS = ("shared", "exclusive")
# At most this many exclusive workloads (1 CPU each) in a simulated fill:
# a tenth of the fill, leaving CPUs free for the exclusive probes.
EXCLUSIVE_FILL_CAP = 64
# How long a holder sleeps if nothing stops it first (the benchmark kills
# its holders when it ends; this bounds what a crash would leave behind).
HOLD_SECONDS = 3600


class BenchError(RuntimeError):
    """The benchmark could not measure; the message says what failed."""


KUBELET = ("on", "off")
# What turns the kubelet interfaces off (on is the default: beside the socket, in the state directory).
KUBELET_OFF_ARGS = ("--kubelet-state-dir", "", "--pod-resources-socket", "")


@dataclass(frozen=True)
class Mode:
    name: str
    agent_args: tuple[str, ...]
    exclusive_fill_cap: int  # exclusive workloads among the fill, at most
    kinds: tuple[str, ...]  # kinds of probe timed
    kubelet: str = "on"  # the kubelet state files and PodResources server: "on" or "off"


@dataclass
class Row:
    mode: str
    kind: str
    workloads: int
    kubelet: str = "on"
    admit_ms: list[float] = field(default_factory=list)
    release_ms: list[float] = field(default_factory=list)
    exclusive_live: int = 0
    scrape_ms: list[float] = field(default_factory=list)  # GET /metrics at this live count

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "kind": self.kind, "workloads": self.workloads, "kubelet": self.kubelet,
                "exclusive_live": self.exclusive_live, "samples": len(self.admit_ms),
                "admit_p50_ms": percentile(self.admit_ms, 50),
                "admit_p99_ms": percentile(self.admit_ms, 99),
                "release_p50_ms": percentile(self.release_ms, 50),
                "release_p99_ms": percentile(self.release_ms, 99),
                **({"scrape_p50_ms": percentile(self.scrape_ms, 50),
                    "scrape_p99_ms": percentile(self.scrape_ms, 99)} if self.scrape_ms else {})}


# ---------------------------------------------------------------------------
# the agent


def extract_snapshot(name: str, into: Path) -> Path:
    archive = SNAPSHOTS / f"{name}.tar.gz"
    if not archive.is_file():
        known = ", ".join(sorted(p.name[:-len(".tar.gz")] for p in SNAPSHOTS.glob("*.tar.gz")))
        raise BenchError(f"no snapshot {name!r} in {SNAPSHOTS} (known: {known or 'none'})")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")
    return into / name


def modes(selected: Sequence[str], snapshot_root: Path | None,
          kinds: Sequence[str] = KINDS, kubelet: Sequence[str] = KUBELET) -> list[Mode]:
    out = []
    for name in selected:
        for setting in kubelet:
            extra = KUBELET_OFF_ARGS if setting == "off" else ()
            if name == "affinity":
                # 2 CPUs here: one reserved, one that an exclusive probe may take.
                out.append(Mode("affinity", ("--cgroup-root", "none", *extra), 0, tuple(kinds), setting))
            else:
                assert snapshot_root is not None
                out.append(Mode("simulated", ("--sysfs-root", str(snapshot_root), *extra), EXCLUSIVE_FILL_CAP,
                                tuple(kinds), setting))
    return out


# Run by the agent's interpreter instead of `-m numa_agent.cli.numa_agent`
# under --profile: every request the API handles while the flag file exists is
# profiled into the profile of the label the file holds; all are written out
# when the agent exits.
PROFILED_AGENT = """
import cProfile, os, sys, threading
out_dir, flag = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
from numa_agent.api import server
profiles, lock = {}, threading.Lock()
handle = server.ApiServer._handle
def profiled(self, *args):
    try:
        with open(flag) as f:
            label = f.read().strip()
    except OSError:
        return handle(self, *args)
    with lock:  # requests are serialised by the service anyway
        prof = profiles.setdefault(label, cProfile.Profile())
        prof.enable()
        try:
            return handle(self, *args)
        finally:
            prof.disable()
server.ApiServer._handle = profiled
from prometheus_client import exposition
bake = exposition._bake_output
def profiled_bake(*args, **kwargs):  # GET /metrics: collect and format, not the socket write
    return _profiled_call(bake, *args, **kwargs)
def _profiled_call(fn, *args, **kwargs):
    try:
        with open(flag) as f:
            label = f.read().strip()
    except OSError:
        return fn(*args, **kwargs)
    with lock:
        prof = profiles.setdefault(label, cProfile.Profile())
        prof.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            prof.disable()
exposition._bake_output = profiled_bake
from numa_agent.cli.numa_agent import main
try:
    code = main()
finally:
    for label, prof in profiles.items():
        prof.dump_stats(os.path.join(out_dir, label + ".pstats"))
sys.exit(code)
"""


def start_agent(workdir: Path, mode: Mode, profile_dir: Path | None):
    try:
        from tests.support.agent_process import AgentProcess
    except ImportError as exc:
        raise BenchError(f"needs a checkout with tests/support (to start the agent): {exc}") from None
    agent = AgentProcess(workdir, *mode.agent_args, "--log-level", "warning")
    if profile_dir is not None:
        module = agent.args.index("numa_agent.cli.numa_agent")
        agent.args[:module + 1] = [sys.executable, "-c", PROFILED_AGENT, str(profile_dir),
                                   str(profile_dir / "flag")]
    try:
        agent.start(timeout=60)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None
    return agent


# ---------------------------------------------------------------------------
# holders and probes


def holder_body(index: int, exclusive: bool) -> dict[str, Any]:
    name = f"hold-{index:05d}"
    body: dict[str, Any] = {"name": name, "command": ["sleep", str(HOLD_SECONDS)]}
    if exclusive:
        body["cpus"] = 1
    else:
        body["shared"] = True
    return body


def spawn_holder(socket_path: str, body: dict[str, Any], sleep: str) -> int:
    """A child that asks for `body` as itself, then execs sleep: the PID the
    agent pinned stays the workload's process. Returns its PID."""
    from numa_agent.api.client import request

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the benchmark
        code = 1
        try:
            os.close(r)
            status, answer = request(socket_path, "POST", "/v1/workloads", body)
            os.write(w, json.dumps({"status": status, "error": answer.get("error")})[:4000].encode())
            os.close(w)
            if status == 201:
                os.execv(sleep, [sleep, str(HOLD_SECONDS)])
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            try:
                os.write(w, json.dumps({"status": 0, "error": repr(exc)[:2000]}).encode())
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        answer = {"status": 0, "error": raw[:200].decode(errors="replace")}
    if answer.get("status") != 201:
        os.waitpid(pid, 0)
        raise BenchError(f"holder {body['name']} was not admitted: {answer}")
    return pid


def stop_holders(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    pids.clear()


def run_probes(socket_path: str, kind: str, samples: int, tag: str) -> tuple[list[float], list[float]]:
    """Time `samples` admissions and releases of one workload, from a forked
    child that holds nothing else (so no holder is pinned along with it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            result = _probe_loop(socket_path, kind, samples, tag)
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            result = {"error": repr(exc)[:2000]}
        try:
            os.write(w, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    os.waitpid(pid, 0)
    result = json.loads(raw or b'{"error": "the probe process printed nothing"}')
    if "error" in result:
        raise BenchError(f"{kind} probes failed: {result['error']}")
    return result["admit_ms"], result["release_ms"]


def _probe_loop(socket_path: str, kind: str, samples: int, tag: str) -> dict[str, Any]:
    from numa_agent.api.client import request

    admit_ms, release_ms = [], []
    for i in range(samples + 1):  # the first is an untimed warm-up
        body: dict[str, Any] = {"name": f"probe-{tag}-{i}", "command": ["probe"]}
        if kind == "exclusive":
            body["cpus"] = 1
        else:
            body["shared"] = True
        t0 = time.perf_counter_ns()
        status, answer = request(socket_path, "POST", "/v1/workloads", body)
        t1 = time.perf_counter_ns()
        if status != 201:
            return {"error": f"admission {i} answered {status}: {answer.get('error')}"}
        status, answer = request(socket_path, "DELETE", f"/v1/workloads/{body['name']}")
        t2 = time.perf_counter_ns()
        if status != 200:
            return {"error": f"release {i} answered {status}: {answer.get('error')}"}
        if i:
            admit_ms.append((t1 - t0) / 1e6)
            release_ms.append((t2 - t1) / 1e6)
    return {"admit_ms": admit_ms, "release_ms": release_ms}


class Progress:
    """One line on stderr, rewritten in place on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def say(self, text: str, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        print(("\r" + text.ljust(78)) if self.tty else text, end="\n" if final or not self.tty else "",
              file=sys.stderr, flush=True)


def exclusive_quota(mode: Mode, count: int) -> int:
    return min(count // 10, mode.exclusive_fill_cap)


def measure_mode(mode: Mode, counts: Sequence[int], samples: int, workdir: Path,
                 profile_dir: Path | None, progress: Progress) -> list[Row]:
    sleep = shutil.which("sleep")
    if sleep is None:
        raise BenchError("no `sleep` program on PATH to hold the workloads")
    agent = start_agent(workdir, mode, profile_dir)
    holders: list[int] = []
    exclusive = 0
    rows = []
    try:
        # The affinity fallback adopts processes that other numa-runs on this
        # machine started (NUMA_AGENT_WORKLOAD in their environment): counted
        # as live, and never re-pinned by an exclusive probe of ours.
        foreign = _live(agent)
        kinds = mode.kinds
        if foreign and mode.name == "affinity" and "exclusive" in kinds:
            kinds = tuple(k for k in kinds if k != "exclusive")
            progress.say(f"{mode.name}: the agent adopted {foreign} workload(s) of other programs on this "
                         "machine; no exclusive probes (they would re-pin those programs)", final=True)
        started = time.monotonic()
        for count in sorted(counts):
            quota = exclusive_quota(mode, count)
            while len(holders) < count:
                take = exclusive < quota
                holders.append(spawn_holder(agent.socket, holder_body(len(holders), take), sleep))
                exclusive += take
                progress.say(f"{mode.name}: filling {len(holders)}/{count} live workloads "
                             f"({time.monotonic() - started:.0f} s)")
            progress.say(f"{mode.name} (kubelet {mode.kubelet}): {count} live workloads ({exclusive} exclusive) after "
                         f"{time.monotonic() - started:.0f} s; timing probes", final=True)
            _check_live(agent, foreign + count)
            if profile_dir is not None:
                (profile_dir / "flag").write_text(f"{mode.name}-scrape-{count}")
            scrapes = time_scrapes(agent.metrics_port, samples)
            for kind in kinds:
                if profile_dir is not None:
                    (profile_dir / "flag").write_text(f"{mode.name}-{kind}-{count}")
                admit_ms, release_ms = run_probes(agent.socket, kind, samples, f"{kind}-{count}")
                (profile_dir / "flag").unlink() if profile_dir is not None else None
                rows.append(Row(mode.name, kind, foreign + count, mode.kubelet, admit_ms, release_ms, exclusive,
                                scrapes))
    finally:
        stop_holders(holders)
        agent.stop()
    return rows


def time_scrapes(port: int, samples: int) -> list[float]:
    """Milliseconds per GET /metrics (after one warm-up), the same live workloads held."""
    import urllib.request

    out = []
    for i in range(samples + 1):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            answer.read()
        if i:
            out.append((time.perf_counter() - started) * 1000)
    return out


def _live(agent) -> int:
    status, health = agent.call("GET", "/v1/health")
    if status != 200:
        raise BenchError(f"GET /v1/health answered {status}: {health}")
    return int(health.get("workloads") or 0)


def _check_live(agent, count: int) -> None:
    status, health = agent.call("GET", "/v1/health")
    live = health.get("workloads")
    if status != 200 or live != count:
        raise BenchError(f"the agent reports {live} live workloads, expected {count} "
                         f"(status {status}); agent log:\n{agent.log()[-2000:]}")


# ---------------------------------------------------------------------------
# report


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode and kind: largest N's p50/p99 over the smallest N's."""
    out = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["mode"], row["kind"], row.get("kubelet", "on")), []).append(row)
    for (mode, kind, kubelet), group in groups.items():
        group = sorted(group, key=lambda r: r["workloads"])
        low, high = group[0], group[-1]
        if low is high:
            continue
        entry: dict[str, Any] = {"mode": mode, "kind": kind, "kubelet": kubelet, "low": low["workloads"],
                                 "high": high["workloads"]}
        for key in ("admit_p50_ms", "admit_p99_ms", "release_p50_ms", "release_p99_ms",
                    "scrape_p50_ms", "scrape_p99_ms"):
            entry[key.replace("_ms", "_ratio")] = high[key] / low[key] if low.get(key) and key in high else None
        out.append(entry)
    return out


def kubelet_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode, kind and live count measured both ways: p50 (and p99) with the
    kubelet interfaces on over off."""
    pairs: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        pairs.setdefault((row["mode"], row["kind"], row["workloads"]), {})[row.get("kubelet", "on")] = row
    out = []
    for (mode, kind, live), pair in pairs.items():
        if set(pair) != {"on", "off"}:
            continue
        on, off = pair["on"], pair["off"]
        out.append({"mode": mode, "kind": kind, "workloads": live,
                    "admit_p50_on_ms": on["admit_p50_ms"], "admit_p50_off_ms": off["admit_p50_ms"],
                    "admit_p50_ratio": on["admit_p50_ms"] / off["admit_p50_ms"] if off["admit_p50_ms"] else None,
                    "admit_p99_ratio": on["admit_p99_ms"] / off["admit_p99_ms"] if off["admit_p99_ms"] else None,
                    "release_p50_ratio": (on["release_p50_ms"] / off["release_p50_ms"]
                                          if off["release_p50_ms"] else None)})
    return out


def top_functions(path: Path, limit: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("cumulative").print_stats(limit)
    out.write("\n")
    stats.sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def render(report: dict[str, Any]) -> str:
    rows = report["rows"]
    lines = [f"admission and release through the API, {report['samples']} probes per row "
             f"(after one warm-up); snapshot {report['snapshot']} for the simulated tree",
             table(["mode", "kubelet", "kind", "live", "excl", "admit p50 ms", "admit p99 ms",
                    "release p50 ms", "release p99 ms"],
                   [[r["mode"], r.get("kubelet", "on"), r["kind"], str(r["workloads"]), str(r["exclusive_live"]),
                     fmt(r["admit_p50_ms"], 2), fmt(r["admit_p99_ms"], 2),
                     fmt(r["release_p50_ms"], 2), fmt(r["release_p99_ms"], 2)] for r in rows])]
    if report["ratios"]:
        lines += ["", "largest over smallest live count:",
                  table(["mode", "kubelet", "kind", "live", "admit p50", "admit p99", "release p50", "release p99"],
                        [[r["mode"], r.get("kubelet", "on"), r["kind"], f"{r['high']}/{r['low']}",
                          *(fmt(r[k], 2) + "x" if r[k] is not None else "-"
                            for k in ("admit_p50_ratio", "admit_p99_ratio",
                                      "release_p50_ratio", "release_p99_ratio"))]
                         for r in report["ratios"]])]
        lines += ["", "GET /metrics per live count, and largest over smallest:",
                  table(["mode", "kubelet", "live", "scrape p50 ms", "scrape p99 ms"],
                        [[r["mode"], r.get("kubelet", "on"), str(r["workloads"]), fmt(r.get("scrape_p50_ms"), 2),
                          fmt(r.get("scrape_p99_ms"), 2)] for r in rows if r["kind"] == rows[0]["kind"]]),
                  table(["mode", "kubelet", "live", "scrape p50", "scrape p99"],
                        [[r["mode"], r.get("kubelet", "on"), f"{r['high']}/{r['low']}",
                          *(fmt(r[k], 2) + "x" if r.get(k) is not None else "-"
                            for k in ("scrape_p50_ratio", "scrape_p99_ratio"))]
                         for r in report["ratios"] if r["kind"] == rows[0]["kind"]])]
    if report.get("kubelet_ratios"):
        lines += ["", "kubelet interfaces (state files + PodResources gRPC) on over off, same run:",
                  table(["mode", "kind", "live", "admit p50 on ms", "admit p50 off ms", "admit p50",
                         "admit p99", "release p50"],
                        [[r["mode"], r["kind"], str(r["workloads"]), fmt(r["admit_p50_on_ms"], 2),
                          fmt(r["admit_p50_off_ms"], 2),
                          *(fmt(r[k], 2) + "x" if r[k] is not None else "-"
                            for k in ("admit_p50_ratio", "admit_p99_ratio", "release_p50_ratio"))]
                         for r in report["kubelet_ratios"]])]
    for label, text in report.get("profiles", {}).items():
        lines += ["", f"agent profile while timing {label}:", text]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-scale", description=(
        "Start a real agent, fill it with N live workloads held by sleeping processes, and time "
        "admissions and releases through the API per N, in the affinity fallback and on a "
        "simulated cgroup tree. Prints figures, asserts nothing."))
    p.add_argument("--counts", default=",".join(map(str, DEFAULT_COUNTS)),
                   help="live workload counts, comma-separated (default %(default)s)")
    p.add_argument("--samples", type=int, default=100, help="timed probes per row (default %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="affinity, simulated or both (default %(default)s)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="kinds of probe: shared, exclusive or both (default %(default)s)")
    p.add_argument("--kubelet", default=",".join(KUBELET),
                   help="run each mode with the kubelet state files and PodResources server on, off or both "
                        "(default %(default)s)")
    p.add_argument("--snapshot", default=DEFAULT_SNAPSHOT,
                   help="tests/fixtures/sysfs snapshot of the simulated mode (default %(default)s)")
    p.add_argument("--profile", action="store_true",
                   help="run the agent under cProfile while probes are timed; print its top functions "
                        "for the largest count")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    try:
        args.counts = sorted({int(c) for c in args.counts.split(",") if c.strip()})
    except ValueError:
        raise BenchError(f"--counts must be whole numbers separated by commas, got {args.counts!r}") from None
    if not args.counts or args.counts[0] < 1:
        raise BenchError("--counts needs at least one count, each at least 1")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown or not args.modes:
        raise BenchError(f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    args.kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown or not args.kinds:
        raise BenchError(f"--kinds: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(KINDS)}")
    args.kubelet = tuple(k.strip() for k in args.kubelet.split(",") if k.strip())
    unknown = sorted(set(args.kubelet) - set(KUBELET))
    if unknown or not args.kubelet:
        raise BenchError(f"--kubelet: unknown {', '.join(unknown) or '(none given)'}; choose from on, off")
    if args.samples < 1:
        raise BenchError(f"--samples must be at least 1, got {args.samples}")
    return args


def measure(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    rows: list[Row] = []
    profiles: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        base = Path(tmp)
        snapshot = extract_snapshot(args.snapshot, base / "snapshot") if "simulated" in args.modes else None
        for mode in modes(args.modes, snapshot, args.kinds, args.kubelet):
            run = f"{mode.name}-kubelet-{mode.kubelet}"
            profile_dir = None
            if args.profile:
                profile_dir = base / f"profile-{run}"
                profile_dir.mkdir()
            rows += measure_mode(mode, args.counts, args.samples, base / run, profile_dir, progress)
            if profile_dir is not None:
                for kind in (*mode.kinds, "scrape"):
                    path = profile_dir / f"{mode.name}-{kind}-{args.counts[-1]}.pstats"
                    profiles[f"{run}-{kind}-{args.counts[-1]}"] = \
                        top_functions(path) if path.is_file() else "(no profile written)"
    data = [r.to_json() for r in rows]
    return {"samples": args.samples, "snapshot": args.snapshot, "rows": data, "ratios": ratios(data),
            "kubelet_ratios": kubelet_ratios(data),
            **({"profiles": profiles} if profiles else {})}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        report = measure(args, Progress())
    except BenchError as exc:
        print(f"bench-scale: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0
