"""bench-checkpoint runs on its smallest setting and prints the promised rows;
figures are never compared with a time."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_bench_checkpoint_json_rows(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-checkpoint"), "--json", "--sizes", "10,30",
                        "--commits", "6", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["workloads"] for row in rows] == [10, 30]
    for row in rows:
        assert row["commits"] == 6 == row["snapshots"] + row["journal_entries"]
        for name in ("whole", "journal"):
            assert 0 < row[f"{name}_p50_ms"] <= row[f"{name}_p99_ms"] <= row[f"{name}_max_ms"]
        assert row["p50_ratio"] > 0 and row["p99_ratio"] > 0 and row["snapshot_bytes"] > 0
    assert list(tmp_path.iterdir()) == []  # its state directories are gone


def test_the_changes_are_one_each_and_keep_the_size():
    states = checkpoint.changes(20, 10)
    assert all(abs(len(s.workloads) - 20) <= 1 for s in states)
    assert len({tuple(w.name for w in s.workloads) for s in states}) == 10


def test_bad_settings_exit_2(capsys):
    assert checkpoint.main(["--commits", "1"]) == 2
    assert "bench-checkpoint: --commits must be at least 2, got 1" in capsys.readouterr().err
    assert checkpoint.main(["--sizes", "ten"]) == 2


def test_the_snapshot_size_reads_in_binary_units():
    row = {"workloads": 10, "snapshot_bytes": 5632, "whole_p50_ms": 1.0, "whole_p99_ms": 2.0,
           "journal_p50_ms": 0.1, "journal_p99_ms": 0.2, "journal_max_ms": 0.3, "snapshots": 1,
           "commits": 6, "p50_ratio": 10.0, "p99_ratio": 10.0}
    line = checkpoint.render([row], "/tmp").splitlines()[-1]
    assert line.split()[:3] == ["10", "5.5", "KiB"]
