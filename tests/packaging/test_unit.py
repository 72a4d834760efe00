"""The shipped systemd units: `systemd-analyze verify` offline, plus the settings the
agent's behaviour depends on. Needs the `systemd` Debian package (systemd-analyze);
PID 1 does not have to be systemd."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "numa-agent.service"
SLICE = REPO / "systemd" / "numa-agent.slice"
SOCKET = REPO / "systemd" / "numa-agent.socket"
WORKLOADS = REPO / "systemd" / "numa-agent-workloads.service"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (Debian package: systemd)"
)


def _systemd_version() -> int:
    out = subprocess.run([ANALYZE, "--version"], capture_output=True, text=True, check=True).stdout
    return int(re.match(r"systemd (\d+)", out).group(1))


def _host_unit_dir() -> Path:
    for candidate in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        if Path(candidate, "sysinit.target").exists():
            return Path(candidate)
    pytest.skip("systemd's own units (sysinit.target) not found on this host")


@pytest.fixture
def root(tmp_path):
    """A throwaway root with systemd's stock units, ours in /etc, and the ExecStart binary."""
    shutil.copytree(_host_unit_dir(), tmp_path / "usr/lib/systemd/system", symlinks=True)
    etc = tmp_path / "etc/systemd/system"
    etc.mkdir(parents=True)
    shutil.copy(UNIT, etc)
    shutil.copy(SLICE, etc)
    shutil.copy(SOCKET, etc)
    shutil.copy(WORKLOADS, etc)
    for path in ("usr/local/bin/numa-agent", "bin/sleep"):
        binary = tmp_path / path
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\nexit 0\n")
        binary.chmod(0o755)
    return tmp_path


def verify(root: Path, unit: str) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [ANALYZE, "verify", "--man=no", f"--root={root}", f"/etc/systemd/system/{unit}"],
        capture_output=True, text=True, timeout=120,
    )
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return proc.returncode, lines


def _unexpected(lines: list[str]) -> list[str]:
    # DelegateSubgroup= exists from systemd 254 on; older versions warn and ignore it
    # (the agent then moves itself into agent/ on its own).
    allowed = []
    if _systemd_version() < 254:
        allowed.append("Unknown key 'DelegateSubgroup'")
    return [line for line in lines if not any(a in line for a in allowed)]


@needs_analyze
def test_service_verifies_cleanly(root):
    rc, lines = verify(root, "numa-agent.service")
    assert rc == 0, lines
    assert _unexpected(lines) == []


@needs_analyze
def test_slice_verifies_cleanly(root):
    rc, lines = verify(root, "numa-agent.slice")
    assert rc == 0, lines
    assert _unexpected(lines) == []


@needs_analyze
def test_workloads_unit_verifies_cleanly(root):
    rc, lines = verify(root, "numa-agent-workloads.service")
    assert rc == 0, lines
    assert _unexpected(lines) == []


@needs_analyze
def test_verify_catches_a_missing_binary_and_bad_values(root):
    # The harness itself must be able to fail.
    (root / "usr/local/bin/numa-agent").unlink()
    rc, lines = verify(root, "numa-agent.service")
    assert rc != 0 and any("is not executable" in line for line in lines)

    unit = root / "etc/systemd/system/numa-agent.service"
    unit.write_text(unit.read_text().replace("KillMode=process", "KillMode=bogus"))
    (root / "usr/local/bin/numa-agent").write_text("#!/bin/sh\n")
    (root / "usr/local/bin/numa-agent").chmod(0o755)
    _, lines = verify(root, "numa-agent.service")
    assert any("kill mode" in line for line in _unexpected(lines))


def _settings(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def test_service_settings_the_agent_relies_on():
    s = _settings(UNIT)

    def one(key):
        assert key in s, f"{key} missing"
        return s[key][-1]

    assert one("Service.Type") == "notify"
    assert one("Service.NotifyAccess") == "main"
    assert one("Service.ExecStart") == "/usr/local/bin/numa-agent serve --config /etc/numa-agent/config.toml"
    assert one("Service.KillMode") == "process"
    assert one("Service.Restart") == "on-failure"
    # The workloads live in a unit of their own, which the agent cannot run without.
    assert one("Service.Environment") == "NUMA_AGENT_WORKLOADS_UNIT=numa-agent-workloads.service"
    assert "numa-agent-workloads.service" in one("Unit.Requires").split()
    assert "numa-agent-workloads.service" in " ".join(s["Unit.After"]).split()
    assert "Service.Delegate" not in s  # the agent's own cgroup has no children
    assert one("Service.WatchdogSec") == "30s"
    assert one("Service.RuntimeDirectory") == "numa-agent"
    assert one("Service.StateDirectory") == "numa-agent"
    assert one("Service.ConfigurationDirectory") == "numa-agent"
    assert one("Service.Slice") == "numa-agent.slice"
    assert one("Service.ProtectSystem") == "strict"
    assert "/sys/fs/cgroup" in one("Service.ReadWritePaths").split()
    assert set(one("Service.RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    for key in ("ProtectHome", "PrivateTmp", "NoNewPrivileges", "LockPersonality",
                "MemoryDenyWriteExecute", "RestrictRealtime"):
        assert one(f"Service.{key}") == "yes", key
    assert one("Service.SystemCallArchitectures") == "native"
    # These would block cgroup writes or put a device filter over every workload.
    for forbidden in ("ProtectKernelTunables", "ProtectControlGroups", "PrivateDevices",
                      "ProtectClock", "DevicePolicy", "DeviceAllow", "AllowedCPUs", "MemoryMax"):
        assert f"Service.{forbidden}" not in s, forbidden
    assert one("Install.WantedBy") == "multi-user.target"


@needs_analyze
def test_socket_verifies_cleanly(root):
    rc, lines = verify(root, "numa-agent.socket")
    assert rc == 0, lines
    assert _unexpected(lines) == []


def test_socket_unit_matches_what_the_agent_serves():
    from numa_agent.api.server import LISTEN_FD_NAME
    from numa_agent.service.config import DEFAULT_SOCKET, AgentConfig

    s = _settings(SOCKET)
    defaults = AgentConfig()
    assert s["Socket.ListenStream"] == [DEFAULT_SOCKET]
    assert int(s["Socket.SocketMode"][-1], 8) == defaults.socket_mode
    assert s["Socket.SocketGroup"][-1] == (defaults.socket_group or "root")
    assert s["Socket.FileDescriptorName"][-1] == LISTEN_FD_NAME
    assert s["Socket.RemoveOnStop"][-1] == "yes"
    assert s["Install.WantedBy"][-1] == "sockets.target"
    # The socket's directory must survive the service stopping while the socket unit holds it.
    assert _settings(UNIT)["Service.RuntimeDirectoryPreserve"][-1] == "yes"


def test_workloads_unit_settings():
    s = _settings(WORKLOADS)
    one = lambda key: s[key][-1]  # noqa: E731
    assert one("Service.Delegate") == "yes"
    assert one("Service.Slice") == "numa-agent.slice"
    # Never restarted with the agent, never kills a workload, no limit over all of them.
    assert one("Service.KillMode") == "process"
    assert one("Unit.RefuseManualStop") == "yes"
    assert one("Service.OOMPolicy") == "continue"
    assert one("Service.TasksMax") == "infinity"
    for forbidden in ("AllowedCPUs", "MemoryMax", "DevicePolicy", "DeviceAllow", "CPUQuota"):
        assert f"Service.{forbidden}" not in s, forbidden
