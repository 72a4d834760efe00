"""scripts/install in a temporary root. One real pip install (~30-60 s: it builds the
project and fetches or reuses its dependency wheels), then checks on the result."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_links import relative_targets

REPO = Path(__file__).resolve().parents[2]


def _copy_sources(dest: Path) -> Path:
    # A private copy, so edits elsewhere in the work tree cannot change what is installed.
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for tree in ("numa_agent", "bin", "systemd", "docs/man", "completions", "oci", "contrib/slurm"):
        shutil.copytree(REPO / tree, dest / tree, ignore=ignore)
    for page in (REPO / "docs").glob("*.md"):
        shutil.copy(page, dest / "docs" / page.name)
    (dest / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "install", dest / "scripts" / "install")
    return dest


def run_install(src: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(src / "scripts" / "install"), *args],
        capture_output=True, text=True, timeout=900,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    src = _copy_sources(base / "src")
    root = base / "root"
    first = run_install(src, "--root", str(root), "--prefix", "/opt/numa-agent")
    assert first.returncode == 0, first.stdout + first.stderr
    return src, root, first


def test_venv_has_the_project_and_its_dependencies(installed):
    _, root, first = installed
    venv = root / "opt/numa-agent"
    assert "wrote sample config" in first.stdout
    out = subprocess.run([str(venv / "bin/numa-agent"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: numa-agent" in out.stdout
    out = subprocess.run([str(venv / "bin/numa-run"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "numa-run" in out.stdout
    deps = subprocess.run(
        [str(venv / "bin/python"), "-c", "import pyudev, prometheus_client, msgspec, grpc, numa_agent.views.metrics"],
        capture_output=True, text=True,
    )
    assert deps.returncode == 0, deps.stderr


def test_links_units_and_config(installed):
    src, root, _ = installed
    for tool in ("numa-agent", "numa-run"):
        link = root / "usr/local/bin" / tool
        assert link.is_symlink()
        assert os.readlink(link) == f"/opt/numa-agent/bin/{tool}"  # valid once root is /
        assert (root / "opt/numa-agent/bin" / tool).exists()
    units = root / "etc/systemd/system"
    assert (units / "numa-agent.service").read_text() == (src / "systemd/numa-agent.service").read_text()
    assert (units / "numa-agent.slice").read_text() == (src / "systemd/numa-agent.slice").read_text()
    assert (units / "numa-agent-workloads.service").read_text() == \
        (src / "systemd/numa-agent-workloads.service").read_text()
    assert (root / "etc/numa-agent/config.toml").read_text() == (src / "systemd/config.example.toml").read_text()
    assert (root / "opt/numa-agent/affinity-fallback.conf").read_text() == \
        (src / "systemd/affinity-fallback.conf").read_text()
    epilog = root / "usr/local/libexec/numa-agent/slurm-epilog"
    assert epilog.read_text() == (src / "contrib/slurm/epilog").read_text() and os.access(epilog, os.X_OK)


def test_the_oci_hooks_are_where_podman_and_cri_o_look(installed):
    src, root, _ = installed
    hooks = sorted((src / "oci/hooks.d").glob("*.json"))
    assert [h.name for h in hooks] == ["numa-agent-create.json", "numa-agent-poststop.json"]
    for hook in hooks:
        installed_hook = root / "usr/share/containers/oci/hooks.d" / hook.name
        assert installed_hook.read_text() == hook.read_text()
        assert '"path": "/usr/local/bin/numa-agent"' in installed_hook.read_text()  # the link made above
    assert (root / "opt/numa-agent/share/containers/oci/hooks.d" / hooks[0].name).is_file()  # the wheel's copy


def test_the_man_pages_the_unit_names_are_installed(installed):
    src, root, _ = installed
    pages = re.findall(r"man:([\w-]+)\((\d)\)", (src / "systemd/numa-agent.service").read_text())
    assert sorted(pages) == [("numa-agent", "8"), ("numa-run", "1")]
    for name, section in pages:
        page = root / f"usr/local/share/man/man{section}/{name}.{section}"
        assert page.read_text() == (src / f"docs/man/{name}.{section}").read_text()


def test_completions_are_where_bash_completion_and_zsh_look(installed):
    src, root, _ = installed
    for tool in ("numa-agent", "numa-run"):
        bash = root / "usr/local/share/bash-completion/completions" / tool
        assert bash.read_text() == (src / "completions/bash" / tool).read_text()
        zsh = root / "usr/local/share/zsh/site-functions" / f"_{tool}"
        assert zsh.read_text() == (src / "completions/zsh" / f"_{tool}").read_text()


def test_installed_commands_print_the_package_version(installed):
    import numa_agent

    _, root, _ = installed
    for tool in ("numa-agent", "numa-run"):
        out = subprocess.run([str(root / "opt/numa-agent/bin" / tool), "--version"], capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout == f"{tool} {numa_agent.__version__}\n", out.stdout + out.stderr


def test_the_venv_holds_what_the_wheel_carries(installed):
    # The wheel's data files land under the venv's share/ (`pip install --user` users get
    # them under ~/.local/share, where man and the shells look).
    src, root, _ = installed
    share = root / "opt/numa-agent/share"
    assert (share / "man/man8/numa-agent.8").read_text() == (src / "docs/man/numa-agent.8").read_text()
    assert (share / "numa-agent/systemd/numa-agent.service").read_text() == \
        (src / "systemd/numa-agent.service").read_text()
    assert (share / "bash-completion/completions/numa-run").is_file()


def test_the_installed_readme_finds_the_pages_it_links_to(installed):
    # README.md and docs/ land in the venv together, so the README's links and the pages'
    # resolve there; CONTRIBUTING.md is about the checkout and is not in the source archive.
    src, root, _ = installed
    venv = root / "opt/numa-agent"
    pages = sorted(page.name for page in (src / "docs").glob("*.md"))
    assert "numa-run.md" in pages and sorted(page.name for page in (venv / "docs").glob("*.md")) == pages
    for page in [venv / "README.md", *sorted((venv / "docs").glob("*.md"))]:
        assert page.read_text() == (src / page.relative_to(venv)).read_text()
        missing = [t for t in relative_targets(page.read_text())
                   if t != "CONTRIBUTING.md" and not (page.parent / t).exists()]
        assert missing == [], f"{page.relative_to(venv)} links to missing {missing}"


def test_second_run_is_quick_and_keeps_the_config(installed):
    src, root, _ = installed
    config = root / "etc/numa-agent/config.toml"
    config.write_text('[agent]\nlog_level = "debug"\n')
    again = run_install(src, "--root", str(root))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already has this version of numa-agent" in again.stdout
    assert "keeping existing" in again.stdout
    assert config.read_text() == '[agent]\nlog_level = "debug"\n'
    assert "systemctl daemon-reload && systemctl enable --now numa-agent" in again.stdout
    assert os.readlink(root / "usr/local/bin/numa-agent") == "/opt/numa-agent/bin/numa-agent"


@pytest.fixture
def src(tmp_path):
    return _copy_sources(tmp_path / "src")


def test_relative_prefix_is_refused(src, tmp_path):
    out = run_install(src, "--root", str(tmp_path / "r"), "--prefix", "opt/numa-agent")
    assert out.returncode != 0
    assert "--prefix must be an absolute path, got 'opt/numa-agent'" in out.stderr


def test_unknown_argument_is_refused(src):
    out = run_install(src, "--bogus")
    assert out.returncode != 0
    assert "unknown argument: --bogus" in out.stderr
    assert "usage: scripts/install" in out.stderr


def test_missing_python_is_reported(src, tmp_path):
    out = run_install(src, "--root", str(tmp_path / "r"), "--python", "no-such-python3")
    assert out.returncode != 0
    assert "python interpreter 'no-such-python3' not found" in out.stderr


def test_old_python_is_reported(src, tmp_path):
    fake = tmp_path / "python3.9"
    fake.write_text('#!/bin/sh\nif [ "$1" = "-V" ]; then echo "Python 3.9.18"; exit 0; fi\nexit 1\n')
    fake.chmod(0o755)
    out = run_install(src, "--root", str(tmp_path / "r"), "--python", str(fake))
    assert out.returncode != 0
    assert "needs Python 3.11 or newer" in out.stderr and "Python 3.9.18" in out.stderr
    assert not (tmp_path / "r/opt").exists()  # nothing was installed


def test_a_wheelhouse_that_is_missing_or_holds_no_wheels_is_refused_before_anything_is_installed(src, tmp_path):
    missing = run_install(src, "--root", str(tmp_path / "r"), "--wheelhouse", str(tmp_path / "none"))
    assert missing.returncode != 0 and "is not a directory" in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_install(src, "--root", str(tmp_path / "r"), "--wheelhouse", str(empty))
    assert out.returncode != 0 and "holds no wheels" in out.stderr
    assert not (tmp_path / "r/opt").exists()


def test_an_interpreter_below_a_home_directory_is_refused(src, tmp_path):
    # ProtectHome=yes in the unit hides /root and /home: such a venv could never start.
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\ncase "$*" in *realpath*) echo /root/.pyenv/versions/3.11.7/bin/python3.11; '
                    'echo /root/.pyenv/versions/3.11.7 ;; esac\nexit 0\n')
    fake.chmod(0o755)
    out = run_install(src, "--root", str(tmp_path / "r"), "--python", str(fake))
    assert out.returncode != 0
    assert "below a home directory" in out.stderr and "ProtectHome=yes" in out.stderr
    assert not (tmp_path / "r/opt").exists()
