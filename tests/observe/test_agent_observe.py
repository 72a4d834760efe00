"""The real agent on a written machine (`--sysfs-root`): its intruder scan runs on
its own timer over the tree's proc/, and status and the metrics report it."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

from numa_agent.core.cpuset import CpuSet
from tests.observe.proc_tree import add_task
from tests.support.agent_process import AgentProcess, wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs


@pytest.fixture
def machine(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=4 << 30)
    return write_sysfs(topo, tmp_path / "machine")


def _agent(tmp_path, machine, seconds: str) -> AgentProcess:
    (tmp_path / "agent").mkdir()
    return AgentProcess(tmp_path / "agent", "--sysfs-root", str(machine),
                        config=f"[observe]\nintruder_scan_seconds = {seconds}\n").start()


def _admit(agent, name):
    code, body = agent.call("POST", "/v1/workloads", {"name": name, "cpus": 2})
    assert code == 201, body
    return body


def _intruders(agent, name):
    code, body = agent.call("GET", "/v1/status")
    assert code == 200
    return next(w for w in body["workloads"] if w["name"] == name)["intruders"]


def test_an_intruder_is_listed_counted_and_gone_when_it_goes(tmp_path, machine):
    agent = _agent(tmp_path, machine, "0.1")
    try:
        wl = _admit(agent, "db")
        cpu = CpuSet.parse(wl["cpus"]).ids()[-1]
        proc = machine / "proc"
        add_task(proc, 4242, 4242, "spin", cpu, "0-7", cgroup="/user.slice")
        listed = wait_for(lambda: _intruders(agent, "db"), timeout=20, interval=0.1)
        assert listed == [{"pid": 4242, "tid": 4242, "command": "spin", "cpu": cpu}], agent.log()
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'numa_agent_exclusive_cpu_intruders{workload="db"} 1.0' in metrics
        out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--socket",
                              agent.socket], capture_output=True, text=True, timeout=30)
        assert f"INTRUDER on db's CPU {cpu}: pid 4242 tid 4242 (spin)" in out.stdout
        (proc / "4242" / "task" / "4242" / "stat").unlink()  # it exits
        assert wait_for(lambda: not _intruders(agent, "db"), timeout=20, interval=0.1)
        assert agent.log().count("pid 4242 tid 4242 (spin)") == 1
    finally:
        agent.stop()


def test_scan_off_shows_no_scan(tmp_path, machine):
    agent = _agent(tmp_path, machine, "0")
    try:
        _admit(agent, "db")
        code, body = agent.call("GET", "/v1/status")
        assert body["observe"]["intruder_scan_seconds"] == 0 and body["observe"]["last_scan"] is None
        assert body["workloads"][0]["memory_numa"] is None  # the simulated tree has no memory.numa_stat
    finally:
        agent.stop()


def _metrics(agent) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_the_metrics_report_memory_per_node_sampled_on_the_agents_timer(tmp_path, machine):
    agent = _agent(tmp_path, machine, "0.1")
    try:
        wl = _admit(agent, "db")
        (directory,) = (tmp_path / "agent").rglob("wl-db")  # in the simulated cgroup tree
        node = wl["numa_nodes"][0]
        (directory / "memory.numa_stat").write_text(f"anon N{node}=4096\nfile N{node}=0\n")
        line = f'numa_agent_workload_memory_bytes{{numa_node="{node}",workload="db"}} 4096.0'
        assert wait_for(lambda: line in _metrics(agent), timeout=20, interval=0.1), agent.log()
        assert agent.call("DELETE", "/v1/workloads/db")[0] == 200
        assert 'workload="db"' not in _metrics(agent)  # released: gone at once, not at the next sample
    finally:
        agent.stop()
