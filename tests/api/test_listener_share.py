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
    pod_resources = grpc_server.descriptor_share(nofile)
    assert listeners_share(nofile) == metrics + pod_resources
    assert 2 * connection_cap(nofile) + metrics + pod_resources + FD_RESERVE <= nofile


def test_podresources_takes_its_bound_from_the_open_file_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_server, "nofile_limit", lambda: 512)
    server = grpc_server.PodResourcesServer(str(tmp_path / "pr.sock"))
    assert server.max_connections == metrics_connection_cap(512) // grpc_server.DESCRIPTORS_PER_CONNECTION == 10


def test_one_user_cannot_hold_every_api_slot_when_the_bound_is_small(sock_dir):
    """With a bound of 8 (a small open-file limit), one user's idle clients get a
    quarter of it; another user still connects and is served."""
    from numa_agent.api.server import ApiServer
    from tests.support.agent_process import wait_for

    from .fake_service import FakeService
    from .test_scale import open_as, uid_by_peer_name

    srv = ApiServer(FakeService(), f"{sock_dir}/agent.sock", max_connections=8, request_deadline=60,
                    poll_interval=0.05, credentials=uid_by_peer_name({"idle": 4242, "other": 4343})).start()
    held = []
    try:
        assert srv.max_incomplete_per_uid == 2
        held = [open_as(srv.socket_path, "idle", i) for i in range(8)]
        assert wait_for(lambda: srv.stats()["refused_connections_total"]["per_uid_limit"] == 6, timeout=30)
        assert srv.stats()["open_connections"] == 2
        other = open_as(srv.socket_path, "other", 0)
        other.settimeout(5)
        other.sendall(b"GET /v1/health HTTP/1.1\r\n\r\n")
        assert other.recv(4096).startswith(b"HTTP/1.1 200")
        other.close()
    finally:
        for s in held:
            s.close()
        srv.stop()
