"""numa-run as users install it: a wheel of a copy of the tree, installed by a fresh venv's
own pip (the one ensurepip gives it), run against the API's fake service, whose agent
confines by cgroup. What `python -X importtime` sees on the common launches is what the
installed file and the launcher import: no re (the wrapper pip writes for a console-script
entry point imports it), no ctypes (no memory policy to set), no argparse. ~10 s: a wheel
build without isolation and a venv with pip."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_install import _copy_sources

from tests.api.conftest import fake, server, sock_dir  # noqa: F401  (pytest fixtures)

REPO = Path(__file__).resolve().parents[2]
# Modules the common launch must not load, for what they cost in front of every command.
NEVER = ("re", "ctypes", "argparse", "enum", "dataclasses")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    base = tmp_path_factory.mktemp("entry-point")
    src = _copy_sources(base / "src")
    wheels = base / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                            "--no-build-isolation", "--disable-pip-version-check", "-w", str(wheels), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    install = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-deps",
                              "--no-index", "--disable-pip-version-check", *map(str, wheels.glob("*.whl"))],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "SLURM_JOB_ID")}
    return {**env, **extra}


def test_numa_run_is_on_the_venvs_path_with_its_interpreter(venv):
    script = venv / "bin/numa-run"
    assert script.read_text().splitlines()[0] == f"#!{venv / 'bin/python'}"
    assert os.access(script, os.X_OK)
    out = subprocess.run(["numa-run", "--version"], capture_output=True, text=True, cwd="/",
                         env=_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"))
    assert out.returncode == 0 and out.stdout.startswith("numa-run "), out.stderr


@pytest.mark.parametrize("argv", [["--shared", "--", "true"], ["--cpus", "1", "--", "true"]])
def test_the_installed_launcher_imports_no_re_ctypes_or_argparse(venv, server, fake, argv):  # noqa: F811
    out = subprocess.run([str(venv / "bin/python"), "-X", "importtime", str(venv / "bin/numa-run"), *argv],
                         capture_output=True, text=True, cwd="/", timeout=60,
                         env=_env(NUMA_AGENT_SOCKET=server.socket_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert fake.service_calls().count("admit") == 1  # it did launch, through the agent
    loaded = {line.split("|")[2].strip() for line in out.stderr.splitlines()
              if line.startswith("import time:") and line.count("|") == 2}
    assert "numa_agent.cli.numa_run" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in NEVER) == []
