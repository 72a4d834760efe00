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


def workloads(agent, pid=None):
    """The agent's workloads (`pid`: only that process's). On restart the agent
    takes in every marked process of the machine, so another agent's test
    running at the same time could show up too."""
    status, body = agent.call("GET", "/v1/workloads")
    assert status == 200
    return [w for w in body["workloads"] if pid is None or w["pid"] == pid]


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
        (before,) = wait_for(lambda: workloads(agent, proc.pid), timeout=10)
        cpus = CpuSet.parse(before["cpus"])
        assert before["pid"] == proc.pid and allowed_cpus(proc.pid) == cpus
        # numa-run exec'd the command with the agent's token for it
        assert wait_for(lambda: b"NUMA_AGENT_MARK=" in open(f"/proc/{proc.pid}/environ", "rb").read(),
                        timeout=10)
        # a second generation of the checkpoint, so that there is a .prev to remove
        assert numa_run(agent.socket, "--shared", "--", "true").returncode == 0
        agent.kill()  # kill -9
        checkpoint = agent.state_dir / "checkpoint.json"
        DAMAGE[damage](checkpoint)
        (agent.state_dir / "checkpoint.json.prev").unlink(missing_ok=True)  # the journal may hold it all

        agent.start()
        (after,) = workloads(agent, proc.pid)
        assert (after["name"], after["pid"], after["cpus"]) == (before["name"], proc.pid, before["cpus"])
        assert after["exclusive"] and after["rebuilt"] == "partial"
        assert after["owner_uid"] == before["owner_uid"]
        log = agent.log()
        assert "rebuilding from the cgroup tree" not in log
        assert f"rebuilt workload {before['name']} from pid {proc.pid}" in log
        status, body = agent.call("GET", "/v1/status")
        assert status == 200 and not [q for q in body["quarantined"] if q["pid"] == proc.pid]

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
        assert wait_for(lambda: workloads(agent, proc.pid) == [], timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.stop()


def test_a_process_that_cannot_be_attributed_is_held_until_root_releases_it(tmp_path):
    """Its affinity (CPU 1) is not what it was given (0-1): exclusive or shared
    cannot be told, so CPU 1 is held, reported, and freed only by release."""
    stray = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.sched_setaffinity(0, {1}),
                             env={**os.environ, "NUMA_AGENT_WORKLOAD": "stray", "NUMA_AGENT_CPUS": "0-1"})
    agent = AgentProcess(tmp_path / "agent", "--cgroup-root", "none")
    try:
        agent.start()
        status, body = agent.call("GET", "/v1/status")
        assert [(q["name"], q["cpus"]) for q in body["quarantined"] if q["pid"] == stray.pid] == [("stray", "1")]
        assert workloads(agent, stray.pid) == []
        health = agent.call("GET", "/v1/health")[1]
        assert {"name": "stray", "cpus": "1", "pid": stray.pid} in health["quarantined"]
        assert f"pid {stray.pid} (NUMA_AGENT_WORKLOAD=stray, CPUs 1)" in agent.log()
        r = numa_run(agent.socket, "--cpus", "1", "--", "true")
        assert r.returncode == 125 and "requested 1" in r.stderr
        env = {**os.environ, "PYTHONPATH": str(os.getcwd())}
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "release", "stray",
                            "--socket", agent.socket], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert not [q for q in agent.call("GET", "/v1/status")[1]["quarantined"] if q["name"] == "stray"]
        r = numa_run(agent.socket, "--cpus", "1", "--", "true")
        assert r.returncode == 0, r.stderr
    finally:
        stray.kill()
        stray.wait()
        agent.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the forger as another user")
def test_a_forged_mark_of_another_user_gets_nothing_at_a_rebuild(tmp_path):
    """A user who writes numa-run's mark into their own environment and pins
    their own affinity is neither rebuilt nor held: the mark has no token the
    agent issued for that process."""
    def as_nobody():
        os.sched_setaffinity(0, {1})
        os.setgid(65534)
        os.setuid(65534)

    agent = AgentProcess(tmp_path / "agent", "--cgroup-root", "none")
    agent.start()  # its mark key made, so the next start's marks are forged or its own
    assert agent.stop() == 0
    forger = subprocess.Popen(["sleep", "60"], preexec_fn=as_nobody,
                              env={"PATH": os.environ.get("PATH", "/bin"), "NUMA_AGENT_WORKLOAD": "forged",
                                   "NUMA_AGENT_CPUS": "1", "NUMA_AGENT_EXCLUSIVE": "1",
                                   "NUMA_AGENT_MARK": "00" * 32})
    try:
        agent.start()
        assert workloads(agent, forger.pid) == []
        assert not [q for q in agent.call("GET", "/v1/status")[1]["quarantined"] if q["pid"] == forger.pid]
        assert f"unverified mark on pid {forger.pid} uid 65534 name 'forged'" in agent.log()
        key = agent.workdir / "mark.key"  # the runtime directory: the socket's
        assert (key.stat().st_mode & 0o777) == 0o600 and key.stat().st_size == 32
        r = numa_run(agent.socket, "--cpus", "1", "--", "true")  # CPU 1 is free to hand out
        assert r.returncode == 0, r.stderr
    finally:
        forger.kill()
        forger.wait()
        agent.stop()


@pytest.mark.parametrize("checkpoint", ["kept", "lost"])
def test_a_workload_released_while_it_runs_is_not_rebuilt_after_a_kill(tmp_path, checkpoint):
    """`numa-agent release` of a running --cpus 1 workload, then kill -9 and a
    restart of the real agent: the process stays on the shared pool, unmanaged.
    Also with every checkpoint file gone: the release is kept beside the mark key too."""
    agent = AgentProcess(tmp_path / "agent", "--cgroup-root", "none").start()
    proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                             "--name", "let-go", "--cpus", "1", "--", "sleep", "60"])
    try:
        assert wait_for(lambda: workloads(agent, proc.pid) and
                        b"NUMA_AGENT_MARK=" in open(f"/proc/{proc.pid}/environ", "rb").read(), timeout=10)
        env = {**os.environ, "PYTHONPATH": str(os.getcwd())}
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "release", "let-go",
                            "--socket", agent.socket], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        agent.kill()  # kill -9
        if checkpoint == "lost":
            for name in ("checkpoint.json", "checkpoint.json.prev", "checkpoint.journal"):
                (agent.state_dir / name).unlink(missing_ok=True)
        agent.start()
        status = agent.call("GET", "/v1/status")[1]
        assert workloads(agent, proc.pid) == [] and not [q for q in status["quarantined"] if q["pid"] == proc.pid]
        assert [r["name"] for r in status["released"] if r["pid"] == proc.pid] == ["let-go"]
        assert allowed_cpus(proc.pid) == CpuSet.parse(status["shared_pool"])
    finally:
        proc.kill()
        proc.wait()
        agent.stop()
