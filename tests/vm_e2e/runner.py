"""Host side of the end-to-end suite (`scripts/vm-e2e`): boots each shape once with the QEMU
harness, runs tests/vm_e2e/scenarios.py inside, and sums up. Standard library and
scripts/vmharness only, so it runs with the host's python3.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.vm_e2e.plan import DEFAULT_SHAPES, guest_module, planned, result_line, scenarios_of, skip_reason

REPO = Path(__file__).resolve().parents[2]
# A guest's scenarios may run this long, or PER_SCENARIO seconds for each scenario it
# runs when that is more: the 2node set (20 scenarios) took 15 minutes for 16 of them
# on a 2-CPU host busy with other work.
DEFAULT_TIMEOUT = 900.0
PER_SCENARIO = 75.0
_RESULT = re.compile(r"^(PASS|FAIL|SKIP) (\S+) (\S+)(?:: (.*))?$")


def parse_results(stdout: str, shape: str) -> dict[str, tuple[str, str]]:
    """scenario -> (status, reason), from the guest's result lines for `shape`."""
    found = {}
    for line in stdout.splitlines():
        m = _RESULT.match(line.strip())
        if m and m.group(3) == shape and m.group(2) in scenarios_of(shape):
            found[m.group(2)] = (m.group(1), m.group(4) or "")
    return found


NOT_SELECTED = "not selected (--scenario)"


def shape_results(shape: str, stdout: str, why_missing: str,
                  selected: tuple[str, ...] | None = None) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Every scenario's (name, status, reason) for one shape, and the lines the guest did not
    print itself: a planned scenario with no result line failed for `why_missing`, unless
    `--scenario` left it out (`selected`: the names chosen; None: all)."""
    got = parse_results(stdout, shape)
    results, extra_lines = [], []
    for scenario in scenarios_of(shape):
        if scenario in got:
            status, reason = got[scenario]
        elif selected is not None and scenario not in selected:
            status, reason = "SKIP", NOT_SELECTED
            extra_lines.append(result_line(status, scenario, shape, reason))
        elif scenario in planned(shape):
            status, reason = "FAIL", why_missing
            extra_lines.append(result_line(status, scenario, shape, reason))
        else:
            status, reason = "SKIP", skip_reason(shape)
            extra_lines.append(result_line(status, scenario, shape, reason))
        results.append((scenario, status, reason))
    return results, extra_lines


def ensure_venv() -> str | None:
    """The guest runs the repo's .venv (the guest's root is ours): make it here first."""
    done = subprocess.run(["bash", "-c", 'source "$1"', "bootstrap", str(REPO / "scripts" / "bootstrap.sh")],
                          capture_output=True, text=True)
    if done.returncode != 0 or not (REPO / ".venv" / "bin" / "python").exists():
        return f"cannot set up {REPO / '.venv'}: {' | '.join((done.stderr or done.stdout).strip().splitlines()[-3:])}"
    return None


WHEELHOUSE = REPO / ".cache" / "vm" / "wheelhouse"


def ensure_wheelhouse(directory: Path = WHEELHOUSE) -> str | None:
    """The wheels `scripts/install --wheelhouse` needs in a guest without network: the
    project's dependencies and build tools, fetched here (once per pyproject.toml)."""
    import hashlib
    import tomllib

    pyproject = (REPO / "pyproject.toml").read_bytes()
    stamp = directory / ".made-from"
    want = hashlib.sha256(pyproject).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want and any(directory.glob("*.whl")):
        return None
    project = tomllib.loads(pyproject.decode())
    wanted = [*project["build-system"]["requires"], "wheel", *project["project"]["dependencies"]]
    print(f"vm-e2e: fetching wheels for an offline install into {directory}", file=sys.stderr, flush=True)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pip", "download", "--quiet",
                           "--disable-pip-version-check", "--only-binary=:all:", "-d", str(directory), *wanted],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot fetch the wheels for the systemd guest: {' | '.join(done.stderr.strip().splitlines()[-3:])}"
    stamp.write_text(want + "\n")
    return None


