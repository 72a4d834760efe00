"""numa-run start-up cost: wall time of `numa-run --cpus 1 -- true` and
`numa-run --shared -- true` against a real agent, beside the same venv's
`python -c pass`, a bare `python -I -S -c pass` and `taskset`, plus what
numa-run imports on each launch. A floor line measures the least any Python
launcher pays for the exclusive launch (FLOOR_CODE): the fastest interpreter
start, one admission over the raw socket, exec.

By default numa-run is measured as users get it: a wheel built from this
checkout, with its dependencies, installed (with its compiled .pyc) by a fresh
venv's own pip (the one ensurepip gives it, which writes bin/ as users' pip
does), so the editable install's import finder is not counted. The dependencies'
wheels come from the configured index or pip's cache, or with `--wheelhouse DIR`
from DIR alone, offline, as scripts/install takes them. `--install checkout`
measures the checkout's own venv instead. The agent runs in its affinity
fallback (this host's: numa-run sets the memory binding, so ctypes is loaded)
or, with `--agent simulated`, on a written machine as a cgroup would confine
the launch (numa-run sets nothing). Prints figures only; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stats import fmt, percentile, table

ROOT = Path(__file__).resolve().parent.parent
# What the installed bin/numa-run does, for an install without it (-X importtime sees its imports).
SCRIPT_EQUIVALENT = "import sys; from numa_agent.cli.numa_run import main; sys.exit(main())"
# The modules the common launch should not load (docs/numa-run.md, start-up cost).
WATCHED = ("re", "ctypes", "argparse", "enum", "dataclasses")
EXCLUSIVE = "numa-run --cpus 1 -- true"
SHARED = "numa-run --shared -- true"
PYTHON = "python -c pass"
BARE = "python -I -S -c pass"
TASKSET = "taskset -c 0 true"
FLOOR = "floor: python -I -S, admit + exec"
# The least any Python launcher does for `--cpus 1 -- true`: the fastest interpreter
# start, one admission over the raw socket, exec. No parsing, no checks, no output:
# what numa-run could not go below while it is Python.
FLOOR_CODE = """\
import _socket, os, sys
body = b'{"cpus":1,"command":["true"],"request_id":"%s"}' % os.urandom(16).hex().encode()
s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"POST /v1/workloads HTTP/1.1\\r\\nHost: numa-agent\\r\\nConnection: close\\r\\n"
          b"Content-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
answer = b""
while chunk := s.recv(65536):
    answer += chunk
if not answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 201")):
    sys.exit(answer[:300].decode(errors="replace"))
os.execvp("true", ["true"])
"""
INSTALLS = ("wheel", "checkout")
AGENTS = ("affinity", "simulated")


class BenchError(RuntimeError):
    """The benchmark could not measure; the message says what failed."""


@dataclass(frozen=True)
class Command:
    name: str
    argv: tuple[str, ...]
    exclusive: bool = False  # books a CPU: wait for its release before the next run


@dataclass(frozen=True)
class Install:
    """Where numa-run is measured from: its venv's interpreter and console script, and
    the environment and directory its children run with."""
    kind: str
    python: str
    script: str | None
    env: dict[str, str]
    cwd: str


def commands(socket_path: str, install: Install) -> list[Command]:
    """numa-run exclusive and shared (the console script, else python -m), the same
    venv's bare interpreter start with and without site, the floor (FLOOR_CODE) and
    taskset."""
    py = install.python
    if install.script:
        launcher: tuple[str, ...] = (install.script,)
    else:
        launcher = (py, "-m", "numa_agent.cli.numa_run")
    out = [Command(EXCLUSIVE, (*launcher, "--socket", socket_path, "--cpus", "1", "--", "true"), True),
           Command(SHARED, (*launcher, "--socket", socket_path, "--shared", "--", "true")),
           Command(PYTHON, (py, "-c", "pass")),
           Command(BARE, (py, "-I", "-S", "-c", "pass")),
           Command(FLOOR, (py, "-I", "-S", "-c", FLOOR_CODE, socket_path), True)]
    taskset = shutil.which("taskset")
    if taskset:
        out.append(Command(TASKSET, (taskset, "-c", "0", "true")))
    return out


def checkout_install() -> Install:
    """This interpreter (the checkout's venv); the checkout importable from anywhere."""
    env = dict(os.environ)
    if (ROOT / "numa_agent" / "__init__.py").is_file():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    script = Path(sys.executable).parent / "numa-run"
    usable = script.is_file() and os.access(script, os.X_OK)
    return Install("checkout", sys.executable, str(script) if usable else None, env, str(ROOT))


# What the wheel is built from (scripts/install's BUILD_INPUTS): a copy, so the checkout
# gets no build/ or .egg-info litter.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "numa_agent", "bin", "systemd", "docs/man",
                "completions", "oci", "contrib/slurm")


