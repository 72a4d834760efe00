"""`python -m build` on a copy of the tree: the wheel and the sdist carry what a daemon
needs besides its code (~15 s: the build fetches or reuses setuptools in an isolated
environment)."""

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import numa_agent

REPO = Path(__file__).resolve().parents[2]
VERSION = numa_agent.__version__
UNITS = ["numa-agent.service", "numa-agent-workloads.service", "numa-agent.slice", "numa-agent.socket",
         "affinity-fallback.conf", "config.example.toml"]
# Where the wheel puts each shipped file, relative to the install prefix.
WHEEL_DATA = {
    **{f"share/numa-agent/systemd/{name}": f"systemd/{name}" for name in UNITS},
    "share/man/man1/numa-run.1": "docs/man/numa-run.1",
    "share/man/man8/numa-agent.8": "docs/man/numa-agent.8",
    "share/bash-completion/completions/numa-agent": "completions/bash/numa-agent",
    "share/bash-completion/completions/numa-run": "completions/bash/numa-run",
    "share/zsh/site-functions/_numa-agent": "completions/zsh/_numa-agent",
    "share/zsh/site-functions/_numa-run": "completions/zsh/_numa-run",
    **{f"share/containers/oci/hooks.d/{name}": f"oci/hooks.d/{name}"
       for name in ("numa-agent-create.json", "numa-agent-poststop.json")},
    "share/numa-agent/slurm/epilog": "contrib/slurm/epilog",
}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    base = tmp_path_factory.mktemp("build")
    src = base / "src"
    src.mkdir()
    (src / "tests").mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "tests/test_lint.py"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for tree in ("numa_agent", "bin", "systemd", "docs", "completions", "oci", "contrib", "scripts",
                 "tests/packaging"):
        shutil.copytree(REPO / tree, src / tree, ignore=ignore)
    out = subprocess.run([sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheel = base / "dist" / f"numa_agent-{VERSION}-py3-none-any.whl"
    sdist = base / "dist" / f"numa_agent-{VERSION}.tar.gz"
    return wheel, sdist


def test_wheel_carries_units_config_man_pages_completions_and_hooks(dist):
    wheel, _ = dist
    data = f"numa_agent-{VERSION}.data/data/"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for target, source in WHEEL_DATA.items():
            assert data + target in names, target
            assert z.read(data + target) == (REPO / source).read_bytes(), target
        assert "numa_agent/cli/numa_run.py" in names
        # numa-run is a script file pip copies with its interpreter line (no generated wrapper)
        script = z.read(f"numa_agent-{VERSION}.data/scripts/numa-run").decode()
        assert script.splitlines()[0] == "#!python" and "import re" not in script
        console = z.read(f"numa_agent-{VERSION}.dist-info/entry_points.txt").decode()
        assert "numa-agent = numa_agent.cli.numa_agent:main" in console and "numa-run" not in console
        info = f"numa_agent-{VERSION}.dist-info/"
        assert z.read(info + "licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        metadata = z.read(info + "METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert not any(n.startswith("tests/") for n in names)
    # The product only: synthetic machines, the kubelet's literal merge, the vector runner and
    # the chaos storm live in tests/support, which no installed module imports.
    assert not any(n.startswith("numa_agent/testing") for n in names)


def test_sdist_carries_the_same_and_what_installs_it(dist):
    _, sdist = dist
    top = f"numa_agent-{VERSION}/"
    with tarfile.open(sdist) as t:
        names = {n[len(top):] for n in t.getnames() if n.startswith(top)}
    expected = set(WHEEL_DATA.values()) | {"LICENSE", "README.md", "pyproject.toml", "scripts/install",
                                          "scripts/gen-docs", "scripts/bootstrap.sh", "docs/man/numa-run.1.in",
                                          "docs/man/numa-agent.8.in", "docs/architecture.md",
                                          "numa_agent/__init__.py", "bin/numa-run"}
    assert sorted(expected - names) == []
    # The tests stay in the repository, with the fixtures and their own licence.
    assert not any(n.startswith("tests/") for n in names)


def test_the_unpacked_sdist_installs_with_its_own_scripts_install(dist, tmp_path):
    _, sdist = dist
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path, filter="data")
    src = tmp_path / f"numa_agent-{VERSION}"
    root = tmp_path / "root"
    out = subprocess.run(["bash", str(src / "scripts/install"), "--root", str(root)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (root / "usr/local/share/man/man1/numa-run.1").read_bytes() == (REPO / "docs/man/numa-run.1").read_bytes()
    assert (root / "usr/local/share/zsh/site-functions/_numa-agent").is_file()
    assert (root / "etc/systemd/system/numa-agent.service").is_file()
