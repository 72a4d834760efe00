"""What each signal systemd or a user may send does to a running agent: SIGHUP
reloads the configuration (what can change live is applied, the rest named in one
line, a file that no longer loads is logged and the running config kept), SIGUSR1
and SIGUSR2 are logged, SIGPIPE is ignored, SIGTERM and SIGINT stop it with exit 0;
and none of them loses or half-applies an admission that was being made."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import AgentProcess, free_port, wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def machine(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=1, memory_per_node_bytes=4 << 30)
    return write_sysfs(topo, tmp_path / "machine")


def agent_with(tmp_path, machine, config: str, env: dict | None = None, *, metrics_in_file: bool = False
               ) -> AgentProcess:
    """An agent whose log level (and metrics address) come from its file: AgentProcess
    passes them as flags, which a reload keeps over the file."""
    agent = AgentProcess(tmp_path, "--sysfs-root", str(machine), config=config, env=env)
    for flag in ("--log-level", "--metrics-address") if metrics_in_file else ("--log-level",):
        at = agent.args.index(flag)
        del agent.args[at:at + 2]
    return agent


def lines_with(agent: AgentProcess, text: str) -> list[str]:
    return [line for line in agent.log().splitlines() if text in line]


def reload_lines(agent: AgentProcess) -> list[str]:
    return [line for line in agent.log().splitlines()
            if any(what in line for what in ("configuration reloaded", "reload refused", "reload failed"))]


def reload(agent: AgentProcess, config: str | None = None) -> str:
    """Write `config`, SIGHUP, and the reload's log line once it is there."""
    if config is not None:
        (agent.workdir / "config.toml").write_text(config)
    before = len(reload_lines(agent))
    agent.proc.send_signal(signal.SIGHUP)
    found = wait_for(lambda: reload_lines(agent)[before:], timeout=20)
    assert found, agent.log()
    return found[0]


def test_sighup_applies_what_can_change_and_names_what_needs_a_restart(tmp_path, machine):
    agent = agent_with(tmp_path, machine, '[agent]\nlog_level = "warning"\n').start()
    try:
        assert agent.call("POST", "/v1/workloads", {"name": "a", "cpus": 2})[0] == 201
        assert " DEBUG " not in agent.log() and " INFO " not in agent.log()
        line = reload(agent, f'[agent]\nlog_level = "debug"\n[quotas]\nusers."{ME}" = {{ cpus = 1 }}\n'
                             '[topology_manager]\npolicy = "single-numa-node"\n')
        assert "configuration reloaded: agent.log_level, quotas applied; changed but not applied until a " \
               "restart: topology_manager.policy" in line
        assert agent.proc.poll() is None
        # the quota holds for the next admission; the one made before it stays
        code, body = agent.call("POST", "/v1/workloads", {"name": "b", "cpus": 1})
        assert code == 403 and body["error"]["code"] == "quota_exceeded", body
        assert [w["name"] for w in agent.call("GET", "/v1/workloads")[1]["workloads"]] == ["a"]
        # debug now logs what warning did not: each API request
        assert wait_for(lambda: lines_with(agent, "DEBUG numa_agent.api: GET /v1/workloads from pid"))
        # the key that needs a restart is named again until the agent restarts
        assert "not applied until a restart: topology_manager.policy" in reload(agent)
    finally:
        assert agent.stop() == 0


def test_a_reload_the_file_refuses_keeps_the_running_configuration(tmp_path, machine):
    agent = agent_with(tmp_path, machine, f'[quotas]\nusers."{ME}" = {{ cpus = 1 }}\n').start()
    try:
        for broken, why in (("[agent\n", "not valid TOML"),
                            ('[cpu_manager]\nreserved_cpu = 2\n', "unknown key cpu_manager.reserved_cpu"),
                            ('[quotas]\nusers.no-such-user-q36 = { cpus = 1 }\n', "no-such-user-q36")):
            line = reload(agent, broken)
            assert "reload refused, the running configuration is kept" in line and why in line, line
            assert agent.call("GET", "/v1/health")[0] == 200
        # the quota of the file last loaded still holds
        assert agent.call("POST", "/v1/workloads", {"name": "b", "cpus": 2})[0] == 403
        os.unlink(agent.workdir / "config.toml")  # asked for with --config: missing is an error too
        assert "does not exist" in reload(agent)
        assert agent.proc.poll() is None
    finally:
        assert agent.stop() == 0


