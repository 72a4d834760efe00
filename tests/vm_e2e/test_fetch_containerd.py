"""scripts/fetch-containerd against a stand-in archive: apt-get and apt-cache on PATH answer as
Debian's would (their packages built here with dpkg-deb), so no network is used."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fetch-containerd"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("dpkg") is None
                                or not Path("/usr/share/keyrings/debian-archive-keyring.gpg").exists(),
                                reason="needs Debian's dpkg and archive keyring")

FAKE_APT = r"""#!/bin/sh
# Stand-in for apt-get/apt-cache: logs its arguments; `policy P` names the candidate in
# $FAKE_DEBS/P.version, `download P=V` copies $FAKE_DEBS/P.deb into the current directory.
echo "$(basename "$0") $*" >> "$FAKE_DEBS/calls"
last=""; for a in "$@"; do prev="$last"; last="$a"; done
case " $* " in
  *" update "*) exit 0 ;;
  *" policy "*) echo "$last:"; echo "  Candidate: $(cat "$FAKE_DEBS/$last.version")"; exit 0 ;;
  *" download "*) pkg="${last%%=*}"; cp "$FAKE_DEBS/$pkg.deb" "./${pkg}_$(cat "$FAKE_DEBS/$pkg.version")_amd64.deb"; exit 0 ;;
esac
exit 1
"""


def _deb(where: Path, name: str, version: str, files: list[str]) -> None:
    tree = where / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
                                             "Maintainer: t <t@example.org>\nDescription: stand-in\n")
    for path in files:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(f"#!/bin/sh\necho {name} {version}\n")
        (tree / path).chmod(0o755)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(where / f"{name}.deb")],
                   check=True, capture_output=True)
    (where / f"{name}.version").write_text(version + "\n")


@pytest.fixture
def archive(tmp_path):
    debs, bindir = tmp_path / "debs", tmp_path / "bin"
    debs.mkdir()
    bindir.mkdir()
    for tool in ("apt-get", "apt-cache"):
        (bindir / tool).write_text(FAKE_APT)
        (bindir / tool).chmod(0o755)
    _deb(debs, "runc", "1.1.5+ds1-1+deb12u1", ["usr/sbin/runc"])
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_DEBS": str(debs), "TMPDIR": str(tmp_path)}
    return debs, env


def _fetch(dest: Path, env) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), str(dest)], capture_output=True, text=True, env=env, timeout=120)


def test_unpacks_containerd_and_runc_then_a_second_run_only_reports(archive, tmp_path):
    debs, env = archive
    _deb(debs, "containerd", "1.7.24~ds1-6+deb13u1",
         ["usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr"])
    dest = tmp_path / "ctd"
    done = _fetch(dest, env)
    assert done.returncode == 0, done.stderr
    for binary in ("usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr", "usr/sbin/runc"):
        assert os.access(dest / binary, os.X_OK)
    assert (dest / ".fetched").read_text() == "containerd 1.7.24~ds1-6+deb13u1\nrunc 1.1.5+ds1-1+deb12u1\n"
    calls = (debs / "calls").read_text()
    assert "download containerd=1.7.24~ds1-6+deb13u1" in calls and "download runc=1.1.5+ds1-1+deb12u1" in calls
    assert "Dir::Etc::sourceparts=-" in calls  # never the system's sources nor its lists
    assert "downloading containerd 1.7.24~ds1-6+deb13u1" in done.stderr
    (debs / "calls").unlink()
    again = _fetch(dest, env)
    assert again.returncode == 0 and "already in" in again.stderr
    assert not (debs / "calls").exists()


def test_a_containerd_that_is_not_1_7_is_refused_and_nothing_is_unpacked(archive, tmp_path):
    debs, env = archive
    _deb(debs, "containerd", "2.0.2~ds1-1", ["usr/bin/containerd"])
    dest = tmp_path / "ctd"
    done = _fetch(dest, env)
    assert done.returncode == 1
    assert "trixie offers containerd 2.0.2~ds1-1, not 1.7.24 or a later 1.7" in done.stderr
    assert not dest.exists()
