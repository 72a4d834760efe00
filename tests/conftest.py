"""Shared fixtures: the real-machine snapshots, each extracted when a test first asks for it."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS_ARCHIVES = sorted((FIXTURES / "sysfs").glob("*.tar.gz"))
SNAPSHOT_NAMES = [p.name[: -len(".tar.gz")] for p in SYSFS_ARCHIVES]
_TAR = shutil.which("tar")


class Snapshots:
    """The sysfs snapshots under `out`, each extracted on its first `root(name)`.

    A session used to extract all 14 up front (tens of seconds on a loaded 2-CPU
    machine) even when it ran one test that needed one of them, or none. Not kept
    across sessions: the tests run as root, so a tree in a shared cache could not be
    made read-only, and one test writing into it would change every later run."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def root(self, name: str) -> Path:
        root = self.out / name
        if not root.is_dir():
            archive = FIXTURES / "sysfs" / f"{name}.tar.gz"
            if _TAR:
                # The system's tar makes the same tree several times faster than tarfile
                # (thousands of small files); the archives are the repository's own.
                subprocess.run([_TAR, "-xzf", str(archive), "-C", str(self.out)], check=True)
            else:
                with tarfile.open(archive) as tar:
                    tar.extractall(self.out, filter="tar")
        return root


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory) -> Snapshots:
    return Snapshots(tmp_path_factory.mktemp("snapshots"))


@pytest.fixture(scope="session")
def snapshot(snapshots):
    """snapshot(name) -> (root Path, EXPECTED dict)."""

    def get(name: str):
        root = snapshots.root(name)
        return root, json.loads((root / "EXPECTED.json").read_text())

    return get


@pytest.fixture(autouse=True)
def _inotify_exhausted_when_asked(monkeypatch):
    """NUMA_AGENT_TESTS_NO_INOTIFY=1: no inotify instance can be had, here and in
    the agents the tests start (tests/support/inotify_exhausted.py)."""
    import os

    from tests.support.inotify_exhausted import ENV, SITE_DIR, exhausted_libc

    if not os.environ.get(ENV):
        return
    from numa_agent.enforcement import libc

    monkeypatch.setattr(libc, "_handle", exhausted_libc())
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{SITE_DIR}{os.pathsep}{path}" if path else str(SITE_DIR))
