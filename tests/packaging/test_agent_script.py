"""`scripts/agent` runs on the bundled simulated machine by default and on this host with
`--real`; what it hands `numa-agent serve` is read from a stand-in `numa-agent`."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = "tests/fixtures/sysfs/intel-snb-2s-2numa-pci-nvme-nic.tar.gz"


def run_agent_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    stub = tmp_path / "bin" / "numa-agent"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    # .venv/bin already on PATH: bootstrap.sh leaves PATH alone, so the stand-in comes first.
    path = os.pathsep.join([str(stub.parent), str(REPO / ".venv" / "bin"), "/usr/bin", "/bin"])
    return subprocess.run([str(REPO / "scripts" / "agent"), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PATH": path})


def option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == name]


def test_no_flag_simulates_the_bundled_two_node_machine(tmp_path):
    out = run_agent_script(tmp_path)
    argv = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert argv[0] == "serve" and option(argv, "--sysfs-root") == [SNAPSHOT]
    assert (REPO / SNAPSHOT).is_file()
    assert option(argv, "--state-dir") == [".run/simulated/state"]
    assert option(argv, "--socket") == [".run/simulated/agent.sock"]
    assert option(argv, "--metrics-address") == ["127.0.0.1:9465"]
    assert f"machine simulated: {SNAPSHOT}" in out.stderr and "--real" in out.stderr


def test_real_runs_on_this_host_and_is_not_passed_on(tmp_path):
    out = run_agent_script(tmp_path, "--real", "--log-level", "debug")
    argv = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert "--real" not in argv and option(argv, "--sysfs-root") == []
    assert option(argv, "--state-dir") == [".run/state"] and option(argv, "--socket") == [".run/agent.sock"]
    assert option(argv, "--metrics-address") == ["127.0.0.1:9464"] and option(argv, "--log-level") == ["debug"]


def test_a_sysfs_root_given_replaces_the_bundled_one(tmp_path):
    other = "tests/fixtures/sysfs/power9-2s-smt4-gpu-numa-nodes.tar.gz"
    out = run_agent_script(tmp_path, "--sysfs-root", other)
    argv = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert option(argv, "--sysfs-root") == [other] and option(argv, "--state-dir") == [".run/simulated/state"]


def test_real_with_a_sysfs_root_is_refused_in_one_line(tmp_path):
    out = run_agent_script(tmp_path, "--real", "--sysfs-root", SNAPSHOT)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "--real" in out.stderr and "--sysfs-root" in out.stderr
