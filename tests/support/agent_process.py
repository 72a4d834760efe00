"""Run the real `numa-agent serve` as a child process for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from numa_agent.api.client import request


class AgentProcess:
    def __init__(self, workdir: Path, *extra_args: str, config: str | None = None,
                 env: dict | None = None) -> None:
        self.workdir = Path(workdir)
        self.socket = str(self.workdir / "agent.sock")
        self.state_dir = self.workdir / "state"
        self.log_path = self.workdir / "agent.log"
        # -X faulthandler: a SIGABRT (dump_stacks) writes every thread's stack into the log.
        self.args = [sys.executable, "-X", "faulthandler", "-m", "numa_agent.cli.numa_agent", "serve",
                     "--state-dir", str(self.state_dir), "--socket", self.socket,
                     "--metrics-address", f"127.0.0.1:{free_port()}", "--no-hotplug",
                     "--log-level", "debug", *extra_args]
        if config:
            cfg = self.workdir / "config.toml"
            cfg.write_text(config)
            self.args += ["--config", str(cfg)]
        self.metrics_port = int(self.args[self.args.index("--metrics-address") + 1].rsplit(":", 1)[1])
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> "AgentProcess":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=str(Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            try:
                # No client retry: this loop does the waiting and watches the process meanwhile.
                status, _ = request(self.socket, "GET", "/v1/health", timeout=2, busy_retry=0)
                if status == 200:
                    return self
            except Exception:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"agent did not answer on {self.socket} in {timeout}s:\n{self.log()}")

    def call(self, method: str, path: str, body=None):
        return request(self.socket, method, path, body)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def dump_stacks(self, settle: float = 2.0) -> None:
        """An agent that stopped answering: SIGABRT, which faulthandler answers with the
        stack of every thread in the log (where it was stuck), then the process ends."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=settle)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: a crash, nothing cleaned up."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        return self.proc.returncode if self.proc else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def numa_run(socket_path: str, *args: str, timeout: float = 30, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", socket_path, *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def loads(text: str):
    return json.loads(text)


# A written 4-node, 2-socket machine with a GPU on node 1 and a NIC on node 2, and
# the configuration that makes them device resources.
GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")
NIC = ("0x020000", "0x15b3", "0x1017", 2, "mlx5_core")
DEVICES_CONFIG = """
[devices.gpu]
vendor = "0x10de"
class_prefixes = ["0x0302", "0x0300"]

[devices.nic]
class_prefixes = ["0x0200"]
"""


def machine_with_devices(where: Path) -> Path:
    from tests.support.synthetic import make_topology
    from tests.support.sysfs_writer import write_sysfs

    topo = make_topology(sockets=2, nodes_per_socket=2, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=16 << 30, hugepages_2m_per_node=128, devices=(GPU, NIC))
    return write_sysfs(topo, where)


class NumaRuns:
    """`numa-run OPTIONS -- sleep 60` processes, each returned once the agent
    lists it (or it exited); `stop()` kills them all. The workloads must
    outlive the checks: a workload whose process exits is released (the
    simulated cgroup tree notices exits too)."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.running: list[subprocess.Popen] = []

    def __call__(self, *options: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", self.agent.socket,
                                 *options, "--", "sleep", "60"], stderr=subprocess.PIPE, text=True)
        self.running.append(proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return proc
            code, body = self.agent.call("GET", "/v1/workloads")
            if code == 200 and any(w["pid"] == proc.pid for w in body["workloads"]):
                return proc
            time.sleep(0.05)
        raise AssertionError(f"numa-run {options} was not admitted in time")

    def stop(self) -> None:
        for proc in self.running:
            proc.kill()
            proc.wait()
        self.running.clear()
