"""The tree stays as its checkers want it: ruff (pyflakes, bugbear, import
order, complexity; rules and version in pyproject.toml) over the code, the
scripts and the tests, and mypy over the package."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                             "numa_agent", "benchmarks", "scripts", "tests"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_passes():
    # The configuration (files, strictness, modules without type information)
    # is pyproject.toml's; the cache keeps a second run to a few seconds.
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
