"""Fixtures: the API fake service (shared with tests/api) behind a real ApiServer."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from agent.api.server import ApiServer

_FAKE_PATH = Path(__file__).parents[1] / "api" / "fake_service.py"
_spec = importlib.util.spec_from_file_location("numa_agent_test_fake_service", _FAKE_PATH)
fake_service = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fake_service
_spec.loader.exec_module(fake_service)


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="na-cli-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake():
    return fake_service.FakeService()


@pytest.fixture
def server(fake, sock_dir):
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", poll_interval=0.02).start()
    yield srv
    srv.stop()
