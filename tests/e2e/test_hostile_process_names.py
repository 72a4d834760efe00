"""A real process named with terminal escapes (its comm written, as any user may) runs on a
workload's exclusive CPU: the real agent on the live /sys (affinity fallback) finds it, and
`numa-agent status` and the agent's log show its name escaped, while the JSON API keeps
the exact name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import AgentProcess, wait_for

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="needs 2 CPUs: one reserved, one to hand out")

COMM = b"\x1b]0;owned\x07\x1b[2J\r"  # retitle, clear the screen, return: 13 of comm's 15 bytes
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\r"
INTRUDER = f"""
import os, sys, time
with open("/proc/self/comm", "wb") as f:  # named first: never on the CPU as "python"
    f.write({COMM!r})
os.sched_setaffinity(0, {{int(sys.argv[1])}})
print("named", flush=True)
while True:
    time.sleep(0.02)  # wakes on that CPU, the only one it may run on
"""


@pytest.fixture()
def agent(tmp_path_factory):
    a = AgentProcess(tmp_path_factory.mktemp("hostile-agent"), "--cgroup-root", "none",
                     config="[observe]\nintruder_scan_seconds = 0.1\n").start()
    yield a
    a.stop()


def _status_text(agent) -> bytes:
    done = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--intruders",
                           "--socket", agent.socket], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_process_named_with_escapes_is_shown_escaped(agent):
    workload = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                                 "--cpus", "1", "--name", "victim", "--", "sleep", "60"])
    intruder = None
    try:
        listed = wait_for(lambda: agent.call("GET", "/v1/workloads")[1]["workloads"], timeout=10)
        assert [w["name"] for w in listed] == ["victim"]
        (cpu,) = CpuSet.parse(listed[0]["cpus"])
        elsewhere = os.sched_getaffinity(0) - {cpu}  # off the workload's CPU until it is named
        intruder = subprocess.Popen([sys.executable, "-c", INTRUDER, str(cpu)], stdout=subprocess.PIPE,
                                    preexec_fn=lambda: os.sched_setaffinity(0, elsewhere))
        assert intruder.stdout is not None and intruder.stdout.readline() == b"named\n"

        def found():
            status = agent.call("GET", "/v1/status")[1]
            return [i for w in status["workloads"] for i in w.get("intruders") or [] if i["pid"] == intruder.pid]
        (seen,) = wait_for(found, timeout=15)
        assert seen["command"] == COMM.decode()  # the API keeps the exact name: JSON escapes it

        text = _status_text(agent)
        assert not any(b in text for b in (b"\x1b", b"\x07", b"\r")), text
        assert f"pid {intruder.pid} tid {intruder.pid} ({SHOWN})".encode() in text
        as_json = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--json",
                                  "--socket", agent.socket], capture_output=True, timeout=30)
        assert b"\x1b" not in as_json.stdout
        exact = [i["command"] for w in json.loads(as_json.stdout)["workloads"] for i in w.get("intruders") or []
                 if i["pid"] == intruder.pid]
        assert exact == [COMM.decode()]  # --json keeps the exact name, escaped by JSON itself

        # the agent's log: the intruder's line is one line, escaped
        logged = wait_for(lambda: [line for line in agent.log().splitlines(keepends=True)
                                   if f"pid {intruder.pid} tid" in line], timeout=5)
        assert len(logged) == 1 and logged[0].rstrip("\n").endswith(f"({SHOWN})"), logged
        assert not any(ch in agent.log() for ch in "\x1b\x07\r")
    finally:
        for proc in (intruder, workload):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
