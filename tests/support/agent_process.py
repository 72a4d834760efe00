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
        self.args = [sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
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
