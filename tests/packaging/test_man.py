"""The man pages numa-agent.service names in Documentation= render without a warning.
Needs man-db and groff (Debian: man-db, groff-base)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs" / "man").glob("*.[0-9]"))
MAN = shutil.which("man")


def render(page: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MANWIDTH": "80", "MAN_DISABLE_SECCOMP": "1", "LC_ALL": "C.UTF-8"}
    return subprocess.run([MAN, "--warnings", "-l", str(page)], capture_output=True, text=True,
                          env=env, timeout=60)


def test_pages_exist():
    assert [p.name for p in PAGES] == ["numa-agent.8", "numa-run.1"]


@pytest.mark.skipif(MAN is None, reason="man not installed (Debian packages: man-db, groff-base)")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_renders_without_warnings(page):
    done = render(page)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    name = page.stem.upper()
    assert done.stdout.startswith(f"{name}({page.suffix[1:]})")
    assert "NAME" in done.stdout and "SEE ALSO" in done.stdout


@pytest.mark.skipif(MAN is None, reason="man not installed (Debian packages: man-db, groff-base)")
def test_render_reports_a_broken_page(tmp_path):
    # The check must be able to fail: an unknown request is a warning.
    broken = tmp_path / "broken.1"
    broken.write_text(".TH BROKEN 1\n.SH NAME\nbroken \\- x\n.XYZZY\n")
    assert render(broken).stderr != ""


def test_numa_run_page_names_every_long_option():
    # The page was once missing --isolate: every option numa-run accepts is described there.
    from numa_agent.cli.numa_run import build_parser

    page = (REPO / "docs" / "man" / "numa-run.1").read_text().replace("\\-", "-")
    options = {opt for action in build_parser()._actions for opt in action.option_strings
               if opt.startswith("--") and opt not in ("--help", "--version")}
    assert options, "no options found: the check would pass vacuously"
    assert sorted(opt for opt in options if opt not in page) == []
