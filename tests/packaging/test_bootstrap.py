"""`source scripts/bootstrap.sh` is safe in a person's interactive shell: it
puts .venv/bin on PATH and changes none of the shell's options, so a failing
command afterwards (the README's `numa-run --cpus 64 -- true; echo $?`) does
not close the terminal."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sourcing_leaves_the_shell_options_alone_and_sets_path():
    script = ('opts_before="$-"; source scripts/bootstrap.sh; echo "rc=$?"; false; echo "alive after false"; '
              'echo "opts=$- before=$opts_before"; command -v numa-run')
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = out.stdout.splitlines()
    assert "rc=0" in lines and "alive after false" in lines, out.stdout + out.stderr
    opts = next(line for line in lines if line.startswith("opts="))
    now, before = opts[len("opts="):].split(" before=")
    assert set(now) == set(before) and "e" not in now and "u" not in now
    assert lines[-1] == str(REPO / ".venv" / "bin" / "numa-run")


def test_sourcing_twice_does_not_grow_path():
    script = 'source scripts/bootstrap.sh; a="$PATH"; source scripts/bootstrap.sh; [ "$a" = "$PATH" ] && echo same'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "same", out.stderr