def wheel_install(workdir: Path, wheelhouse: Path | None = None) -> Install:
    """A wheel of this checkout and its dependencies' wheels, installed into a fresh venv by
    that venv's own pip (ensurepip's, offline) with --no-deps --no-index: bin/ and the .pyc
    as a user's install makes them. The dependencies come from `wheelhouse` alone when given
    (offline), else from the checkout's pip configuration and cache."""
    src, wheels, venv = workdir / "src", workdir / "wheels", workdir / "venv"
    print("bench-numa-run: building wheels of the checkout and its dependencies, installing them "
          "in a fresh venv...", file=sys.stderr)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        elif path.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    source = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []
    _run_step([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation",
               "--disable-pip-version-check", *source, "-w", str(wheels), str(src)])
    if not list(wheels.glob("numa_agent-*.whl")):
        raise BenchError(f"pip wheel made no numa_agent wheel in {wheels}")
    _run_step([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run_step([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
               "--disable-pip-version-check", *map(str, sorted(wheels.glob("*.whl")))])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return Install("wheel", str(python), str(venv / "bin" / "numa-run"), env, str(workdir))


def _run_step(argv: Sequence[str]) -> None:
    proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}): {proc.stdout.strip()[-500:]}")


def time_commands(cmds: Sequence[Command], runs: int, install: Install,
                  settle=lambda: None) -> list[list[float]]:
    """Wall milliseconds of `runs` runs of each command, after one untimed warm-up round;
    the commands take turns, one run each a round, so a machine whose load changes
    weighs on all of them alike (the ratios are of the same moments). `settle` (untimed)
    runs after each exclusive one, until the agent has released its CPU."""
    samples: list[list[float]] = [[] for _ in cmds]
    for i in range(runs + 1):
        for cmd, taken in zip(cmds, samples, strict=True):
            t0 = time.perf_counter_ns()
            proc = subprocess.run(cmd.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=install.env, cwd=install.cwd)
            elapsed = (time.perf_counter_ns() - t0) / 1e6
            if proc.returncode != 0:
                raise BenchError(f"{cmd.name} exited with {proc.returncode}: "
                                 f"{proc.stderr.decode(errors='replace').strip()[-500:]}")
            if i:
                taken.append(elapsed)
            if cmd.exclusive:
                settle()
    return samples


