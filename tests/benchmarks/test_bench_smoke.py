"""Smoke tests for the benchmark scripts: each runs on its smallest setting
and its output parses with the promised structure. Figures are never
compared with a time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import admission, numa_run

ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {"numa_nodes", "cpus", "providers", "p50_ms", "p99_ms",
            "baseline_p50_ms", "baseline_p99_ms", "ratio"}


def run_script(name, *args, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_bench_admission_json_rows_on_the_smallest_machine():
    r = run_script("bench-admission", "--json", "--sizes", "2", "--requests", "5")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["numa_nodes"], row["policy"]) for row in rows] == [(2, "best-effort"),
                                                                    (2, "single-numa-node")]
    for row in rows:
        assert ROW_KEYS <= set(row)
        assert row["cpus"] == 64 and row["providers"] == 4
        assert row["requests"] == 5 == row["admitted"] + row["refused"]
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        # 2 nodes: the cross product is small, so the baseline runs on every request
        assert row["baseline_requests"] == 5
        assert 0 < row["baseline_p50_ms"] <= row["baseline_p99_ms"]
        assert row["ratio"] > 0
        assert row["baseline_disagreements"] == 0  # the fast merge agrees with the kubelet's
        assert row["target_p99_ms"] is None and row["meets_target"] is None


def test_bench_admission_table_names_the_columns_and_targets():
    rows = [admission.run_row(8, "single-numa-node", admission.request_sequence(3, 7), 7,
                              None, 0, 0).to_json()]
    text = admission.render_table(rows)
    header = text.splitlines()[0].split()
    assert header[:3] == ["nodes", "cpus", "policy"]
    # the 8-node target is printed beside the figures
    assert f"<{admission.TARGET_P99_MS[8]:g}" in text.splitlines()[1]
    assert rows[0]["baseline_p50_ms"] is None and rows[0]["ratio"] is None
    assert "baseline not requested" in text


def test_bench_admission_says_why_the_baseline_was_skipped():
    cost = admission.CostModel(per_fit_s=1.0, per_combo_s=1.0)  # everything looks too slow
    row = admission.run_row(2, "best-effort", admission.request_sequence(3, 1), 1, cost, 2.0, 30.0)
    data = row.to_json()
    assert data["baseline_p50_ms"] is None and data["baseline_requests"] == 0
    assert data["baseline_note"].startswith("skipped on 3 of 3 requests: 3 over the 2 s bound (worst: ")


def test_bench_admission_says_when_the_baseline_budget_ran_out():
    cost = admission.CostModel(per_fit_s=1e-9, per_combo_s=1e-9)
    row = admission.run_row(2, "best-effort", admission.request_sequence(3, 1), 1, cost, 2.0, 0.0)
    data = row.to_json()
    assert data["baseline_requests"] == 0
    assert data["baseline_note"] == ("skipped on 3 of 3 requests: "
                                     "3 after the row's 0 s baseline budget was spent")


def test_machine_shapes_match_the_brief():
    for nodes, cpus in ((2, 64), (8, 256), (16, 256), (32, 512), (64, 1024)):
        topo = admission.build(nodes, "best-effort").topology
        assert len(topo.numa_nodes) == nodes and len(topo.cpus) == cpus
    machine = admission.build(8, "best-effort")
    assert machine.devices.names == ("gpu", "nic")
    assert len(machine.devices.devices("gpu")) == 8 and len(machine.devices.devices("nic")) == 8


@pytest.mark.parametrize("args, message", [
    (["--sizes", "two"], "--sizes: 'two' is not a comma-separated list"),
    (["--sizes", "0,8"], "every size must be between 1 and 64"),
    (["--sizes", "128"], "every size must be between 1 and 64"),
    (["--requests", "0"], "--requests must be at least 1, got 0"),
    (["--policies", "strict"], "unknown topology policy 'strict'"),
    (["--profile", "99"], "every size must be between 1 and 64"),
])
def test_bench_admission_bad_settings_exit_2_with_a_clear_message(args, message, capsys):
    assert admission.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench-admission: ") and message in err


def test_machine_shape_refuses_an_empty_machine():
    with pytest.raises(admission.BenchError, match="at least 1 NUMA node, got 0"):
        admission.machine_shape(0)


needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                    reason="the live agent needs 2 CPUs: one reserved, one to hand out")


@needs_two_cpus
def test_bench_numa_run_json_on_one_run():
    # The checkout's venv: the default wheel install builds a wheel, too slow for every run.
    r = run_script("bench-numa-run", "--json", "--runs", "1", "--install", "checkout")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["install"] == "checkout"
    names = [c["name"] for c in report["commands"]]
    assert names[:5] == [numa_run.EXCLUSIVE, numa_run.SHARED, numa_run.PYTHON, numa_run.BARE, numa_run.FLOOR]
    for c in report["commands"]:
        assert c["runs"] == 1 and 0 < c["median_ms"] <= c["p90_ms"]
    for launch in (numa_run.EXCLUSIVE, numa_run.SHARED, numa_run.FLOOR):
        for base in (numa_run.PYTHON, numa_run.BARE):
            assert f"{launch} / {base}" in report["ratios"]
    assert report["agent"] == "affinity"
    assert sorted(report["imports"]) == sorted([numa_run.EXCLUSIVE, numa_run.SHARED])
    for imports in report["imports"].values():
        assert 0 < len(imports["top"]) <= 10 and imports["modules"] >= len(imports["top"])
        cumulative = [m["cumulative_us"] for m in imports["top"]]
        assert cumulative == sorted(cumulative, reverse=True)
        assert set(imports["watched"]) <= set(numa_run.WATCHED)


@needs_two_cpus
def test_bench_numa_run_stops_the_agent_when_a_command_fails(monkeypatch):
    started = []
    real_start = numa_run.start_agent

    def recording_start(workdir, kind="affinity"):
        started.append(real_start(workdir, kind))
        return started[-1]

    monkeypatch.setattr(numa_run, "start_agent", recording_start)
    monkeypatch.setattr(numa_run, "commands", lambda sock, install: [numa_run.Command("false", ("false",))])
    with pytest.raises(numa_run.BenchError, match="false exited with 1"):
        numa_run.measure(1, "checkout")
    assert started and started[0].proc.poll() is not None


def test_bench_numa_run_bad_runs_exit_2(capsys):
    assert numa_run.main(["--runs", "0"]) == 2
    assert "bench-numa-run: --runs must be at least 1, got 0" in capsys.readouterr().err


def test_bench_numa_run_times_the_commands_in_turn(monkeypatch):
    """A round runs each command once, so a load that comes and goes weighs on all alike."""
    ran, settled = [], []

    def fake_run(argv, **kwargs):
        ran.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(numa_run.subprocess, "run", fake_run)
    cmds = [numa_run.Command("a", ("a",), exclusive=True), numa_run.Command("b", ("b",))]
    samples = numa_run.time_commands(cmds, 2, numa_run.checkout_install(), settle=lambda: settled.append(1))
    assert ran == ["a", "b"] * 3  # one warm-up round, then two timed
    assert [len(s) for s in samples] == [2, 2] and len(settled) == 3


def test_bench_numa_run_refuses_a_wheelhouse_that_is_no_directory(capsys, tmp_path):
    assert numa_run.main(["--wheelhouse", str(tmp_path / "absent")]) == 2
    assert f"bench-numa-run: --wheelhouse {tmp_path / 'absent'} is not a directory" in capsys.readouterr().err


@needs_two_cpus
def test_bench_numa_run_profiles_the_installed_file_against_a_simulated_agent(tmp_path):
    """The import profile runs bin/numa-run itself (what it imports counts), here against
    an agent that confines as a cgroup would: numa-run sets no memory policy."""
    agent = numa_run.start_agent(tmp_path / "agent", "simulated")
    try:
        agent.start()
        install = numa_run.checkout_install()
        assert install.script and install.script.endswith("/numa-run")
        for launch in (("--shared",), ("--cpus", "1")):
            profile = numa_run.import_profile(agent.socket, install, launch)
            numa_run.wait_released(agent)
            assert "ctypes" not in profile["watched"] and "argparse" not in profile["watched"]
    finally:
        agent.stop()


def test_importtime_lines_parse_and_failures_are_reported(monkeypatch):
    text = ("import time: self [us] | cumulative | imported package\n"
            "import time:       120 |        120 |   _io\n"
            "import time:      2000 |       5000 | numa_agent.cli.common\n")
    assert numa_run.parse_importtime(text) == [
        {"module": "_io", "self_us": 120, "cumulative_us": 120},
        {"module": "numa_agent.cli.common", "self_us": 2000, "cumulative_us": 5000}]

    def fake_run(rc, stderr):
        return lambda *a, **kw: subprocess.CompletedProcess(a, rc, "", stderr)

    install = numa_run.checkout_install()
    monkeypatch.setattr(numa_run.subprocess, "run", fake_run(0, "no imports here\n"))
    with pytest.raises(numa_run.BenchError, match="printed no import lines"):
        numa_run.import_profile("/nonexistent.sock", install)
    monkeypatch.setattr(numa_run.subprocess, "run", fake_run(125, "numa-run: agent unreachable"))
    with pytest.raises(numa_run.BenchError, match="exited with 125: numa-run: agent unreachable"):
        numa_run.import_profile("/nonexistent.sock", install)


def test_bench_numa_run_without_the_test_support_says_it_needs_a_checkout(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tests.support.agent_process", None)  # import fails
    with pytest.raises(numa_run.BenchError, match="needs a checkout with tests/support"):
        numa_run.start_agent(tmp_path)


def test_bench_intruders_starts_its_threads_sees_them_and_cleans_up():
    r = run_script("bench-intruders", "--json", "--tasks", "50", "--scans", "2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["started_threads"] == 50
    pinned = out["results"][f"all on CPU {out['guarded_cpu']}"]
    assert pinned["tasks"] >= 51 and pinned["found"] >= 50  # every thread was put on that CPU
    assert {"wall_ms_p50", "cpu_ms_p50", "cpu_share_at_default_rate"} <= set(pinned)
    assert r.stderr == ""  # not a line per intruder


def test_service_scale_micro_runs_an_admission_and_release_per_setting():
    """Its enforcer stands in for the real one: it must keep up with what the service asks."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "service_scale_micro.py"), "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    measured = {(r[0], r[2]) for r in rows if len(r) == 5 and r[1] == "3"}
    assert measured == {(kind, setting) for kind in ("shared", "exclusive") for setting in ("off", "on")}


def test_nri_latency_prints_each_path_next_to_decide():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nri_latency.py"), "--probes", "3",
                          "--nodes", "2", "--containers", "20"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    paths = {(r[3], r[4]) for r in rows if len(r) == 9 and r[0] == "2"}
    assert paths == {("decide", "-"), ("handler", "exclusive"), ("session", "exclusive"),
                     ("handler", "shared"), ("session", "shared")}
