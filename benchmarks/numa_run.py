"""numa-run start-up cost: wall time of `numa-run --shared -- true` against a
real agent, beside a bare interpreter start and `taskset`, plus what numa-run
imports. Prints figures only; nothing here asserts a timing.
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
# The same thing the console script does, so -X importtime sees its imports.
CONSOLE_EQUIVALENT = "import sys; from numa_agent.cli.numa_run import main; sys.exit(main())"


class BenchError(RuntimeError):
    """The benchmark could not measure; the message says what failed."""


@dataclass(frozen=True)
class Command:
    name: str
    argv: tuple[str, ...]


def commands(socket_path: str) -> list[Command]:
    """numa-run both ways (console script when this interpreter has one), a
    bare interpreter, and taskset."""
    py = sys.executable
    out = []
    script = Path(sys.executable).parent / "numa-run"
    if script.is_file() and os.access(script, os.X_OK):
        out.append(Command("numa-run (console script)",
                           (str(script), "--socket", socket_path, "--shared", "--", "true")))
    out.append(Command("python -m numa_agent.cli.numa_run",
                       (py, "-m", "numa_agent.cli.numa_run", "--socket", socket_path, "--shared", "--", "true")))
    out.append(Command("python3 -I -S -c pass", (py, "-I", "-S", "-c", "pass")))
    taskset = shutil.which("taskset")
    if taskset:
        out.append(Command("taskset -c 0 true", (taskset, "-c", "0", "true")))
    return out


def child_env() -> dict[str, str]:
    """From a checkout, make `agent` importable whatever the working directory."""
    env = dict(os.environ)
    if (ROOT / "numa_agent" / "__init__.py").is_file():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def time_command(cmd: Command, runs: int, env: dict[str, str]) -> list[float]:
    """Wall milliseconds of `runs` runs after one untimed warm-up run."""
    samples = []
    for i in range(runs + 1):
        t0 = time.perf_counter_ns()
        proc = subprocess.run(cmd.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        elapsed = (time.perf_counter_ns() - t0) / 1e6
        if proc.returncode != 0:
            raise BenchError(f"{cmd.name} exited with {proc.returncode}: "
                             f"{proc.stderr.decode(errors='replace').strip()[-500:]}")
        if i:
            samples.append(elapsed)
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


def import_profile(socket_path: str, env: dict[str, str], top: int = 10) -> dict[str, Any]:
    argv = [sys.executable, "-X", "importtime", "-c", CONSOLE_EQUIVALENT,
            "--socket", socket_path, "--shared", "--", "true"]
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    if proc.returncode != 0:
        raise BenchError(f"numa-run under -X importtime exited with {proc.returncode}: "
                         f"{proc.stderr.strip()[-500:]}")
    rows = parse_importtime(proc.stderr)
    if not rows:
        raise BenchError("python -X importtime printed no import lines")
    return {"modules": len(rows),
            "total_self_ms": sum(r["self_us"] for r in rows) / 1000,
            "top": sorted(rows, key=lambda r: (-r["cumulative_us"], r["module"]))[:top]}


def start_agent(workdir: Path):
    """The real agent on this machine: no cgroup writes, no hotplug."""
    try:
        from tests.support.agent_process import AgentProcess
    except ImportError as exc:
        raise BenchError(f"needs a checkout with tests/support (to start the agent): {exc}") from None
    # A later --log-level wins over AgentProcess's debug default.
    return AgentProcess(workdir, "--cgroup-root", "none", "--log-level", "warning")


def measure(runs: int) -> dict[str, Any]:
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="bench-numa-run-") as tmp:
        agent = start_agent(Path(tmp))
        try:
            agent.start()
            results = []
            for cmd in commands(agent.socket):
                samples = time_command(cmd, runs, env)
                results.append({"name": cmd.name, "argv": list(cmd.argv), "runs": len(samples),
                                "median_ms": statistics.median(samples),
                                "p90_ms": percentile(samples, 90)})
            imports = import_profile(agent.socket, env)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None
        finally:
            agent.stop()
    by_name = {r["name"]: r["median_ms"] for r in results}
    ratios = {}
    for name in ("numa-run (console script)", "python -m numa_agent.cli.numa_run"):
        if name in by_name:
            for base in ("python3 -I -S -c pass", "taskset -c 0 true"):
                if base in by_name and by_name[base] > 0:
                    ratios[f"{name} / {base}"] = by_name[name] / by_name[base]
    return {"runs": runs, "commands": results, "ratios": ratios, "imports": imports}


def render(report: dict[str, Any]) -> str:
    lines = [f"wall time over {report['runs']} runs each (after one warm-up run):",
             table(["command", "median ms", "p90 ms"],
                   [[c["name"], fmt(c["median_ms"], 2), fmt(c["p90_ms"], 2)] for c in report["commands"]]),
             "", "ratios of medians:"]
    lines += [f"  {name}: {ratio:.1f}x" for name, ratio in report["ratios"].items()]
    imp = report["imports"]
    lines += ["", f"numa-run imports {imp['modules']} modules ({imp['total_self_ms']:.1f} ms of import "
                  f"time in all); top 10 by cumulative time:",
              table(["module", "cumulative ms", "self ms"],
                    [[r["module"], fmt(r["cumulative_us"] / 1000, 2), fmt(r["self_us"] / 1000, 2)]
                     for r in imp["top"]])]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-numa-run", description=(
        "Start a real agent and measure the wall time of `numa-run --shared -- true` against "
        "`python3 -I -S -c pass` and `taskset -c 0 true`; list numa-run's slowest imports. "
        "Prints figures, asserts nothing."))
    p.add_argument("--runs", type=int, default=20, help="timed runs per command (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    if args.runs < 1:
        raise BenchError(f"--runs must be at least 1, got {args.runs}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        report = measure(args.runs)
    except BenchError as exc:
        print(f"bench-numa-run: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0