def parse_importtime(stderr: str) -> list[dict[str, Any]]:
    """Rows of `python -X importtime` output: module, self_us, cumulative_us
    (cumulative includes the modules a module imported itself)."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = line[len("import time:"):].split("|")
        if len(fields) != 3:
            continue
        try:
            self_us, cumulative_us = int(fields[0]), int(fields[1])
        except ValueError:
            continue  # the header line
        rows.append({"module": fields[2].strip(), "self_us": self_us, "cumulative_us": cumulative_us})
    return rows


def import_profile(socket_path: str, install: Install, launch: Sequence[str] = ("--cpus", "1"),
                   top: int = 10) -> dict[str, Any]:
    """numa-run's imports on `numa-run LAUNCH -- true` under `python -X importtime`, the
    installed file's own included (the slowest `top` by cumulative time, and which of
    WATCHED were loaded). An exclusive launch books a CPU: the caller waits for its release."""
    program = [install.script] if install.script else ["-c", SCRIPT_EQUIVALENT]
    argv = [install.python, "-X", "importtime", *program, "--socket", socket_path, *launch, "--", "true"]
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=install.env,
                          cwd=install.cwd, text=True)
    if proc.returncode != 0:
        raise BenchError(f"numa-run under -X importtime exited with {proc.returncode}: "
                         f"{proc.stderr.strip()[-500:]}")
    rows = parse_importtime(proc.stderr)
    if not rows:
        raise BenchError("python -X importtime printed no import lines")
    loaded = {r["module"] for r in rows}
    return {"modules": len(rows),
            "total_self_ms": sum(r["self_us"] for r in rows) / 1000,
            "watched": [m for m in WATCHED if m in loaded],
            "top": sorted(rows, key=lambda r: (-r["cumulative_us"], r["module"]))[:top]}


def start_agent(workdir: Path, kind: str = "affinity"):
    """The real agent, no hotplug: on this machine without cgroup writes (its affinity
    fallback), or `simulated` on a written 4-node machine with a simulated cgroup tree."""
    try:
        from tests.support.agent_process import AgentProcess
        from tests.support.synthetic import make_topology
        from tests.support.sysfs_writer import write_sysfs
    except ImportError as exc:
        raise BenchError(f"needs a checkout with tests/support (to start the agent): {exc}") from None
    # A later --log-level wins over AgentProcess's debug default.
    if kind == "simulated":
        topology = make_topology(sockets=2, nodes_per_socket=2, cores_per_node=4, threads_per_core=2,
                                 memory_per_node_bytes=16 << 30)
        machine = write_sysfs(topology, workdir / "machine")
        return AgentProcess(workdir, "--sysfs-root", str(machine), "--log-level", "warning")
    return AgentProcess(workdir, "--cgroup-root", "none", "--log-level", "warning")


def wait_released(agent, timeout: float = 5.0) -> None:
    """Until the agent holds no workload (a numa-run's `true` has exited and been released)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, body = agent.call("GET", "/v1/workloads")
        if not body.get("workloads"):
            return
        time.sleep(0.002)
    raise BenchError(f"the agent still holds workloads {timeout:g} s after numa-run exited")


def measure(runs: int, install_kind: str = "wheel", agent_kind: str = "affinity",
            wheelhouse: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-numa-run-") as tmp:
        install = wheel_install(Path(tmp), wheelhouse) if install_kind == "wheel" else checkout_install()
        agent = start_agent(Path(tmp) / "agent", agent_kind)
        try:
            agent.start()
            cmds = commands(agent.socket, install)
            timed = time_commands(cmds, runs, install, settle=lambda: wait_released(agent))
            results = [{"name": cmd.name, "argv": list(cmd.argv), "runs": len(samples),
                        "median_ms": statistics.median(samples), "p90_ms": percentile(samples, 90)}
                       for cmd, samples in zip(cmds, timed, strict=True)]
            imports = {}
            for name, launch in ((EXCLUSIVE, ("--cpus", "1")), (SHARED, ("--shared",))):
                imports[name] = import_profile(agent.socket, install, launch)
                wait_released(agent)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None
        finally:
            agent.stop()
    by_name = {r["name"]: r["median_ms"] for r in results}
    ratios = {}
    for name in (EXCLUSIVE, SHARED, FLOOR):
        for base in (PYTHON, BARE, TASKSET):
            if name in by_name and by_name.get(base, 0) > 0:
                ratios[f"{name} / {base}"] = by_name[name] / by_name[base]
    return {"install": install.kind, "agent": agent_kind, "python": sys.version.split()[0], "runs": runs,
            "commands": results, "ratios": ratios, "imports": imports}


def render(report: dict[str, Any]) -> str:
    lines = [f"numa-run from a {report['install']} install (Python {report['python']}), agent "
             f"{report['agent']}; wall time over {report['runs']} runs each, the commands in turn "
             "(after one warm-up round):",
             table(["command", "median ms", "p90 ms"],
                   [[c["name"], fmt(c["median_ms"], 2), fmt(c["p90_ms"], 2)] for c in report["commands"]]),
             "", "ratios of medians:"]
    lines += [f"  {name}: {ratio:.2f}x" for name, ratio in report["ratios"].items()]
    lines += ["", f"{FLOOR!r} is the least a launcher written in Python pays: the fastest interpreter "
                  "start, one admission, exec; numa-run's figures above it are its own."]
    for name, imp in report["imports"].items():
        watched = ", ".join(imp["watched"]) or "none"
        lines += ["", f"{name} imports {imp['modules']} modules ({imp['total_self_ms']:.1f} ms of import "
                      f"time in all; of {', '.join(WATCHED)}: {watched}); top {len(imp['top'])} by "
                      "cumulative time:",
                  table(["module", "cumulative ms", "self ms"],
                        [[r["module"], fmt(r["cumulative_us"] / 1000, 2), fmt(r["self_us"] / 1000, 2)]
                         for r in imp["top"]])]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-numa-run", description=(
        "Start a real agent and measure the wall time of `numa-run --cpus 1 -- true` and "
        "`numa-run --shared -- true` against the same venv's `python -c pass`, "
        "`python -I -S -c pass`, the floor of a Python launcher (admit + exec only) and "
        "`taskset -c 0 true`; list numa-run's slowest imports. "
        "Prints figures, asserts nothing."))
    p.add_argument("--runs", type=int, default=20, help="timed runs per command (default %(default)s)")
    p.add_argument("--install", choices=INSTALLS, default="wheel",
                   help="wheel: wheels of the checkout and its dependencies installed by a fresh venv's "
                        "own pip, as users get it (default); checkout: the checkout's own venv")
    p.add_argument("--wheelhouse", type=Path, metavar="DIR",
                   help="take the dependencies' wheels from DIR alone, offline (as scripts/install "
                        "--wheelhouse); default: the configured index and pip's cache")
    p.add_argument("--agent", choices=AGENTS, default="affinity",
                   help="affinity: the agent's fallback on this machine, numa-run sets the memory "
                        "binding (default); simulated: a written machine, confined as by a cgroup, "
                        "numa-run sets nothing")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    if args.runs < 1:
        raise BenchError(f"--runs must be at least 1, got {args.runs}")
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        raise BenchError(f"--wheelhouse {args.wheelhouse} is not a directory")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        report = measure(args.runs, args.install, args.agent, args.wheelhouse)
    except BenchError as exc:
        print(f"bench-numa-run: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0
