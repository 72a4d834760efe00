"""Fixtures: a FakeService served by a real ApiServer on a short temp socket path."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from numa_agent.api.server import ApiServer

from .fake_service import FakeService


@pytest.fixture
def sock_dir():
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="na-api-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake():
    return FakeService()


@pytest.fixture
def server(fake, sock_dir):
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", request_deadline=1.0, poll_interval=0.02).start()
    yield srv
    srv.stop()
