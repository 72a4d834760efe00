from __future__ import annotations

import grp
import os
import socket
import stat

import pytest

from numa_agent.api.client import AgentUnreachable, request
from numa_agent.api.server import ApiServer, SocketInUse
from numa_agent.service.requests import AdmitRequest

from .fake_service import FakeService
from .rawhttp import post, send_raw


def get(server, path):
    return request(server.socket_path, "GET", path)


# ------------------------------------------------------------------ routes
def test_health(server):
    status, body = get(server, "/v1/health")
    assert status == 200
    assert body["status"] == "ok" and body["enforcement"] == "cgroup"


def test_topology_and_status(server):
    assert get(server, "/v1/topology")[1]["numa_nodes"][1]["cpus"] == "4-7"
    status, body = get(server, "/v1/status")
    assert status == 200 and [n["id"] for n in body["nodes"]] == [0, 1]


def test_allocatable_is_capacity_and_free_per_node(server):
    request(server.socket_path, "POST", "/v1/workloads", {"name": "a", "cpus": 2})
    status, body = get(server, "/v1/allocatable")
    assert status == 200
    node0 = body["nodes"][0]
    assert node0["cpus"] == {"capacity": 4, "free": 1}
    assert node0["hugepages"]["2048kB"] == {"capacity": 512, "free": 512}
    assert body["nodes"][1]["devices"]["gpu"] == {"capacity": 1, "free": 1}


def test_response_is_json_with_content_type(server):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(server.socket_path)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    sock.close()
    head = data.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200 ok")
    assert b"content-type: application/json" in head


def test_admit_list_release(server, fake):
    status, body = request(server.socket_path, "POST", "/v1/workloads",
                           {"name": "web-1", "cpus": 2, "command": ["sleep", "1"]})
    assert status == 201
    assert body["name"] == "web-1" and body["cpus"] == "1-2"
    status, body = get(server, "/v1/workloads")
    assert [w["name"] for w in body["workloads"]] == ["web-1"]
    status, body = request(server.socket_path, "DELETE", "/v1/workloads/web-1")
    assert status == 200 and body["released"] is True
    assert fake.workloads == {}


def test_patch_resizes_a_workload(server, fake):
    request(server.socket_path, "POST", "/v1/workloads", {"name": "web-1", "cpus": 2})
    status, body = request(server.socket_path, "PATCH", "/v1/workloads/web-1", {"cpus": 4, "memory_bytes": 1 << 30})
    assert status == 200 and body["cpus"] == "0-3"
    assert fake.calls[-1] == ("resize", {"name": "web-1", "cpus": 4, "memory_bytes": 1 << 30})


@pytest.mark.parametrize("body,says", [
    ({}, "names cpus, memory_bytes or both"),
    ({"cpus": -1}, "invalid request"),
    ({"cpus": 2, "memory": "1Gi"}, "invalid request"),
])
def test_a_bad_patch_is_400_and_the_service_is_not_asked(server, fake, body, says):
    request(server.socket_path, "POST", "/v1/workloads", {"name": "web-1", "cpus": 2})
    status, answer = request(server.socket_path, "PATCH", "/v1/workloads/web-1", body)
    assert status == 400 and says in answer["error"]["message"]
    assert fake.calls[-1][0] != "resize"


def test_patch_of_an_unknown_workload_is_404(server):
    status, _ = request(server.socket_path, "PATCH", "/v1/workloads/nope", {"cpus": 2})
    assert status == 404


def test_service_receives_normalized_request(server, fake):
    request(server.socket_path, "POST", "/v1/workloads",
            {"cpus": 1, "hugepages": {"2048": 4}, "physcpubind": "3,1-2", "membind": [1, 0]})
    (req, dry_run) = fake.calls[-1][1]
    assert dry_run is False
    assert isinstance(req, AdmitRequest)
    assert req.physcpubind == "1-3" and req.membind == [0, 1] and req.hugepages == {"2048": 4}
    assert req.name is None and req.devices == {} and req.pod_budget is None


def test_dry_run_is_200_and_keeps_nothing(server, fake):
    status, body = request(server.socket_path, "POST", "/v1/workloads?dry_run=1", {"cpus": 2})
    assert status == 200 and body["dry_run"] is True
    assert fake.workloads == {}
    assert fake.calls[-1][1][1] is True