def ensure_containerd() -> str | None:
    """containerd 1.7.24 and runc unpacked where the containerd guest looks for them
    (scripts/fetch-containerd; the guest has no network)."""
    from vmharness.build import default_cache_dir

    where = default_cache_dir() / "containerd"
    done = subprocess.run([str(REPO / "scripts" / "fetch-containerd"), str(where)], capture_output=True, text=True)
    for line in done.stderr.strip().splitlines():
        print(f"vm-e2e: {line}", file=sys.stderr, flush=True)
    if done.returncode != 0:
        return f"cannot fetch containerd for the containerd guest: scripts/fetch-containerd exited {done.returncode}"
    return None


def closing_line(passed: int, failed: int, skipped: int) -> str:
    return f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")


def main(argv: list[str] | None = None, *, run_in_guest=None, venv_check=ensure_venv,
         wheelhouse_check=ensure_wheelhouse, containerd_check=ensure_containerd) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/vm-e2e",
        description="Boot each machine shape once in QEMU and run the end-to-end scenarios inside: the real "
                    "agent on the real kernel, driven by the real numa-run.",
        epilog="Exit status 0 only when no scenario failed. Reports and agent logs land in --out-dir.")
    parser.add_argument("--shape", default=",".join(DEFAULT_SHAPES),
                        help=f"comma-separated shapes (default {','.join(DEFAULT_SHAPES)})")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"seconds the scenarios may run in one guest (default {DEFAULT_TIMEOUT:g}, "
                             f"or {PER_SCENARIO:g} for each scenario it runs when that is more)")
    parser.add_argument("--scenario", default="",
                        help="comma-separated scenario names: only these run (the others are reported SKIP); "
                             "a shape that plans none of them is not booted")
    parser.add_argument("--out-dir", default=str(REPO / ".cache" / "vm-e2e"),
                        help="host directory for report-<shape>.json and agent-<shape>.log "
                             "(default .cache/vm-e2e; emptied first)")
    args = parser.parse_args(argv)
    if run_in_guest is None:
        from vmharness import run_in_guest
    from vmharness import get_shape

    shapes = _shapes(parser, args.shape)
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    shapes, selected = _selected(parser, shapes, args.scenario)
    problem = venv_check() or (wheelhouse_check() if any(get_shape(s).boots_systemd for s in shapes) else None)
    if problem:
        print(f"vm-e2e: {problem}", file=sys.stderr)
        return 2

    # A runtime that cannot be fetched fails its own guest's scenarios, not the other shapes'.
    unfetched = containerd_check() if "containerd" in shapes else None
    if unfetched:
        print(f"vm-e2e: {unfetched}", file=sys.stderr, flush=True)

    out_root = Path(args.out_dir)
    totals = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    timings = []
    t_all = time.monotonic()
    for shape in shapes:
        out_dir = out_root / shape
        results, lines, timing = _run_shape(run_in_guest, shape, out_dir, selected, args.timeout,
                                            unfetched if shape == "containerd" else None)
        timings.append(timing)
        for line in lines:
            print(line, flush=True)
        for note in _notes(out_dir / f"report-{shape}.json"):
            print(f"vm-e2e: {shape} {note}", file=sys.stderr, flush=True)
        for _, status, _ in results:
            totals[status] += 1
    print(f"vm-e2e: timings: {'; '.join(timings)}; total {time.monotonic() - t_all:.1f} s; "
          f"reports in {out_root}", file=sys.stderr, flush=True)
    print(closing_line(totals["PASS"], totals["FAIL"], totals["SKIP"]), flush=True)
    return 1 if totals["FAIL"] else 0


def _run_shape(run_in_guest, shape: str, out_dir: Path, selected: tuple[str, ...] | None,
               timeout_arg: float | None, unfetched: str | None) -> tuple[list, list[str], str]:
    """Boot one shape and read its results: (results, lines to print, its timings entry).
    `unfetched`: why the shape's runtime is missing (it is not booted then)."""
    from vmharness import GuestError, SetupError

    t0 = time.monotonic()
    if unfetched:
        shutil.rmtree(out_dir, ignore_errors=True)  # no report of an earlier run stands for this one
    try:
        if unfetched:
            raise SetupError(f"not booted: {unfetched}")
        timeout = guest_timeout(shape, selected, timeout_arg)
        result = _boot_shape(run_in_guest, shape, timeout, out_dir, selected)
    except (GuestError, SetupError) as exc:
        # The guest never reached the command (or died): every planned scenario failed with its message.
        # What the guest reported before dying was streamed already; its report file keeps it.
        results, lines = shape_results(shape, _report_lines(out_dir / f"report-{shape}.json"),
                                       f"guest: {exc}", selected)
        return results, lines, f"{shape}: no result after {time.monotonic() - t0:.1f} s"
    stdout = result.stdout.decode("utf-8", "replace")
    if result.timed_out:
        why = f"no result: the scenarios did not finish within {timeout:g} s"
    else:
        why = f"no result: the scenario script exited {result.exit_code} before reaching it"
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        if tail:
            why += " (" + " | ".join(tail) + ")"
    results, lines = shape_results(shape, stdout, why, selected)
    for line in getattr(result, "peers", ()):  # how a shape's other guest ended
        print(f"vm-e2e: {shape} {line}", file=sys.stderr, flush=True)
    return results, lines, (f"{shape}: {result.total_seconds:.1f} s (boot {result.boot_seconds:.1f} s, "
                            f"scenarios {result.run_seconds:.1f} s{_scenario_times(out_dir / f'report-{shape}.json')})")


