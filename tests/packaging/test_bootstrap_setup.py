"""The venv's set-up says what it does, a step a line, shows pip's own progress and
keeps setuptools' editable-install warning (about this very layout) out of it. Run on a
copy of the script with stand-ins for python3 and the venv's python that log their calls."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PYTHON3 = """#!/bin/sh
# python3 -m venv DIR: make DIR/bin/python, which logs its arguments and PYTHONWARNINGS.
mkdir -p "$3/bin"
cat > "$3/bin/python" <<'STUB'
#!/bin/sh
echo "python $* | PYTHONWARNINGS=${PYTHONWARNINGS:-}" >> "$CALLS"
STUB
chmod +x "$3/bin/python"
"""


def set_up(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "bootstrap.sh").write_text((REPO / "scripts" / "bootstrap.sh").read_text())
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(_PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)}
    env.pop("PYTHONWARNINGS", None)
    out = subprocess.run(["bash", "-c", "source scripts/bootstrap.sh"], cwd=root, capture_output=True,
                         text=True, timeout=60, env=env)
    return out, calls.read_text().splitlines() if calls.exists() else []


def test_each_step_is_said_and_pip_is_not_silenced(tmp_path):
    out, calls = set_up(tmp_path)
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stderr.splitlines() if line.startswith("numa-agent: ")]
    assert [s.split()[1] for s in steps[1:4]] == ["1/3", "2/3", "3/3"] and steps[-1].endswith("is ready")
    install = [c for c in calls if " -e " in c]
    assert len(install) == 1 and "--quiet" not in install[0]


def test_the_editable_install_warning_is_filtered_for_the_install_only(tmp_path):
    _, calls = set_up(tmp_path)
    install = [c for c in calls if " -e " in c]
    assert install[0].endswith("PYTHONWARNINGS=ignore:Editable installation")
    assert all(c.endswith("PYTHONWARNINGS=") for c in calls if " -e " not in c)


def test_a_second_run_sets_up_nothing(tmp_path):
    set_up(tmp_path)
    root = tmp_path / "repo"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls2")}
    out = subprocess.run(["bash", "-c", "source scripts/bootstrap.sh"], cwd=root, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0 and out.stderr == "" and not (tmp_path / "calls2").exists()
