"""--isolate end to end on a written machine: the real agent (simulated mode, so the tree's
knobs are only ever read) and the real numa-run."""

import json
import subprocess
import sys
import time

import pytest

from tests.support.agent_process import AgentProcess
from tests.support.isolation_tree import machine, snapshot
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    work = tmp_path_factory.mktemp("isolation-agent")
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    root = machine(write_sysfs(topo, work / "machine"), cpus=16)
    a = AgentProcess(work, "--sysfs-root", str(root)).start()
    a.root = root
    yield a
    a.stop()


def numa_run(agent, *options, command=("true",)):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket, *options,
                           "--", *command], capture_output=True, text=True, timeout=60)


def isolation_status(agent):
    code, body = agent.call("GET", "/v1/status")
    assert code == 200
    return body["isolation"]


def test_numa_run_isolate_says_what_it_did_and_the_agent_restores_after_exit(agent):
    before = snapshot(agent.root)
    r = numa_run(agent, "--cpus", "2", "--isolate", "irqs,idle,freq", "-v")
    assert r.returncode == 0, r.stderr
    assert "numa-run: isolation (irqs, idle, freq): irqs, idle done" in r.stderr
    assert "numa-run: isolation not done: freq: not available on this machine" in r.stderr
    deadline = time.monotonic() + 20
    while isolation_status(agent)["knobs_held"] and time.monotonic() < deadline:
        time.sleep(0.05)  # released when `true` exits, the knobs with it
    assert isolation_status(agent)["knobs_held"] == 0
    assert snapshot(agent.root) == before  # simulated: the tree itself is never written


def test_strict_refusal_exits_125_and_books_nothing(agent):
    r = numa_run(agent, "--cpus", "2", "--isolate", "freq", "--isolate-strict", "--json")
    assert r.returncode == 125
    error = json.loads(r.stdout)["error"]
    assert error["code"] == "admission_refused" and "freq: not available on this machine" in error["message"]
    assert error["details"]["reason_code"] == "isolation_unavailable"
    code, body = agent.call("GET", "/v1/workloads")
    assert code == 200 and body["workloads"] == []


def test_isolate_on_the_shared_pool_is_a_usage_error(agent):
    r = numa_run(agent, "--shared", "--isolate", "irqs")
    assert r.returncode == 125 and "--isolate needs exclusive CPUs" in r.stderr
