"""Quotas end to end: the real agent with a [quotas] entry for the user running
the tests. numa-run exits 125 naming the quota, the API answers 403, explain
would refuse, and status shows the owner's use against its limit."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from tests.support.agent_process import AgentProcess, numa_run, wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def agent(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=4 << 30)
    root = write_sysfs(topo, tmp_path / "machine")
    # users.<name> applies to anyone, root included
    a = AgentProcess(tmp_path, "--sysfs-root", str(root),
                     config=f'[quotas]\nusers."{ME}" = {{ cpus = 1 }}\n').start()
    yield a
    a.stop()


def agent_cli(agent, *args):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", *args, "--socket", agent.socket],
                          capture_output=True, text=True, timeout=30)


def test_over_the_quota_numa_run_exits_125_and_the_api_answers_403(agent):
    reason = f"quota users.{ME}: cpus limit 1; {ME} holds 0 and the request asks 2 more"
    run = numa_run(agent.socket, "--cpus", "2", "--", "true")
    assert run.returncode == 125, run.stderr
    assert run.stderr.splitlines()[0] == f"numa-run: refused: {reason}"
    code, body = agent.call("POST", "/v1/workloads", {"name": "over", "cpus": 2})
    assert code == 403
    assert body["error"]["code"] == "quota_exceeded" and body["error"]["message"] == reason
    assert body["error"]["details"]["quota"] == {"entry": f"users.{ME}", "resource": "cpus", "limit": 1,
                                                 "held": 0, "asked": 2}
    explain = agent_cli(agent, "explain", "--cpus", "2")
    assert explain.returncode == 1 and explain.stdout.splitlines()[0] == f"would refuse: {reason}"
    assert f"refused over for uid {os.getuid()}" in agent.log() and reason in agent.log()


def test_status_shows_the_owners_use_against_its_limit(agent):
    kept = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                             "--name", "held", "--cpus", "1", "--", "sleep", "60"])
    try:
        def quotas():  # once numa-run booked (and exec'd sleep); an early exit ends the wait
            return "numa-run exited" if kept.poll() is not None else agent.call("GET", "/v1/status")[1]["quotas"]

        assert wait_for(quotas, timeout=20) == [
            {"owner_uid": os.getuid(), "owner": ME, "cpus": {"used": 1, "limit": 1, "entry": f"users.{ME}"},
             "memory_bytes": {"used": 0, "limit": None, "entry": None}, "devices": {}}]
        status = agent_cli(agent, "status")
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        row = lines[lines.index("use per owner:") + 2].split()
        assert row == [ME, "1", "of", "1", f"(users.{ME})", "0", "B", "-"]
    finally:
        kept.kill()
        kept.wait()
