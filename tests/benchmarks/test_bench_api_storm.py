"""Smoke test of bench-api-storm on its smallest setting: it runs against a
real agent and its JSON has the promised structure. No figure is compared."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.api_storm import main

ROOT = Path(__file__).resolve().parents[2]


def test_bench_api_storm_json_on_the_smallest_setting():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-api-storm"), "--json", "--clients", "2",
                        "--requests", "4", "--slowloris", "2", "--idle", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (report,) = json.loads(r.stdout)
    burst, storm = report["burst"], report["slow_and_idle"]
    assert sum(burst["outcomes"].values()) == 2
    assert set(burst["outcomes"]) == {"admitted", "capacity_refusal", "busy", "error"}
    assert sum(storm["outcomes"].values()) == 4 and (storm["slowloris"], storm["idle"]) == (2, 3)
    assert {"p50_ms", "p99_ms"} <= set(storm)


def test_bench_api_storm_bad_settings_exit_2(capsys):
    assert main(["--clients", "0"]) == 2
    assert capsys.readouterr().err.startswith("bench-api-storm: --clients and --requests must be")
