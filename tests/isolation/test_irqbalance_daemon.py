"""The real irqbalance (Debian 12: 1.9.2) asked and told through the agent's edge.

It is started in the foreground with a one-second interval and a policy
script that bans every interrupt from balancing, so it never moves this
machine's interrupts while the test runs; its banned-CPU setting is what is
checked. Skipped where the binary is missing, without root (it answers root
only) or when an irqbalance already runs (the machine's own: left alone).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.isolation.irqbalance import RUN_DIR, IrqbalanceSocket

BINARY = shutil.which("irqbalance") or shutil.which("irqbalance", path="/usr/sbin:/sbin")

pytestmark = [
    pytest.mark.skipif(BINARY is None, reason="irqbalance is not installed (apt-get install irqbalance)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="irqbalance answers root only"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="irqbalance exits on a single CPU"),
]


def wait_for(check, what: str, limit: float = 15.0):
    """Poll until `check()` is true (the daemon applies a change at its next rescan)."""
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"irqbalance: {what} not seen within {limit} s")
        time.sleep(0.1)


class Daemon:
    def __init__(self, tmp_path: Path, env_banned: str | None = None) -> None:
        script = tmp_path / "ban-all"
        script.write_text("#!/bin/sh\necho ban=true\n")
        script.chmod(0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("IRQBALANCE_")}
        if env_banned is not None:
            env["IRQBALANCE_BANNED_CPULIST"] = env_banned
        self.proc = subprocess.Popen([BINARY, "--foreground", "-t", "1", "-l", str(script)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.socket = Path(RUN_DIR) / f"irqbalance{self.proc.pid}.sock"
        wait_for(lambda: self.socket.exists() or self.proc.poll() is not None, "its socket")
        assert self.proc.poll() is None, f"irqbalance exited with {self.proc.returncode}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)


@pytest.fixture
def daemons(tmp_path):
    if IrqbalanceSocket().pid() is not None:
        pytest.skip("an irqbalance already runs on this machine: not touched")
    made = not Path(RUN_DIR).exists()
    Path(RUN_DIR).mkdir(exist_ok=True)  # systemd's RuntimeDirectory; irqbalance does not make it
    started: list[Daemon] = []

    def start(env_banned: str | None = None) -> Daemon:
        d = Daemon(tmp_path, env_banned)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
    if made:
        shutil.rmtree(RUN_DIR, ignore_errors=True)


def reported(pid_expected: int):
    """What the daemon itself reports now (a fresh edge: nothing told remembered)."""
    edge = IrqbalanceSocket()
    assert edge.pid() == pid_expected
    return edge.read()


def test_the_real_irqbalance_bans_what_it_is_told_and_returns_to_its_own_set(daemons):
    last = max(os.sched_getaffinity(0))
    daemon = daemons()
    edge = IrqbalanceSocket()
    assert edge.read() == ""  # nothing banned by its environment or isolcpus here
    edge.write(str(last))
    assert edge.read() == str(last)  # what it holds from its next rescan on
    wait_for(lambda: reported(daemon.proc.pid) == str(last), f"CPU {last} banned")
    edge.write("")  # sent as NULL: its own set again
    wait_for(lambda: reported(daemon.proc.pid) == "", "its own (empty) set back")


def test_the_real_irqbalance_replaces_its_environments_set_and_forgets_on_restart(daemons):
    cpus = sorted(os.sched_getaffinity(0))
    first, last = cpus[0], cpus[-1]
    daemon = daemons(env_banned=str(first))
    edge = IrqbalanceSocket()
    assert edge.read() == str(first)
    edge.write(str(last))  # replaces the environment's set, does not add to it
    wait_for(lambda: reported(daemon.proc.pid) == str(last), f"CPU {last} instead of {first}")
    daemon.stop()
    again = daemons(env_banned=str(first))
    assert edge.lost()  # the one told has exited
    assert edge.read() == str(first)  # the new one knows only its environment
    edge.write(CpuSet([first, last]).format())
    assert not edge.lost()
    wait_for(lambda: reported(again.proc.pid) == CpuSet([first, last]).format(), "the set told again")
