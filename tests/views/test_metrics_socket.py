"""`metrics_address = "unix:PATH"`: /metrics on a Unix socket with the API socket's
mode and group (loopback TCP is readable by every local user; the socket, only by
that group), and no TCP port at all."""

from __future__ import annotations

import grp
import os
import socket
import stat
from pathlib import Path

import pytest

from numa_agent.daemon.config import ConfigError, config_from_mapping
from tests.support.agent_process import AgentProcess, wait_for


def scrape_unix(path: str) -> str:
    """What `curl --unix-socket PATH http://localhost/metrics` gets."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def listening_tcp_inodes() -> set[str]:
    """Socket inodes of every TCP socket listening in this network namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                inodes.add(fields[9])
    return inodes


def socket_inodes_of(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def a_group_other_than_ours() -> grp.struct_group:
    return next(g for g in grp.getgrall() if g.gr_gid != os.getgid())


def test_the_agent_serves_metrics_on_a_unix_socket_and_opens_no_tcp_port(tmp_path):
    group = a_group_other_than_ours()
    path = str(tmp_path / "metrics.sock")
    agent = AgentProcess(tmp_path, "--cgroup-root", "none", "--metrics-address", f"unix:{path}",
                         config=f'[agent]\nsocket_mode = "0640"\nsocket_group = "{group.gr_name}"\n').start()
    try:
        assert wait_for(lambda: os.path.exists(path))  # placed just after the API answers
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == group.gr_gid  # as the API socket's
        api = os.stat(agent.socket)
        assert (stat.S_IMODE(api.st_mode), api.st_gid) == (0o640, group.gr_gid)
        assert "numa_agent_cpus" in scrape_unix(path)
        assert not socket_inodes_of(agent.proc.pid) & listening_tcp_inodes()
        assert f"serving metrics on unix:{path}" in agent.log()
    finally:
        assert agent.stop() == 0
    assert not os.path.exists(path)  # given back at stop


def test_a_relative_or_empty_socket_path_is_a_configuration_error():
    for address in ("unix:metrics.sock", "unix:"):
        with pytest.raises(ConfigError, match="agent.metrics_address: .*expected unix:/ABSOLUTE/PATH"):
            config_from_mapping({"agent": {"metrics_address": address}})
    assert config_from_mapping({"agent": {"metrics_address": "unix:/run/m.sock"}}).metrics_address == \
        "unix:/run/m.sock"
