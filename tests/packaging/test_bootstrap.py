"""`source scripts/bootstrap.sh` is safe in a person's interactive shell: it
puts .venv/bin on PATH and changes none of the shell's options, so a failing
command afterwards (the README's `numa-run --cpus 64 -- true; echo $?`) does
not close the terminal."""

import shutil
import subprocess
from pathlib import Path

import pytest

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


def _interactive_session(script: Path, scratch: Path) -> tuple[str, str, str]:
    """Source SCRIPT in an interactive bash (`bash -i`, no rc files: a person's terminal),
    then run failing commands the way the README does. Returns `set -o` before and after,
    and what the shell printed after the failures (nothing if one closed it)."""
    session = (f'set -o > {scratch}/before; source {script}; set -o > {scratch}/after; '
               'false; echo "alive after false"; false | true; echo "alive after pipe $?"\n')
    out = subprocess.run(["bash", "--norc", "--noprofile", "-i"], input=session, cwd=REPO, capture_output=True,
                         text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "HOME": str(scratch)})
    after = scratch / "after"
    return (scratch / "before").read_text(), after.read_text() if after.exists() else "", out.stdout


def test_an_interactive_shell_keeps_its_options_and_survives_a_failing_command(tmp_path):
    before, after, printed = _interactive_session(REPO / "scripts" / "bootstrap.sh", tmp_path)
    assert "interactive-comments" in before and after == before
    assert "alive after false" in printed and "alive after pipe 0" in printed


def test_the_interactive_check_catches_a_script_that_sets_errexit(tmp_path):
    # The harness must be able to fail: what bootstrap.sh once did.
    bad = tmp_path / "bad.sh"
    bad.write_text("set -euo pipefail\n")
    before, after, printed = _interactive_session(bad, tmp_path)
    assert after != before and "errexit        \ton" in after
    assert "alive after false" not in printed


def test_zsh_can_source_it_from_another_directory(tmp_path):
    # zsh has no BASH_SOURCE: the script must still find the repository, not the caller's cwd.
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed (.ci/run installs it)")
    script = f'source {REPO}/scripts/bootstrap.sh; echo "rc=$?"; command -v numa-run'
    out = subprocess.run(["zsh", "-f", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.splitlines() == ["rc=0", str(REPO / ".venv" / "bin" / "numa-run")], out.stderr