def test_bad_dry_run_value(server, fake):
    status, body = request(server.socket_path, "POST", "/v1/workloads?dry_run=maybe", {"cpus": 1})
    assert status == 400 and "dry_run" in body["error"]["message"]
    assert "admit" not in fake.service_calls()


def test_refusal_carries_explanation(server):
    status, body = request(server.socket_path, "POST", "/v1/workloads", {"cpus": 5})
    assert status == 409
    err = body["error"]
    assert err["code"] == "topology_affinity_error"
    assert "TopologyAffinityError" in err["message"]
    assert err["details"]["merged"] == {"mask": [0, 1], "preferred": False}


def test_name_in_use_is_conflict(server):
    request(server.socket_path, "POST", "/v1/workloads", {"name": "a", "cpus": 1})
    status, body = request(server.socket_path, "POST", "/v1/workloads", {"name": "a", "cpus": 1})
    assert status == 409 and body["error"]["code"] == "name_in_use"


def test_release_unknown_is_404(server):
    status, body = request(server.socket_path, "DELETE", "/v1/workloads/nope")
    assert status == 404 and body["error"]["code"] == "not_found"


def test_unknown_route_404_and_wrong_method_405(server):
    status, body = get(server, "/v2/health")
    assert status == 404 and "no route" in body["error"]["message"]
    status, body = request(server.socket_path, "PUT", "/v1/health", {})
    assert status == 405 and body["error"]["details"]["allowed"] == ["GET"]
    status, body = request(server.socket_path, "GET", "/v1/workloads/x")
    assert status == 405


def test_status_takes_the_memory_flag_and_nothing_else(server, fake):
    assert get(server, "/v1/status?memory=1")[0] == 200
    assert fake.calls[-1] == ("status", True)
    assert get(server, "/v1/status")[0] == 200
    assert fake.calls[-1] == ("status", None)
    status, body = get(server, "/v1/status?memory=maybe")
    assert status == 400 and "memory" in body["error"]["message"]
    status, body = get(server, "/v1/status?dry_run=1")
    assert status == 400 and "unknown query parameter" in body["error"]["message"]


def test_query_on_get_route_is_rejected(server):
    status, body = get(server, "/v1/health?x=1")
    assert status == 400 and "query" in body["error"]["message"]


def test_service_bug_is_500_and_server_keeps_serving(server, fake):
    def broken():
        raise RuntimeError("boom")
    fake.topology = broken
    status, body = get(server, "/v1/topology")
    assert status == 500 and body["error"]["code"] == "internal_error"
    assert "boom" not in body["error"]["message"]
    assert get(server, "/v1/health")[0] == 200


