"""Shared fixtures: the real-machine snapshots, extracted once per session."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS_ARCHIVES = sorted((FIXTURES / "sysfs").glob("*.tar.gz"))
SNAPSHOT_NAMES = [p.name[: -len(".tar.gz")] for p in SYSFS_ARCHIVES]


@pytest.fixture(scope="session")
def snapshots_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("snapshots")
    for archive in SYSFS_ARCHIVES:
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter="tar")
    return out


@pytest.fixture(scope="session")
def snapshot(snapshots_dir):
    """snapshot(name) -> (root Path, EXPECTED dict)."""

    def get(name: str):
        root = snapshots_dir / name
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
