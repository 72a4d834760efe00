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
