"""The code has no unused imports, undefined names or syntax errors (ruff's
pyflakes rules), so dead code does not pile up between reviews."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyflakes_rules_pass():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F,E9", "--no-cache",
                             "numa_agent", "benchmarks", "scripts", "tests"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