def test_a_reload_keeps_the_flags_over_the_file(tmp_path, machine):
    agent = AgentProcess(tmp_path, "--sysfs-root", str(machine), config='[agent]\nlog_level = "info"\n').start()
    try:  # AgentProcess passes --log-level debug: the file's warning does not win on reload
        assert "nothing changed" in reload(agent, '[agent]\nlog_level = "warning"\n')
    finally:
        assert agent.stop() == 0


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.status


def refused(port: int) -> bool:
    try:
        scrape(port)
    except urllib.error.URLError:
        return True
    return False


def test_a_reload_moves_the_metrics_endpoint(tmp_path, machine):
    first, second = free_port(), free_port()
    agent = agent_with(tmp_path, machine, f'[agent]\nmetrics_address = "127.0.0.1:{first}"\n',
                       metrics_in_file=True).start()
    try:
        assert wait_for(lambda: not refused(first), timeout=20)  # served just after the API
        assert "agent.metrics_address applied" in reload(agent, f'[agent]\nmetrics_address = "127.0.0.1:{second}"\n')
        assert scrape(second) == 200 and refused(first)
        # the same port on every address: the old endpoint hands its port over
        assert "agent.metrics_address applied" in reload(agent, f'[agent]\nmetrics_address = "0.0.0.0:{second}"\n')
        assert scrape(second) == 200
        with socket.socket() as taken:  # a port another process holds: the endpoint stays
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            line = reload(agent, f'[agent]\nmetrics_address = "127.0.0.1:{taken.getsockname()[1]}"\n')
            assert "changed but not applied until a restart: agent.metrics_address" in line, line
            assert lines_with(agent, "metrics stay on 0.0.0.0:")
            assert len(lines_with(agent, f"serving metrics on http://0.0.0.0:{second}/")) == 1  # never closed
            assert scrape(second) == 200
        assert "agent.metrics_address applied" in reload(agent, '[agent]\nmetrics_address = ""\n')
        assert refused(second)
    finally:
        assert agent.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE], ids=lambda sig: sig.name)
def test_other_signals_leave_the_agent_running(tmp_path, machine, sig):
    agent = agent_with(tmp_path, machine, "").start()
    try:
        agent.proc.send_signal(sig)
        if sig != signal.SIGPIPE:
            assert wait_for(lambda: lines_with(agent, f"{sig.name} received: nothing to do"), timeout=20)
        # a reload after it answers: the signal was handled before it, and nothing died
        assert "configuration reloaded" in reload(agent)
        assert agent.proc.poll() is None and agent.call("GET", "/v1/health")[0] == 200
    finally:
        assert agent.stop() == 0


def test_sigint_stops_like_sigterm(tmp_path, machine):
    agent = agent_with(tmp_path, machine, "").start()
    agent.proc.send_signal(signal.SIGINT)
    assert agent.proc.wait(timeout=20) == 0
    assert lines_with(agent, "SIGINT received: stopping")
    agent.stop()