# ------------------------------------------------------------ peer identity
def test_peer_credentials_reach_service(server, fake):
    request(server.socket_path, "POST", "/v1/workloads", {"cpus": 1})
    caller = fake.callers[-1]
    assert (caller.pid, caller.uid, caller.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert caller.pidfd is not None and fake.pidfd_was_open[-1]


def test_pidfd_closed_after_request(server, fake):
    request(server.socket_path, "POST", "/v1/workloads", {"cpus": 1})
    fd = fake.callers[-1].pidfd
    # The fd number may have been reused by now; it must not still be a pidfd to us.
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        target = ""
    assert "pidfd" not in target


# ------------------------------------------------------------ hostile input
HOSTILE_BODIES = {
    "malformed json": b'{"cpus": 2',
    "trailing junk": b'{"cpus": 2} x',
    "not an object": b"[1, 2]",
    "empty body": b"",
    "string for int": b'{"cpus": "2"}',
    "float for int": b'{"cpus": 2.0}',
    "bool for int": b'{"cpus": true}',
    "int for bool": b'{"shared": 1}',
    "huge number": b'{"cpus": 99999999999999999999999999}',
    "too many cpus": b'{"cpus": 4097}',
    "negative": b'{"memory_bytes": -1}',
    "memory over 2^50": b'{"memory_bytes": 1125899906842625}',
    "hugepage count over 2^31": b'{"hugepages": {"2048": 2147483649}}',
    "hugepage key not kB": b'{"hugepages": {"2Mi": 1}}',
    "device count zero": b'{"devices": {"gpu": 0}}',
    "device count 65": b'{"devices": {"gpu": 65}}',
    "bad resource name": b'{"devices": {"../gpu": 1}}',
    "unknown field": b'{"cpus": 1, "pid": 1}',
    "unknown budget field": b'{"pod": "p", "pod_budget": {"gpus": 1}}',
    "name with slash": b'{"name": "a/b"}',
    "name dotdot": b'{"name": ".."}',
    "name with NUL": b'{"name": "a\\u0000b"}',
    "name with newline": b'{"name": "ab\\n"}',
    "name with control char": b'{"name": "a\\u001bb"}',
    "name uppercase": b'{"name": "Web"}',
    "name too long": b'{"name": "' + b"a" * 64 + b'"}',
    "pod name with slash": b'{"pod": "../etc"}',
    "bad utf-8": b'{"name": "\xff\xfe"}',
    "bad policy": b'{"policy": "always"}',
    "bad numa-allocation-strategy": b'{"numa_allocation_strategy": "spread"}',
    "cpu list garbage": b'{"physcpubind": "0-3;rm"}',
    "cpu list huge id": b'{"physcpubind": "0-99999999"}',
    "duplicate node": b'{"membind": [0, 0]}',
    "node id too big": b'{"cpunodebind": [5000]}',
    "empty node list": b'{"membind": []}',
    "shared with cpus": b'{"shared": true, "cpus": 2}',
    "budget without pod": b'{"pod_budget": {"cpus": 2}}',
    "NUL in command": b'{"command": ["a\\u0000b"]}',
    # Past any parser's depth (Python's recursion limit is 1000): refused, never a RecursionError.
    "nested arrays": b"[" * 30_000 + b"]" * 30_000,
    "nested in a field": b'{"devices": {"gpu": ' + b"[" * 30_000 + b"]" * 30_000 + b"}}",
    "nested objects": b'{"name": ' + b'{"a": ' * 8_000 + b"1" + b"}" * 8_000 + b"}",
}


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
def test_hostile_body_is_400_and_service_untouched(server, fake, body):
    status, answer = post(server.socket_path, body)
    assert status == 400, answer
    assert answer["error"]["code"] == "bad_request"
    assert answer["error"]["message"]
    assert "admit" not in fake.service_calls()
    assert get(server, "/v1/health")[0] == 200


def test_body_over_64k_is_413(server, fake):
    head = b"POST /v1/workloads HTTP/1.1\r\nContent-Length: 70000\r\n\r\n"
    status, body = send_raw(server.socket_path, head + b"{" + b" " * 69998 + b"}")
    assert status == 413 and "65536" in body["error"]["message"]
    assert fake.calls == []


def test_missing_content_length_is_411(server, fake):
    status, body = send_raw(server.socket_path, b"POST /v1/workloads HTTP/1.1\r\n\r\n{}")
    assert status == 411 and "Content-Length" in body["error"]["message"]
    status, body = send_raw(server.socket_path,
                            b"POST /v1/workloads HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert status == 411
    assert fake.calls == []


@pytest.mark.parametrize("value", [b"abc", b"-1", b"1e3", b"99999999999999999999"])
def test_invalid_content_length_is_400(server, fake, value):
    status, body = send_raw(server.socket_path,
                            b"POST /v1/workloads HTTP/1.1\r\nContent-Length: " + value + b"\r\n\r\n{}")
    assert status in (400, 413)
    assert "Content-Length" in body["error"]["message"] or status == 413
    assert fake.calls == []


def test_conflicting_content_lengths_are_400(server, fake):
    status, body = send_raw(server.socket_path, b"POST /v1/workloads HTTP/1.1\r\n"
                            b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{} ")
    assert status == 400 and "conflicting" in body["error"]["message"]
    assert fake.calls == []


def test_header_flood_is_431(server, fake):
    flood = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    status, body = send_raw(server.socket_path, b"GET /v1/health HTTP/1.1\r\n" + flood + b"\r\n")
    assert status == 431
    huge = b"GET /v1/health HTTP/1.1\r\nX: " + b"a" * 40000 + b"\r\n\r\n"
    status, body = send_raw(server.socket_path, huge)
    assert status == 431
    assert fake.calls == []


@pytest.mark.parametrize("raw", [b"GARBAGE\r\n\r\n", b"GET /v1/health HTTP/2\r\n\r\n",
                                 b"GET /v1/health HTTP/1.1\r\nno-colon\r\n\r\n",
                                 b"GET /v1/h\xffealth HTTP/1.1\r\n\r\n",
                                 b"GET /v1/health HTTP/1.1\r\nX-Name: a\x00b\r\n\r\n",
                                 b"GET /v1/health HTTP/1.1\r\nX-Name: a\x1bb\r\n\r\n",
                                 b"GET /v1/health HTTP/1.1\r\nX-Name: a\x7f\r\n\r\n",
                                 b"GET /v1/hea\x00lth HTTP/1.1\r\n\r\n"])
def test_malformed_head_is_400(server, fake, raw):
    status, body = send_raw(server.socket_path, raw)
    assert status == 400
    assert fake.calls == []


@pytest.mark.parametrize("target", ["/v1/workloads/a%2Fb", "/v1/workloads/..", "/v1/workloads/a%00",
                                    "/v1/workloads/a/b", "/v1/workloads/%ff", "/v1/workloads/a%0a",
                                    "/v1/workloads/"])
def test_release_with_hostile_name_is_400(server, fake, target):
    status, body = request(server.socket_path, "DELETE", target)
    assert status == 400, body
    assert "release" not in fake.service_calls()


@pytest.mark.parametrize("query", ["?request_id=XYZ", "?request_id=" + "a" * 65, "?request_id=", "?force=1",
                                   "?request_id=" + "a" * 32 + "&force=1"])
def test_release_with_a_bad_request_id_query_is_400(server, fake, query):
    status, body = request(server.socket_path, "DELETE", "/v1/workloads/web" + query)
    assert status == 400, body
    assert "release" not in fake.service_calls()


def test_slow_client_does_not_block_others(fake, sock_dir):
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", request_deadline=5.0).start()
    try:
        slow = socket.socket(socket.AF_UNIX)
        slow.connect(srv.socket_path)
        slow.sendall(b"POST /v1/workloads HTTP/1.1\r\nContent-Len")
        # The normal request completes while the slow one is still waiting.
        assert request(srv.socket_path, "GET", "/v1/health")[0] == 200
        slow.setblocking(False)
        with pytest.raises(BlockingIOError):
            slow.recv(1)
        slow.close()
    finally:
        srv.stop()


def test_slow_client_times_out_with_408(server, fake):
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(server.socket_path)
    sock.sendall(b"POST /v1/workloads HTTP/1.1\r\nContent-Length: 10\r\n\r\n{")
    data = sock.recv(4096)
    sock.close()
    assert data.startswith(b"HTTP/1.1 408")
    assert fake.calls == []


def test_connection_cap_answers_503_and_is_logged(fake, sock_dir, caplog):
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", max_connections=1).start()
    try:
        holder = socket.socket(socket.AF_UNIX)
        holder.connect(srv.socket_path)
        holder.sendall(b"GET")  # occupies the only slot
        with caplog.at_level("WARNING", logger="numa_agent.api"):
            status, body = request(srv.socket_path, "GET", "/v1/health", busy_retry=0)
        assert status == 503 and body["error"]["code"] == "busy"
        assert "1 client(s) told to retry" in caplog.text
        holder.close()
    finally:
        srv.stop()


def test_a_client_waits_out_a_busy_agent(fake, sock_dir, capsys):
    """The only slot is taken by a client that never finishes its request; the
    next client retries until the server's deadline frees the slot."""
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", max_connections=1, request_deadline=1.5).start()
    try:
        holder = socket.socket(socket.AF_UNIX)
        holder.connect(srv.socket_path)
        holder.sendall(b"GET")
        status, body = request(srv.socket_path, "GET", "/v1/health")
        assert status == 200 and body["status"] == "ok"
        assert "is busy; retrying" in capsys.readouterr().err
        holder.close()
    finally:
        srv.stop()


# ------------------------------------------------------------ socket file
def test_socket_mode_and_group(fake, sock_dir):
    group = grp.getgrgid(os.getgid()).gr_name if os.getuid() else "daemon"
    srv = ApiServer(fake, f"{sock_dir}/agent.sock", socket_mode=0o660, socket_group=group).start()
    try:
        st = os.stat(srv.socket_path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == grp.getgrnam(group).gr_gid
        assert not [f for f in os.listdir(sock_dir) if f.endswith(".tmp")]
    finally:
        srv.stop()
    assert not os.path.exists(f"{sock_dir}/agent.sock")


def test_unknown_group_is_a_clear_error(fake, sock_dir):
    with pytest.raises(ValueError, match="socket group 'no-such-group-xyz' does not exist"):
        ApiServer(fake, f"{sock_dir}/agent.sock", socket_group="no-such-group-xyz").start()


def test_stale_socket_is_replaced(fake, sock_dir):
    path = f"{sock_dir}/agent.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)  # a crashed agent leaves the file behind, nobody listening
    dead.close()
    assert os.path.exists(path)
    assert_served_on(fake, path)


def assert_served_on(fake, path):
    srv = ApiServer(fake, path).start()
    try:
        assert request(path, "GET", "/v1/health")[0] == 200
    finally:
        srv.stop()


def test_live_socket_is_refused(server, sock_dir):
    other = ApiServer(FakeService(), server.socket_path)
    with pytest.raises(SocketInUse, match="another agent is already serving on .*agent.sock"):
        other.start()
    assert request(server.socket_path, "GET", "/v1/health")[0] == 200


def test_non_socket_file_is_not_replaced(fake, sock_dir):
    path = f"{sock_dir}/agent.sock"
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(SocketInUse, match="exists and is not a socket"):
        ApiServer(fake, path).start()
    assert open(path).read() == "precious"


def test_a_socket_path_that_fits_sun_path_is_served(fake, sock_dir):
    """Any path of up to 107 bytes (sun_path holds 108 with its NUL) is served,
    however the agent names the socket before it is moved into place."""
    path = f"{sock_dir}/" + "a" * (107 - len(sock_dir) - len("/.sock")) + ".sock"
    assert len(path) == 107
    assert_served_on(fake, path)


def test_a_socket_path_too_long_for_sun_path_is_a_clear_error(fake, sock_dir):
    path = f"{sock_dir}/" + "a" * (108 - len(sock_dir) - len("/.sock")) + ".sock"
    with pytest.raises(ValueError, match=r"is 108 bytes, longer than a Unix socket's 107: choose a shorter --socket"):
        ApiServer(fake, path).start()
    assert os.listdir(sock_dir) == []


@pytest.mark.parametrize("planted", ["a file", "a live socket"])
def test_a_socket_directory_others_can_write_is_refused_whatever_was_planted_in_it(fake, sock_dir, planted):
    """The directory is the configuration to fix (exit 78 naming it): a file or
    a listening socket another user put at the name must not turn that into
    'exists and is not a socket' or 'another agent is already serving'."""
    from numa_agent.state.trusted_dir import UntrustedDirectory

    os.chmod(sock_dir, 0o777)
    path = f"{sock_dir}/agent.sock"
    listener = socket.socket(socket.AF_UNIX)
    if planted == "a file":
        open(path, "w").close()
    else:
        listener.bind(path)
        listener.listen(1)
    try:
        with pytest.raises(UntrustedDirectory, match=f"socket directory {sock_dir} is writable by its group"):
            ApiServer(fake, path).start()
    finally:
        listener.close()


# ------------------------------------------------------------ client
def test_client_unreachable_names_path_and_remedy(sock_dir):
    path = f"{sock_dir}/missing.sock"
    with pytest.raises(AgentUnreachable) as info:
        request(path, "GET", "/v1/health", busy_retry=0)
    message = str(info.value)
    assert path in message and "No such file" in message and "numa-agent serve" in message


def test_status_and_listing_are_asked_on_behalf_of_the_caller(server, fake):
    request(server.socket_path, "GET", "/v1/status")
    request(server.socket_path, "GET", "/v1/workloads")
    assert [name for name, _ in fake.calls[-2:]] == ["status", "list_workloads"]
    assert fake.viewers[-2:] == [os.getuid(), os.getuid()]


def test_socket_and_its_new_directory_keep_their_modes_under_a_private_umask(fake, tmp_path):
    # The unit runs the agent with UMask=0077: clients must still reach the socket.
    old = os.umask(0o077)
    try:
        srv = ApiServer(fake, f"{tmp_path}/new/dir/agent.sock", socket_mode=0o660).start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o755
        assert stat.S_IMODE(os.stat(tmp_path / "new/dir").st_mode) == 0o755
        assert stat.S_IMODE(os.stat(srv.socket_path).st_mode) == 0o660
    finally:
        srv.stop()


def test_the_peers_supplementary_groups_are_read_from_the_socket():
    import socket as socket_module

    from numa_agent.api.server import peer_groups

    a, b = socket_module.socketpair(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    with a, b:
        assert set(peer_groups(a)) == set(os.getgroups())