def _shapes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    from vmharness import ShapeError, get_shape

    shapes = [s.strip() for s in text.split(",") if s.strip()]
    if not shapes:
        parser.error("--shape names no shape")
    for shape in shapes:
        try:
            get_shape(shape)
        except ShapeError as exc:
            parser.error(str(exc))
    return shapes


def _selected(parser: argparse.ArgumentParser, shapes: list[str],
              text: str) -> tuple[list[str], tuple[str, ...] | None]:
    """The shapes to boot and the scenarios `--scenario` names (None: every planned one)."""
    selected = tuple(s.strip() for s in text.split(",") if s.strip()) or None
    if selected is None:
        return shapes, None
    unknown = sorted(set(selected) - {name for shape in shapes for name in scenarios_of(shape)})
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)} for shape(s) {', '.join(shapes)}")
    booted = [shape for shape in shapes if set(selected) & set(planned(shape))]
    if not booted:
        parser.error(f"no shape given plans {', '.join(selected)}")
    return booted, selected


def guest_timeout(shape: str, selected: tuple[str, ...] | None, given: float | None) -> float:
    """--timeout when given, else DEFAULT_TIMEOUT or PER_SCENARIO per scenario the guest runs."""
    if given is not None:
        return given
    runs = [s for s in planned(shape) if selected is None or s in selected]
    return max(DEFAULT_TIMEOUT, PER_SCENARIO * len(runs))


def _boot_shape(run_in_guest, shape: str, timeout: float, out_dir: Path, selected: tuple[str, ...] | None):
    """One guest run of the shape's scenarios (`selected`: only those); booted once more when
    the first guest hung before it reported a single scenario (seen under emulation: the guest
    kernel's timer stops and RCU stalls), which is the emulator's trouble, not a scenario's."""
    argv_guest = [str(REPO / ".venv" / "bin" / "python"), "-m", guest_module(shape), "--shape", shape]
    if selected is not None:
        argv_guest += ["--only", ",".join(s for s in selected if s in scenarios_of(shape))]

    def once():
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        return run_in_guest(shape, argv_guest, timeout, cwd=str(REPO), out_dir=str(out_dir), stream=True)

    result = once()
    if result.timed_out and not parse_results(result.stdout.decode("utf-8", "replace"), shape):
        print(f"vm-e2e: the {shape} guest reported no scenario within {timeout:g} s (a hung guest); "
              "booting it once more", file=sys.stderr, flush=True)
        result = once()
    return result


def _report_lines(report: Path) -> str:
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return ""
    return "\n".join(result_line(r["status"], r["scenario"], data["shape"], r.get("reason", ""))
                     for r in data.get("results", []))


def _notes(report: Path) -> list[str]:
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return []
    return [f"{r['scenario']}: {r['note']}" for r in data.get("results", []) if r.get("note")]


def _short(scenario: str) -> str:
    """`12-recovery` -> `12`; `systemd-restart` -> `restart`."""
    head, _, tail = scenario.partition("-")
    return head if head.isdigit() else tail or head


def _scenario_times(report: Path) -> str:
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return ""
    parts = [f"{_short(r['scenario'])}={r['seconds']:.1f}" for r in data.get("results", [])
             if r.get("status") != "SKIP"]
    return f"; agent start {data.get('setup_seconds', 0):.1f}, per scenario {' '.join(parts)}" if parts else ""
