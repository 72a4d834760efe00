"""End to end in the affinity fallback: the agent is killed, its checkpoint is
damaged and the previous generation removed; on restart the running workload
is rebuilt from its process, and its CPU is not handed out again."""

import os
import subprocess
import sys

import pytest

from numa_agent.core.cpuset import CpuSet
from tests.state.test_checkpoint_generations import DAMAGE
from tests.support.agent_process import AgentProcess, numa_run, wait_for

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="needs 2 CPUs: one reserved, one to hand out")


def workloads(agent):
    status, body = agent.call("GET", "/v1/workloads")
    assert status == 200
    return body["workloads"]


def allowed_cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("Cpus_allowed_list"))
    return CpuSet.parse(line.split()[1])


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_lost_checkpoint_is_rebuilt_from_the_running_workload(tmp_path, damage):
    agent = AgentProcess(tmp_path / "agent", "--cgroup-root", "none").start()
    proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                             "--cpus", "1", "--", "sleep", "60"])
    try:
        (before,) = wait_for(lambda: workloads(agent), timeout=10)
        cpus = CpuSet.parse(before["cpus"])
        assert before["pid"] == proc.pid and allowed_cpus(proc.pid) == cpus
        # a second generation of the checkpoint, so that there is a .prev to remove
        assert numa_run(agent.socket, "--shared", "--", "true").returncode == 0
        agent.kill()  # kill -9
        checkpoint = agent.state_dir / "checkpoint.json"
        DAMAGE[damage](checkpoint)
        (agent.state_dir / "checkpoint.json.prev").unlink()

        agent.start()
        (after,) = workloads(agent)
        assert (after["name"], after["pid"], after["cpus"]) == (before["name"], proc.pid, before["cpus"])
        assert after["exclusive"] and after["rebuilt"] == "partial"
        assert after["owner_uid"] == before["owner_uid"]
        log = agent.log()
        assert "rebuilding from the cgroup tree" not in log
        assert f"rebuilt workload {before['name']} from pid {proc.pid}" in log
        status, body = agent.call("GET", "/v1/status")
        assert status == 200 and body["quarantined"] == []

        # The next exclusive request gets another CPU or is refused; never the same one.
        probe = ("import os,sys;sys.stdout.write(','.join(map(str, sorted(os.sched_getaffinity(0)))))")
        r = numa_run(agent.socket, "--cpus", "1", "--", sys.executable, "-c", probe)
        if r.returncode == 0:
            assert CpuSet.parse(r.stdout).isdisjoint(cpus), r.stdout
        else:
            assert r.returncode == 125 and "requested 1" in r.stderr, r.stderr
        assert allowed_cpus(proc.pid) == cpus

        # still followed: its exit releases it
        proc.kill()
        proc.wait()
        assert wait_for(lambda: workloads(agent) == [], timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.stop()
