"""The real agent on a snapshot of another machine (`--sysfs-root`), enforcing
into the simulated cgroup tree: it says so, and it releases a workload when
its process exits, with nothing else happening in the agent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.agent_process import AgentProcess, numa_run, wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


@pytest.fixture
def agent(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=1,
                         memory_per_node_bytes=4 << 30)
    root = write_sysfs(topo, tmp_path / "machine")
    a = AgentProcess(tmp_path / "agent", "--sysfs-root", str(root)).start()
    yield a
    a.stop()


def workloads(agent):
    code, body = agent.call("GET", "/v1/workloads")
    assert code == 200
    return body["workloads"]


def test_an_exited_workload_is_released_while_the_agent_is_idle(agent):
    run = numa_run(agent.socket, "--cpus", "1", "--", "sleep", "0.3")
    assert run.returncode == 0, run.stderr
    # Nobody asks the agent anything meanwhile: only the exit can tell it.
    assert wait_for(lambda: not workloads(agent), timeout=20, interval=0.1), \
        f"still booked: {workloads(agent)}\n{agent.log()}"


def test_numa_run_and_status_name_the_simulated_tree(agent):
    run = numa_run(agent.socket, "--cpus", "1", "-v", "--", "true")
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines()[0].endswith("(simulated)")  # the binding line (memory follows)
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status",
                          "--socket", agent.socket], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("enforcement: simulated")