def test_a_reload_tells_systemd_it_began_and_ended(tmp_path, machine):
    """sd_notify(3): RELOADING=1 with MONOTONIC_USEC, then READY=1."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    agent = agent_with(tmp_path, machine, "", env={"NOTIFY_SOCKET": path}).start()
    try:
        messages = []
        while "READY=1" not in messages:
            messages.append(sock.recv(4096).decode())
        reload(agent)
        after = []
        while "READY=1" not in after:
            after.append(sock.recv(4096).decode())
        reloading = [m for m in after if m.startswith("RELOADING=1")]
        assert len(reloading) == 1 and after.index(reloading[0]) < after.index("READY=1"), after
        usec = dict(line.split("=", 1) for line in reloading[0].splitlines())["MONOTONIC_USEC"]
        assert 0 < int(usec) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    finally:
        agent.stop()
        sock.close()


def test_signals_during_admissions_lose_nothing_and_book_nothing_twice(tmp_path, machine):
    """numa-runs admitted while SIGHUPs arrive, then SIGTERM among them and the agent
    started again: each numa-run that runs its command is booked exactly once (one
    whose answer the stop cut retries its request id with the next agent), one that
    failed is booked nowhere, and no CPU is booked twice (7 usable CPUs, 9 asked)."""
    config = f'[quotas]\nusers."{ME}" = {{ cpus = 64 }}\n'
    agent = agent_with(tmp_path, machine, config).start()
    runs: list[subprocess.Popen] = []

    def launch(i: int) -> None:
        runs.append(subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                                      "--name", f"w{i}", "--cpus", "1", "--", "sleep", "120"],
                                     stderr=subprocess.DEVNULL))

    again = None
    try:
        for i in range(6):
            launch(i)
            agent.proc.send_signal(signal.SIGHUP)
        for i in range(6, 9):
            launch(i)
        wait_for(lambda: lines_with(agent, "admitted w"), timeout=20)
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=30) == 0
        assert reload_lines(agent), agent.log()
        again = agent_with(tmp_path, machine, config).start()

        def settled():  # each numa-run runs its command (is listed) or has exited
            listed = {w["pid"] for w in again.call("GET", "/v1/workloads")[1]["workloads"]}
            return all(p.poll() is not None or p.pid in listed for p in runs)

        assert wait_for(settled, timeout=90, interval=0.2)
        listed = again.call("GET", "/v1/workloads")[1]["workloads"]
        running = sorted(p.pid for p in runs if p.poll() is None)
        assert sorted(w["pid"] for w in listed) == running  # once each, none for a failed one
        assert len(running) == 7, [p.returncode for p in runs]  # every usable CPU taken, no more
        seen = CpuSet()
        for w in listed:
            cpus = CpuSet.parse(w["cpus"])
            assert len(cpus) == 1 and cpus.isdisjoint(seen)
            seen = seen | cpus
    finally:
        for p in runs:
            p.kill()
            p.wait()
        if again is not None:
            again.stop()
        agent.stop()


def test_what_waits_for_a_restart_is_said_even_at_warning(tmp_path, machine):
    agent = agent_with(tmp_path, machine, '[agent]\nlog_level = "warning"\n').start()
    try:
        line = reload(agent, '[agent]\nlog_level = "warning"\n[kubelet]\nnamespace = "other"\n')
        assert "WARNING" in line and "not applied until a restart: kubelet.namespace" in line, line
    finally:
        assert agent.stop() == 0


def test_a_stop_whose_byte_a_full_wakeup_pipe_dropped_still_stops(monkeypatch):
    # A SIGHUP storm (a loop of `systemctl reload`, a script) fills the wakeup pipe
    # faster than reloads empty it; the C handler then cannot write SIGTERM's byte, and
    # the agent must stop all the same (the Python-level handler still runs), after at
    # most a reload or two for the whole storm, not one per 256 signals.
    import threading

    from numa_agent.daemon import startup

    reloads = []

    class Stub:
        def reload(self):
            reloads.append(1)

    wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(wake_w, False)
    try:
        try:
            while True:
                os.write(wake_w, bytes([signal.SIGHUP]) * 4096)
        except BlockingIOError:
            pass  # full: the SIGTERM below finds no room for its byte
        startup._noted(signal.SIGTERM, None)
        done = threading.Event()

        def serve():
            startup.Agent._serve_signals(Stub(), wake_r)  # type: ignore[arg-type]
            done.set()

        threading.Thread(target=serve, daemon=True).start()
        assert done.wait(timeout=30), "SIGTERM was lost in the storm"  # a bound, not a measure
        assert len(reloads) <= 2
    finally:
        os.close(wake_w)
        os.close(wake_r)
