"""End to end on this machine: the real `numa-agent serve` on the live /sys,
enforcing with the CPU-affinity fallback (no writable cgroup v2 cpuset here),
and the real `numa-run` execing real commands."""

import os
import signal
import subprocess
import sys
import time

import pytest

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import AgentProcess, numa_run, wait_for

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="needs 2 CPUs: one reserved, one to hand out")


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    a = AgentProcess(tmp_path_factory.mktemp("live-agent"), "--cgroup-root", "none").start()
    yield a
    a.stop()


def workloads(agent):
    status, body = agent.call("GET", "/v1/workloads")
    assert status == 200
    return body["workloads"]


def test_health_says_affinity_fallback_and_why(agent):
    status, body = agent.call("GET", "/v1/health")
    assert status == 200 and body["enforcement"] == "affinity"
    assert "cgroup" in body["reason"]


def test_numa_run_pins_the_command_and_sets_its_environment(agent):
    code = ("import os;print(sorted(os.sched_getaffinity(0)));"
            "print(os.environ['NUMA_AGENT_CPUS']);print(os.environ['NUMA_AGENT_WORKLOAD']);"
            "print([l for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0].split()[1])")
    r = numa_run(agent.socket, "--cpus", "1", "--name", "pinned", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    affinity, env_cpus, name, allowed = r.stdout.split("\n")[:4]
    cpus = CpuSet.parse(env_cpus)
    assert len(cpus) == 1 and eval(affinity) == list(cpus)
    assert CpuSet.parse(allowed) == cpus
    assert name == "pinned"
    # released when it exits
    assert wait_for(lambda: workloads(agent) == [], timeout=2)


def test_running_workload_is_listed_pinned_and_released_on_exit(agent):
    proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                             "--cpus", "1", "--name", "sleeper", "--", "sleep", "30"])
    try:
        listed = wait_for(lambda: workloads(agent), timeout=10)
        assert [w["name"] for w in listed] == ["sleeper"]
        assert listed[0]["pid"] == proc.pid  # numa-run exec'd: same PID
        cpus = CpuSet.parse(listed[0]["cpus"])
        status_text = open(f"/proc/{proc.pid}/status").read()
        allowed = next(l for l in status_text.splitlines() if l.startswith("Cpus_allowed_list"))
        assert CpuSet.parse(allowed.split()[1]) == cpus
        # a second exclusive request finds the one free CPU taken
        r = numa_run(agent.socket, "--cpus", "1", "--", "true")
        assert r.returncode == 125 and "requested 1" in r.stderr
        # signals reach the command itself
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        t0 = time.monotonic()
        assert wait_for(lambda: workloads(agent) == [], timeout=2)
        assert time.monotonic() - t0 < 1.0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_exit_status_passes_through(agent):
    r = numa_run(agent.socket, "--shared", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7


def test_command_not_found_and_not_executable_book_nothing(agent, tmp_path):
    r = numa_run(agent.socket, "--cpus", "1", "--", "no-such-command-xyz")
    assert r.returncode == 127 and "no-such-command-xyz" in r.stderr
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    r = numa_run(agent.socket, "--cpus", "1", "--", str(script))
    assert r.returncode == 126
    assert workloads(agent) == []


def test_agent_unreachable_is_125(tmp_path):
    # No retry budget: without it numa-run waits 30 s for an agent that may be restarting.
    r = numa_run(str(tmp_path / "nothing.sock"), "--", "true", env={"NUMA_AGENT_RETRY_SECONDS": "0"})
    assert r.returncode == 125 and "nothing.sock" in r.stderr


def test_refusal_is_explained(agent):
    r = numa_run(agent.socket, "--cpus", "64", "--", "true")
    assert r.returncode == 125
    assert "64" in r.stderr
    assert workloads(agent) == []


def test_dry_run_books_nothing(agent):
    r = numa_run(agent.socket, "--cpus", "1", "--dry-run", "--json", "--", "true")
    assert r.returncode == 0, r.stderr
    assert '"dry_run": true' in r.stdout
    assert workloads(agent) == []


def test_interleave_all_is_the_commands_memory_policy(agent):
    """numa-run -i all on this machine: memory booked on the allowed nodes and
    MPOL_INTERLEAVE set before exec, as the kernel shows it (numa_maps)."""
    own = open("/proc/self/status").read().split("Mems_allowed_list:")[1].split()[0]
    script = ("grep Mems_allowed_list /proc/self/status; echo $NUMA_AGENT_MEMS; "
              "grep -c ' interleave:' /proc/self/numa_maps; grep -c ' default ' /proc/self/numa_maps"
              " || true")
    r = numa_run(agent.socket, "-i", "all", "--cpus", "1", "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    _, allowed, mems, interleaved, default = r.stdout.split()
    assert CpuSet.parse(allowed) == CpuSet.parse(mems) == CpuSet.parse(own)  # "all": the cpuset's
    assert int(interleaved) > 0 and default == "0"
    code = ("from numa_agent.enforcement.mempolicy import get_policy; p = get_policy(); "
            "print(p.mode, ','.join(map(str, p.nodes)))")
    r = numa_run(agent.socket, "-p", "+0", "--cpus", "1", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    # MPOL_PREFERRED (1) on the first allowed node
    assert r.stdout.strip() == f"1 {CpuSet.parse(own).min()}"
    assert wait_for(lambda: workloads(agent) == [], timeout=2)


def test_restart_keeps_running_workload(tmp_path):
    a = AgentProcess(tmp_path / "agent", "--cgroup-root", "none").start()
    proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", a.socket,
                             "--cpus", "1", "--name", "survivor", "--", "sleep", "30"])
    try:
        cpus = wait_for(lambda: [w["cpus"] for w in _list(a)], timeout=10)[0]
        a.kill()  # crash
        b = AgentProcess(tmp_path / "agent", "--cgroup-root", "none").start()
        assert [w["name"] for w in _list(b)] == ["survivor"]
        assert [w["cpus"] for w in _list(b)] == [cpus]
        proc.kill()
        proc.wait()
        assert wait_for(lambda: _list(b) == [], timeout=2)
        b.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
        a.kill()


def _list(agent):
    return agent.call("GET", "/v1/workloads")[1]["workloads"]


def test_a_recycled_pid_is_not_taken_for_the_workload_after_a_crash(tmp_path):
    """Affinity mode: the agent dies, the workload dies, its PID now names an
    unrelated process. On restart the workload is released, and the unrelated
    process keeps its affinity (it is neither pinned nor adopted)."""
    from numa_agent.state.checkpoint import CheckpointStore

    a = AgentProcess(tmp_path / "a", "--cgroup-root", "none").start()
    workload = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", a.socket,
                                 "--name", "victim", "--cpus", "1", "--", "sleep", "60"])
    stranger = None
    try:
        wait_for(lambda: [w for w in workloads(a) if w["name"] == "victim"])
        (victim,) = [w for w in workloads(a) if w["name"] == "victim"]
        a.kill()
        workload.kill()
        workload.wait()
        # The kernel recycling the PID, as the checkpoint sees it: the
        # workload's PID now names another live process.
        stranger = subprocess.Popen(["sleep", "60"])
        before = os.sched_getaffinity(stranger.pid)
        store = CheckpointStore(a.state_dir)
        data = store.load()
        (entry,) = [w for w in data["workloads"] if w["name"] == "victim"]
        assert entry["pid"] == victim["pid"] and entry["pid_identity"]
        entry["pid"] = stranger.pid
        store.save(data)
        a.start()
        assert [w["name"] for w in workloads(a)] == []
        assert os.sched_getaffinity(stranger.pid) == before
        assert "now belongs to another process" in a.log()
    finally:
        for p in (workload, stranger):
            if p is not None:
                p.kill()
                p.wait()
        a.stop()


def test_a_silent_agent_leaves_every_threads_stack_in_its_log(tmp_path):
    """What the guest scenarios do when the agent stops answering: SIGABRT, and the log
    says where each thread was (faulthandler), instead of a bare timeout."""
    silent = AgentProcess(tmp_path, "--cgroup-root", "none").start()
    silent.dump_stacks()
    assert silent.proc.poll() is not None
    log = silent.log()
    assert "Fatal Python error: Aborted" in log and "most recent call first" in log
    assert "numa_agent/" in log  # the agent's own frames, not only the interpreter's
