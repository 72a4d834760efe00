"""The conformance runner on the project's copy of the kubelet vectors, and on
files that must be reported as failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.conformance.runner import ConformanceFileError, run

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "fixtures" / "conformance" / "kubelet-vectors.json"
KEP_6007 = ROOT / "tests" / "fixtures" / "conformance" / "kep-6007-vectors.json"
SCRIPT = ROOT / "scripts" / "kubelet-conformance"


def test_every_kubelet_vector_passes():
    passed, failed, lines = run([VECTORS])
    assert lines[-1] == f"{passed} passed, 0 failed", "\n".join(lines)
    assert passed == 33 + 24 + 13 + 11


def test_every_numa_allocation_strategy_vector_passes():
    passed, failed, lines = run([KEP_6007])
    assert lines[-1] == f"{passed} passed, 0 failed", "\n".join(lines)
    assert passed == 9


def test_the_strategy_vectors_depend_on_the_strategy(tmp_path):
    """Under none, the vectors whose answer is not the lowest mask fail: they test the strategy."""
    doc = json.loads(KEP_6007.read_text())
    for case in doc["numa_allocation_strategy_merge"]:
        case["policy_options"]["numa-allocation-strategy"] = "none"
    path = tmp_path / "none.json"
    path.write_text(json.dumps(doc))
    _, failed, lines = run([path])
    assert {line.split()[1] for line in lines[:-1]} == {"kep6007-001", "kep6007-005", "kep6007-007"}


def _copy_with(tmp_path, mutate) -> Path:
    doc = json.loads(VECTORS.read_text())
    mutate(doc)
    path = tmp_path / "vectors.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_wrong_expected_value_is_reported_with_its_id(tmp_path):
    def break_tm_020(doc):
        case = next(c for c in doc["topology_manager_merge"] if c["id"] == "tm-020")
        case["expected"] = {"mask": [1], "preferred": False}

    passed, failed, lines = run([_copy_with(tmp_path, break_tm_020)])
    assert failed == 1 and lines[-1] == f"{passed} passed, 1 failed"
    assert any(line.startswith("FAIL tm-020 (topology_manager_merge): best-effort: merged {0}, expected {1}")
               for line in lines), lines


def test_an_unknown_section_is_reported_not_skipped(tmp_path):
    def add_section(doc):
        doc["memory_manager_future"] = [{"id": "mm-1"}, {"id": "mm-2"}]

    _, failed, lines = run([_copy_with(tmp_path, add_section)])
    assert failed == 2
    assert any("memory_manager_future: unknown section; 2 case(s) not run" in line for line in lines)


def test_unreadable_and_malformed_files_are_clear_errors(tmp_path):
    with pytest.raises(ConformanceFileError, match="cannot read"):
        run([tmp_path / "missing.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConformanceFileError, match="not valid JSON"):
        run([bad])
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"topology_manager_merge": [1, 2]}))
    with pytest.raises(ConformanceFileError, match="must be a list of case objects"):
        run([wrong])


def _script(*args):
    env = dict(os.environ, PYTHONPATH="")
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT / "tests")


def test_script_exit_codes(tmp_path):
    ok = _script(VECTORS)
    assert ok.returncode == 0 and ok.stdout.strip().splitlines()[-1] == "81 passed, 0 failed"
    bad = tmp_path / "bad.json"
    bad.write_text("[1")
    broken = _script(bad)
    assert broken.returncode == 2 and "not valid JSON" in broken.stderr
    wrong = _copy_with(tmp_path, lambda d: d["topology_manager_merge"][0].update(expected_admit={
        "best-effort": False, "restricted": True, "single-numa-node": True}))
    failing = _script(wrong)
    assert failing.returncode == 1 and "FAIL tm-001" in failing.stdout
