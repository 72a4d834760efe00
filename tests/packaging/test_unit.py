"""The shipped systemd units: `systemd-analyze verify` offline, plus the settings the
agent's behaviour depends on. Needs the `systemd` Debian package (systemd-analyze);
PID 1 does not have to be systemd."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from numa_agent.cli.serve_cmd import EX_CONFIG

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
    for path in ("usr/local/bin/numa-agent", "bin/sleep", "bin/kill"):
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
    # `systemctl reload`: SIGHUP re-reads the configuration (the agent's RELOADING=1, READY=1).
    assert one("Service.ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one("Service.Restart") == "on-failure"
    # numa-agent serve's exit for a configuration error (cli/serve_cmd.py): never restarted.
    assert one("Service.RestartPreventExitStatus") == str(EX_CONFIG)
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
    # Files made without an explicit mode are private; the agent sets the socket's,
    # its directory's and the cgroup directories' modes itself.
    assert one("Service.UMask") == "0077"
    # The agent opens no device node; its cgroup holds no workload, so the device
    # filter these install confines the agent alone.
    for key in ("PrivateMounts", "PrivateDevices", "ProtectClock"):
        assert one(f"Service.{key}") == "yes", key
    # Metrics on loopback by default (a drop-in opens another address).
    assert one("Service.IPAddressDeny") == "any"
    assert one("Service.IPAddressAllow") == "localhost"
    # These would block cgroup writes, or limit the administrator's housekeeping CPUs.
    for forbidden in ("ProtectKernelTunables", "ProtectControlGroups", "AllowedCPUs", "MemoryMax"):
        assert f"Service.{forbidden}" not in s, forbidden
    assert one("Install.WantedBy") == "multi-user.target"


@needs_analyze
def test_socket_verifies_cleanly(root):
    rc, lines = verify(root, "numa-agent.socket")
    assert rc == 0, lines
    assert _unexpected(lines) == []


def test_socket_unit_matches_what_the_agent_serves():
    from numa_agent.api.server import LISTEN_FD_NAME
    from numa_agent.daemon.config import DEFAULT_SOCKET, AgentConfig

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


# ---- hardening ----------------------------------------------------------------------
EXPOSURE_TARGET = 2.5
DROP_IN = REPO / "systemd" / "affinity-fallback.conf"
_CAPABILITY = re.compile(r"CAP_[A-Z_]+")


def security(root: Path) -> tuple[float, list[str]]:
    """`systemd-analyze security --offline=yes` of the installed unit: the overall
    exposure and the names of the checks it fails (the lines marked ✗)."""
    if _systemd_version() < 250:
        pytest.skip("systemd-analyze security --offline= needs systemd 250 or newer")
    proc = subprocess.run(
        [ANALYZE, "security", "--offline=yes", f"--root={root}", "--no-pager", "numa-agent.service"],
        capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout + proc.stderr
    m = re.search(r"Overall exposure level for numa-agent\.service: (\d+\.\d+)", out)
    assert m, out
    failed = [line.split()[1] for line in out.splitlines() if line.startswith("✗")]
    return float(m.group(1)), failed


@needs_analyze
def test_security_exposure_is_at_most_the_target(root):
    exposure, failed = security(root)
    assert exposure <= EXPOSURE_TARGET, (exposure, failed)


@needs_analyze
def test_security_check_catches_a_weaker_unit(root):
    # The measurement itself must be able to fail: the unit without its capability list.
    unit = root / "etc/systemd/system/numa-agent.service"
    unit.write_text("\n".join(line for line in unit.read_text().splitlines()
                              if not line.startswith("CapabilityBoundingSet=")) + "\n")
    exposure, _ = security(root)
    assert exposure > EXPOSURE_TARGET


@needs_analyze
def test_every_directive_left_out_has_its_reason_in_the_unit(root):
    _, failed = security(root)
    assert failed, "systemd-analyze found nothing to report: the parser is broken"
    text = UNIT.read_text()
    for check in failed:
        for directive in re.findall(r"([A-Za-z]+)=", check):
            assert re.search(rf"^#.*\b{directive}=", text, re.M) or \
                re.search(rf"^{directive}=", text, re.M), f"{check}: {directive} neither set nor explained"


@pytest.mark.parametrize("path", [UNIT, DROP_IN], ids=lambda p: p.name)
def test_every_capability_kept_has_its_reason_above_it(path):
    lines = path.read_text().splitlines()
    kept = [(i, line) for i, line in enumerate(lines) if line.startswith("CapabilityBoundingSet=")]
    assert kept, f"{path.name} keeps no capability"
    for i, line in kept:
        caps = _CAPABILITY.findall(line.partition("=")[2])
        assert len(caps) == 1, f"one capability per line, each with its reason: {line}"
        block = []  # the comment lines right above it
        while i - len(block) - 1 >= 0 and lines[i - len(block) - 1].startswith("#"):
            block.append(lines[i - len(block) - 1])
        reasons = [c for c in block if re.match(r"# CAP_[A-Z_]+: ", c)]
        assert reasons and reasons[0].startswith(f"# {caps[0]}: "), f"{caps[0]} has no reason above it"


def test_capabilities_as_the_guest_reads_them_from_the_unit_and_the_drop_in():
    # tests/vm_e2e/systemd_scenarios.py compares this with the running agent's CapBnd.
    from numa_agent.enforcement.processes import AFFINITY_CAPABILITIES
    from tests.vm_e2e.systemd_scenarios import declared_capabilities

    unit = declared_capabilities(UNIT.read_text())
    assert unit == {"CAP_CHOWN", "CAP_SYS_NICE"}
    # With the drop-in, the affinity fallback has all it needs.
    assert unit | declared_capabilities(DROP_IN.read_text()) >= set(AFFINITY_CAPABILITIES)
