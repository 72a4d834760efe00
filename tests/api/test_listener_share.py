"""The open-file limit is split so that no other listener can take the API's
descriptors: the API's bound (two descriptors a connection: socket and pidfd)
is what is left after the fixed reserve and the bounds of /metrics and
PodResources, whatever the limit."""

from __future__ import annotations

import pytest

from numa_agent.api.server import FD_RESERVE, connection_cap, listeners_share
from numa_agent.kubelet import grpc_server
from numa_agent.views.metrics import metrics_connection_cap


@pytest.mark.parametrize("nofile", [384, 512, 1000, 1024, 4096, 65536, 524288, 1 << 20])
def test_the_api_bound_leaves_the_metrics_and_podresources_bounds(nofile):
    metrics = metrics_connection_cap(nofile)
    pod_resources = grpc_server.connection_cap(nofile)
    assert listeners_share(nofile) == metrics + pod_resources
    assert 2 * connection_cap(nofile) + metrics + pod_resources + FD_RESERVE <= nofile


def test_podresources_takes_its_bound_from_the_open_file_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_server, "nofile_limit", lambda: 512)
    server = grpc_server.PodResourcesServer(str(tmp_path / "pr.sock"))
    assert server.max_connections == metrics_connection_cap(512) == 32
