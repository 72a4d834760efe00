"""A bounded storm against the real agent: `numa-run` clients arrive and exit
while the agent is killed with SIGKILL and its checkpoint or its journal
damaged at random (the journal: a torn last entry, a flipped byte);
after every restart the kernel is asked whether the one promise still holds.

    python -m tests.support.chaos [--seconds 30] [--kills 8] [--cgroup-root none|auto] [--seed N]

The oracle is the kernel, not the agent's answers: in the affinity fallback each
client's CPU affinity (`/proc/PID/status`), in cgroup mode each workload
cgroup's `cpuset.cpus.effective` and `memory.max`. After each restart, once the
agent has had time to notice exits, every check below is one result:

- no CPU is exclusive to two workloads (by the kernel's view of each);
- no running client is forgotten (every live client is listed);
- no dead client holds anything (every listed workload's process lives);
- in cgroup mode, no workload's memory.max was loosened by the restart;
- the agent admits while idle and half-open connections squat on every
  listener (the API socket, /metrics on unix:, PodResources), more of them
  than its open-file limit (`--nofile`, default 1024) has descriptors.

Prints one line per failed check and a closing `N passed, M failed`; exits 1
if any failed. Bounded in time and in clients; cleans up what it started.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from numa_agent.api.client import ClientError, request
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.processes import process_alive

MAX_CLIENTS = 6
DAMAGES = ("truncate", "bitflip", "empty", "delete", "none", "none",
           "journal-torn", "journal-bitflip", "journal-torn")
SETTLE_SECONDS = 3.0  # for the agent to see exits after a restart
HALF_REQUEST = b"GET /v1/health HTTP/1.1\r\nHost: x"  # a head never finished


@dataclass
class Outcome:
    passed: int = 0
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failures.append(what)
            print(f"FAIL {what}", flush=True)


class Storm:
    def __init__(self, workdir: Path, cgroup_root: str, rng: random.Random,
                 lifetime: tuple[float, float] = (1.0, 15.0), nofile: int = 1024, squat: int = 1024) -> None:
        self.workdir = workdir
        self.state_dir = workdir / "state"
        self.socket = str(workdir / "agent.sock")
        self.cgroup_root = cgroup_root
        self.rng = rng
        self.agent: subprocess.Popen | None = None
        self.clients: dict[str, subprocess.Popen] = {}
        self.limits: dict[str, str] = {}  # cgroup mode: memory.max seen before a kill
        self.count = 0
        self.lifetime = lifetime  # how long a client's command runs: many must outlive a restart
        self.nofile = nofile  # the agent's RLIMIT_NOFILE, soft and hard
        self.squat = squat  # idle connections opened on each listener per round
        self.squatters: list[socket.socket] = []
        metrics = workdir / "metrics.sock"
        self.listeners = [self.socket, str(workdir / "pod-resources.sock")]
        self.metrics_address = ""
        if len(str(metrics)) < 100:  # a unix socket path's limit, with room to spare
            self.metrics_address = f"unix:{metrics}"
            self.listeners.append(str(metrics))

    # ---- the agent ------------------------------------------------------------------
    def start_agent(self) -> None:
        log = open(self.workdir / "agent.log", "ab")
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "numa_agent.cli.numa_agent", "serve", "--state-dir", str(self.state_dir),
             "--socket", self.socket, "--metrics-address", self.metrics_address, "--no-hotplug",
             "--cgroup-root", self.cgroup_root],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=self._limit_nofile)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.agent.returncode}; see {self.workdir}/agent.log")
            try:
                if request(self.socket, "GET", "/v1/health", timeout=2)[0] == 200:
                    return
            except ClientError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the agent did not answer within 60 s")

    def _limit_nofile(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    # ---- squatters: idle and half-open connections on every listener -----------------
    def squat_listeners(self) -> int:
        """Open `squat` connections on each listener, every other one sending half
        a request head and then nothing; the agent refuses or times them out."""
        self.release_squatters()
        for path in self.listeners:
            for i in range(self.squat):
                s = connect_unix(path)
                if s is None:
                    break  # the listen queue stays full: the agent is not accepting there
                if i % 2:
                    try:
                        s.send(HALF_REQUEST)
                    except OSError:
                        pass
                self.squatters.append(s)
        return len(self.squatters)

    def release_squatters(self) -> None:
        for s in self.squatters:
            s.close()
        self.squatters = []

    def admits_while_squatted(self) -> bool:
        """A plain numa-run is admitted while the squatters hold their connections."""
        try:
            return subprocess.run(
                [sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", self.socket, "--shared",
                 "--", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def kill_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGKILL)
            self.agent.wait()

    def damage(self) -> str:
        kind = self.rng.choice(DAMAGES)
        journal = self.state_dir / "checkpoint.journal"
        if kind.startswith("journal-"):
            if journal.exists() and journal.stat().st_size:
                return self.damage_journal(kind)
            kind = self.rng.choice([k for k in DAMAGES if not k.startswith("journal-")])  # nothing to damage
        path = self.state_dir / "checkpoint.json"
        if not path.exists() or kind == "none":
            return "none"
        data = path.read_bytes()
        if kind == "truncate":
            path.write_bytes(data[: len(data) // 2])
        elif kind == "bitflip" and data:
            i = self.rng.randrange(len(data))
            path.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:])
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "delete":
            path.unlink()
        return kind

    def damage_journal(self, kind: str) -> str:
        """A torn last entry (part of a line, as an interrupted append leaves
        it) or one flipped byte somewhere in the journal."""
        path = self.state_dir / "checkpoint.journal"
        data = path.read_bytes()
        if kind == "journal-torn":
            lines = data.splitlines(keepends=True)
            line = self.rng.choice(lines)
            path.write_bytes(data + line[: self.rng.randrange(1, max(2, len(line) - 1))])
        else:
            i = self.rng.randrange(len(data))
            path.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:])
        return kind

    # ---- the clients ----------------------------------------------------------------
    def spawn_client(self) -> None:
        self.count += 1
        name = f"chaos-{self.count}"
        shape = self.rng.choice((["--cpus", "1"], ["--shared"], ["--cpus", "1", "--memory", "16Mi"]))
        seconds = f"{self.rng.uniform(*self.lifetime):.2f}"
        self.clients[name] = subprocess.Popen(
            [sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", self.socket, "--name", name, *shape,
             "--", "sleep", seconds], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def reap(self) -> None:
        for name, proc in list(self.clients.items()):
            if proc.poll() is not None:
                del self.clients[name]

    # ---- the oracle -----------------------------------------------------------------
    def listed(self) -> list[dict]:
        status, body = request(self.socket, "GET", "/v1/workloads", timeout=10)
        return body.get("workloads", []) if status == 200 else []

    def check(self, out: Outcome, round_no: int) -> None:
        time.sleep(SETTLE_SECONDS)
        self.reap()
        listed = {w["name"]: w for w in self.listed()}
        running = {name: proc for name, proc in self.clients.items() if proc.poll() is None}
        # Forgotten: a client that is past its admission (its command runs, so
        # its process is `sleep` now) must be listed.
        for name, proc in running.items():
            if _comm(proc.pid) == "sleep":
                out.check(name in listed, f"round {round_no}: running {name} (pid {proc.pid}) is not listed")
        for name, w in listed.items():
            if name.startswith("chaos-") and w.get("pid"):
                out.check(process_alive(w["pid"]), f"round {round_no}: {name} is listed but pid {w['pid']} is gone")
        # Exclusive: a CPU a listed workload holds exclusively is allowed to
        # no other client's process (the kernel's Cpus_allowed_list, which
        # both the cpuset and the affinity fallback bound).
        held: dict[int, str] = {}
        for name, w in listed.items():
            if w.get("exclusive") and w.get("pid"):
                for cpu in CpuSet.parse(w["cpus"]):
                    out.check(cpu not in held, f"round {round_no}: CPU {cpu} is booked by {held.get(cpu)} and {name}")
                    held[cpu] = name
        for name, proc in running.items():
            allowed = _allowed_cpus(proc.pid)
            intruded = sorted(cpu for cpu in allowed if held.get(cpu, name) != name)
            out.check(not intruded, f"round {round_no}: {name} (pid {proc.pid}) may run on CPUs {intruded} "
                                    f"held by {sorted({held[c] for c in intruded})}")
        if self.cgroup_root != "none":
            for name, before in self.limits.items():
                path = self.cgroup_path(listed.get(name))
                if path is not None and (path / "memory.max").exists():
                    now = (path / "memory.max").read_text().strip()
                    out.check(now == before, f"round {round_no}: {name} memory.max {before} became {now}")

    def remember_limits(self) -> None:
        self.limits = {}
        if self.cgroup_root == "none":
            return
        for w in self.listed():
            path = self.cgroup_path(w)
            if path is not None and (path / "memory.max").exists():
                self.limits[w["name"]] = (path / "memory.max").read_text().strip()

    def cgroup_path(self, w: dict | None) -> Path | None:
        if not w:
            return None
        root = Path(_agent_cgroup_root())  # the agent's layout below it: wl-<name>, shared/<name>
        path = root / ("wl-" + w["name"] if w.get("exclusive") else f"shared/{w['name']}")
        return path if path.is_dir() else None

    def cleanup(self) -> None:
        self.release_squatters()
        for proc in self.clients.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.agent.kill()


def connect_unix(path: str, patience: float = 2.0) -> socket.socket | None:
    """A connection to `path`, waiting up to `patience` s for room in its listen
    queue; None if there is none by then, or the connection is refused."""
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    give_up = time.monotonic() + patience
    while True:
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            if time.monotonic() > give_up:
                break
            time.sleep(0.005)
        except OSError:
            break
    s.close()
    return None


def _agent_cgroup_root() -> str:
    return os.environ.get("NUMA_AGENT_CHAOS_CGROUP_ROOT", "/sys/fs/cgroup/numa-agent")


def _allowed_cpus(pid: int) -> CpuSet:
    """The CPUs the kernel lets `pid` run on; empty if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return CpuSet.parse(line.split(":", 1)[1].strip())
    except OSError:
        pass
    return CpuSet()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def run(seconds: float, kills: int, cgroup_root: str, seed: int, workdir: Path,
        lifetime: tuple[float, float] = (1.0, 15.0), nofile: int = 1024, squat: int = 1024) -> Outcome:
    rng = random.Random(seed)
    storm = Storm(workdir, cgroup_root, rng, lifetime, nofile, squat)
    out = Outcome()
    deadline = time.monotonic() + seconds
    interval = seconds / max(1, kills)
    try:
        storm.start_agent()
        round_no = 0
        while time.monotonic() < deadline and round_no < kills:
            round_no += 1
            round_end = min(deadline, time.monotonic() + interval)
            while time.monotonic() < round_end:
                storm.reap()
                if len(storm.clients) < MAX_CLIENTS:
                    storm.spawn_client()
                time.sleep(rng.uniform(0.05, 0.3))
            storm.remember_limits()
            storm.kill_agent()
            damage = storm.damage()
            print(f"round {round_no}: agent killed, checkpoint damage: {damage}, "
                  f"{len(storm.clients)} client(s) in flight", flush=True)
            storm.start_agent()
            if squat:
                held = storm.squat_listeners()
                out.check(storm.admits_while_squatted(),
                          f"round {round_no}: numa-run was not admitted while {held} idle or half-open "
                          f"connections squatted on {len(storm.listeners)} listeners")
            storm.check(out, round_no)
            storm.release_squatters()
    finally:
        storm.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="how long the storm lasts (default 30)")
    p.add_argument("--kills", type=int, default=8, help="at most this many kill -9 rounds (default 8)")
    p.add_argument("--cgroup-root", default="none", help="the agent's --cgroup-root (default none: affinity)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    p.add_argument("--workdir", help="where the agent's state and log go (default: a temporary directory)")
    p.add_argument("--nofile", type=int, default=1024, help="the agent's open-file limit (default 1024)")
    p.add_argument("--squat", type=int, default=None, metavar="N",
                   help="idle and half-open connections opened on each listener every round (default: "
                        "--nofile, so that each listener alone could exhaust the agent; 0: none)")
    p.add_argument("--client-seconds", default="1,15", metavar="MIN,MAX",
                   help="how long each client's command runs (default 1,15; slower machines want more)")
    args = p.parse_args(argv)
    try:
        low, high = (float(x) for x in args.client_seconds.split(","))
    except ValueError:
        p.error(f"--client-seconds wants MIN,MAX in seconds, got {args.client_seconds!r}")
    seed = args.seed if args.seed is not None else int(time.time())
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="numa-agent-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {seed}, {args.seconds:g} s, up to {args.kills} kills, cgroup root {args.cgroup_root}, "
          f"work in {workdir}", flush=True)
    out = run(args.seconds, args.kills, args.cgroup_root, seed, workdir, (low, high), args.nofile,
              args.nofile if args.squat is None else args.squat)
    if not out.passed and not out.failures:
        # A storm that checked nothing proves nothing: clients all gone before a check.
        print("chaos: no check ran (every client had exited before the agent was back); "
              "give it more --seconds or longer --client-seconds")
        out.failures.append("no check ran")
    print(f"{out.passed} passed, {len(out.failures)} failed")
    if not out.failures and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if out.failures else 0


if __name__ == "__main__":
    sys.exit(main())
