"""The end-to-end scenarios, run INSIDE the QEMU guest by scripts/vm-e2e:

    .venv/bin/python -m tests.vm_e2e.scenarios --shape 2node

Starts the real `numa-agent serve` on the guest's real /sys and /sys/fs/cgroup and drives
it with the real `numa-run`. Prints one line per scenario (PASS/FAIL/SKIP, see plan.py)
and writes report-<shape>.json plus the agent's log into $NUMA_AGENT_VM_OUT.

The oracle is the kernel, not the agent: expected CPUs per node, core siblings and device
nodes are read straight from sysfs here, and the outcome is checked in /proc/PID/status
and in the cgroup files the kernel exposes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numa_agent.api.client import ClientError
from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import AgentProcess, wait_for
from tests.vm_e2e.plan import SCENARIOS, planned, result_line, skip_reason
from tests.vm_e2e.watch import ScenarioWatch

CGROUP_MOUNT = Path("/sys/fs/cgroup")
AGENT_ROOT = CGROUP_MOUNT / "numa-agent"  # what `--cgroup-root auto` uses outside systemd
METRICS_ADDRESS = "127.0.0.1:9464"
SYS_NODES = Path("/sys/devices/system/node")
SYS_CPUS = Path("/sys/devices/system/cpu")
SYS_PCI = Path("/sys/bus/pci/devices")
# Everything is ~30x slower under emulation: waits are loops with generous ceilings.
ADMIT_TIMEOUT = 90.0
AGENT_START_TIMEOUT = 120.0
RELEASE_LIMIT = 1.0  # the issue's promise: cgroup gone and CPUs back within a second
AGENT_CONFIG = """\
[devices.nvme]
class_prefixes = ["0x0108"]

[devices.nic]
class_prefixes = ["0x0200"]
"""
SLEEP = ("sleep", "600")
MIB = 1 << 20


class ScenarioFailed(Exception):
    pass


class ScenarioSkipped(Exception):
    pass


def check(condition, message: str) -> None:
    if not condition:
        raise ScenarioFailed(message)


# ---------------------------------------------------------------- the kernel's view
@dataclass(frozen=True)
class Kernel:
    """What this guest's kernel says about the machine (read once, before the agent runs)."""

    node_cpus: dict[int, CpuSet]   # every node, memory-only nodes with an empty set
    siblings: dict[int, CpuSet]    # cpu -> the threads of its core
    pci_nodes: dict[str, int]      # PCI address -> numa_node (-1: unknown)
    pci_classes: dict[str, str]

    @classmethod
    def read(cls) -> "Kernel":
        node_cpus = {}
        for path in sorted(SYS_NODES.glob("node[0-9]*")):
            node_cpus[int(path.name[4:])] = CpuSet.parse((path / "cpulist").read_text().strip())
        siblings = {}
        for cpus in node_cpus.values():
            for cpu in cpus.ids():
                text = (SYS_CPUS / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
                siblings[cpu] = CpuSet.parse(text.strip())
        pci_nodes, pci_classes = {}, {}
        for dev in sorted(SYS_PCI.iterdir()):
            pci_nodes[dev.name] = int((dev / "numa_node").read_text())
            pci_classes[dev.name] = (dev / "class").read_text().strip()
        return cls(node_cpus, siblings, pci_nodes, pci_classes)

    @property
    def cpu_nodes(self) -> list[int]:
        return [n for n, cpus in sorted(self.node_cpus.items()) if cpus]

    @property
    def memory_only_nodes(self) -> list[int]:
        return [n for n, cpus in sorted(self.node_cpus.items()) if not cpus]

    def nodes_of(self, cpus: CpuSet) -> list[int]:
        return [n for n, node in sorted(self.node_cpus.items()) if node & cpus]

    def whole_cores(self, cpus: CpuSet) -> bool:
        return all(self.siblings[c].issubset(cpus) for c in cpus.ids())

    @property
    def threads_per_core(self) -> int:
        return max(len(s) for s in self.siblings.values())

    def devices_of_class(self, prefix: str) -> list[str]:
        return [a for a, c in sorted(self.pci_classes.items()) if c.startswith(prefix)]


def bring_loopback_up() -> None:
    """The guest's init leaves `lo` down; the metrics endpoint listens on 127.0.0.1."""
    set_link("lo", up=True)


def set_link(name: str, *, up: bool) -> bool:
    """Set an interface up or down (SIOCSIFFLAGS); returns whether it was up before."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", name.encode(), 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, siocgifflags, request))[1]
        if bool(flags & iff_up) != up:
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", name.encode(), flags ^ iff_up))
        return bool(flags & iff_up)


# ---------------------------------------------------------------- kernel-side reads
def proc_allowed(pid: int) -> tuple[CpuSet, CpuSet]:
    """(Cpus_allowed_list, Mems_allowed_list) of a live process. Node lists use the kernel's
    list syntax too, so CpuSet parses and compares them as well."""
    return parse_allowed(Path(f"/proc/{pid}/status").read_text())


def parse_allowed(status_text: str) -> tuple[CpuSet, CpuSet]:
    fields = dict(re.findall(r"^(Cpus_allowed_list|Mems_allowed_list):\s*(\S*)", status_text, re.M))
    check(len(fields) == 2, f"no Cpus/Mems_allowed_list in {status_text[:200]!r}")
    return CpuSet.parse(fields["Cpus_allowed_list"]), CpuSet.parse(fields["Mems_allowed_list"])


def proc_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return ""


def proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cg_read(rel: str, name: str) -> str:
    return (AGENT_ROOT / rel / name).read_text().strip()


def cg_cpus(rel: str, name: str = "cpuset.cpus.effective") -> CpuSet:
    return CpuSet.parse(cg_read(rel, name))


def agent_cgroups() -> list[str]:
    """Every cgroup below the agent's root, as paths relative to it."""
    return sorted(str(p.parent.relative_to(AGENT_ROOT)) for p in AGENT_ROOT.rglob("cgroup.procs")
                  if p.parent != AGENT_ROOT)


def unlisted_cgroups(workloads: list[dict]) -> list[str]:
    """Workload or pod cgroups below the agent's root that no listed workload explains."""
    expected = {"agent", "shared", "shared/_released"}
    for w in workloads:
        expected.add(workload_cgroup(w["name"], w.get("pod")) if w["exclusive"] or w.get("pod")
                     else f"shared/{w['name']}")
        if w.get("pod"):
            expected.add(f"pod-{w['pod']}")
    return [rel for rel in agent_cgroups() if rel not in expected]


def anon_per_node(rel: str) -> dict[int, int]:
    """Anonymous memory of a cgroup per NUMA node, from memory.numa_stat."""
    for line in cg_read(rel, "memory.numa_stat").splitlines():
        key, *pairs = line.split()
        if key == "anon":
            return {int(k[1:]): int(v) for k, v in (p.split("=") for p in pairs)}
    raise ScenarioFailed(f"{rel}/memory.numa_stat has no anon line")


def workload_cgroup(name: str, pod: str | None = None) -> str:
    return f"pod-{pod}/{name}" if pod else f"wl-{name}"


# ---------------------------------------------------------------- shared by every guest
def stop_all(launched: list[subprocess.Popen]) -> None:
    """Kill what a scenario started and reap it; the list is emptied."""
    for proc in launched:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    launched.clear()


def undo_all(steps: list) -> str:
    """Run the undo steps a scenario registered (last first). Returns a problem, if any."""
    problems = []
    while steps:
        try:
            steps.pop()()
        except Exception as exc:
            problems.append(f"undoing the scenario's set-up: {exc}")
    return "; ".join(problems)


class AgentQueries:
    """What every guest asks its agent (through `self.agent.call`), whoever runs it."""

    agent: Any

    def workloads(self) -> list[dict]:
        status, body = self.agent.call("GET", "/v1/workloads")
        check(status == 200, f"GET /v1/workloads answered {status}: {body}")
        return body["workloads"]

    def listed(self, name: str) -> dict | None:
        return next((w for w in self.workloads() if w["name"] == name), None)

    def scrape(self) -> str:
        """The metrics endpoint, at the default address in both guests."""
        with urllib.request.urlopen(f"http://{METRICS_ADDRESS}/metrics", timeout=30) as response:
            return response.read().decode()


# ---------------------------------------------------------------- the agent and numa-run
class Guest(AgentQueries):
    """The agent under test, the workloads this scenario started, and the checks they share."""

    def __init__(self, shape: str, work: Path, kernel: Kernel) -> None:
        self.shape = shape
        self.work = work
        self.kernel = kernel
        (work / "agent").mkdir(parents=True, exist_ok=True)  # AgentProcess writes its config there
        self.agent = AgentProcess(work / "agent", "--cgroup-root", "auto", config=AGENT_CONFIG)
        # AgentProcess picks a free metrics port; the issue fixes it at 127.0.0.1:9464.
        where = self.agent.args.index("--metrics-address") + 1
        self.agent.args[where] = METRICS_ADDRESS
        self.agent.metrics_port = int(METRICS_ADDRESS.rsplit(":", 1)[1])
        self.standard_args = list(self.agent.args)
        self.variant: str | None = None  # a scenario's own agent flavour, None: the standard one
        # Undo steps a scenario registers; they run after its workloads are released.
        self.after_cleanup: list = []
        self.launched: list[subprocess.Popen] = []
        bindir = Path(sys.executable).parent
        run = bindir / "numa-run"
        self.numa_run_argv = [str(run)] if run.exists() else [sys.executable, "-m", "numa_agent.cli.numa_run"]

    # -- the agent
    def start_agent(self) -> None:
        try:
            self.agent.start(timeout=AGENT_START_TIMEOUT)
        except RuntimeError as exc:
            raise ScenarioFailed(f"agent did not start: {last_lines(str(exc), 8)}") from None

    def ensure_agent(self) -> None:
        """The standard agent, running: a scenario that used its own flavour leaves it behind."""
        if self.variant is not None:
            self.agent.stop()
            self.agent.args[:] = self.standard_args
            self.variant = None
        if self.agent.proc is None or self.agent.proc.poll() is not None:
            self.start_agent()

    def restart_agent(self, variant: str, *, hotplug: bool = False, config: str = AGENT_CONFIG) -> None:
        """Stop the agent and start it again with hotplug events on, or with another config
        (same state directory, socket and metrics address). ensure_agent() undoes it."""
        self.agent.stop()
        args = list(self.standard_args)
        if hotplug:
            args.remove("--no-hotplug")
        if config != AGENT_CONFIG:
            path = self.work / "agent" / f"config-{variant}.toml"
            path.write_text(config)
            args[args.index("--config") + 1] = str(path)
        self.agent.args[:] = args
        self.variant = variant
        self.start_agent()

    def status(self) -> dict:
        status, body = self.agent.call("GET", "/v1/status")
        check(status == 200, f"GET /v1/status answered {status}: {body}")
        return body

    def status_cli(self) -> dict:
        """What `numa-agent status --json` prints: the operator's view."""
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--json",
                            "--socket", self.agent.socket], capture_output=True, text=True, timeout=ADMIT_TIMEOUT)
        check(r.returncode == 0, f"numa-agent status --json exited {r.returncode}: {last_lines(r.stderr, 4)}")
        return json.loads(r.stdout)

    # -- numa-run
    def numa_run(self, *args: str, command=SLEEP, timeout: float = ADMIT_TIMEOUT) -> subprocess.CompletedProcess:
        """A short numa-run: waits for it to finish."""
        return subprocess.run([*self.numa_run_argv, "--socket", self.agent.socket, *args, "--", *command],
                              capture_output=True, text=True, timeout=timeout)

    def launch(self, name: str, *args: str, command=SLEEP, env: dict | None = None) -> "Running":
        """A long-running numa-run (it execs `command`); returns once the agent lists it."""
        out = open(self.work / f"{name}.out", "w+")
        err = open(self.work / f"{name}.err", "w+")
        proc = subprocess.Popen([*self.numa_run_argv, "--socket", self.agent.socket, "--name", name, *args,
                                 "--", *command], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})
        self.launched.append(proc)
        record = wait_for(lambda: proc.poll() is not None or self.listed(name), timeout=ADMIT_TIMEOUT,
                          interval=0.1)
        if proc.poll() is not None and not isinstance(record, dict):
            err.seek(0)
            raise ScenarioFailed(f"numa-run {' '.join(args)} exited {proc.returncode} instead of running: "
                                 f"{last_lines(err.read(), 6)}")
        check(isinstance(record, dict), f"workload {name} was not listed within {ADMIT_TIMEOUT:g} s")
        check(record["pid"] == proc.pid,
              f"{name} is listed with pid {record['pid']}, but numa-run's pid is {proc.pid} "
              "(the agent must place the caller, found by its peer credentials)")
        # The agent answered; numa-run still has to exec the command (~1 s here).
        return Running(self, name, proc, record, out, err)

    def wait_released(self, names: list[str], timeout: float = 30.0) -> bool:
        return bool(wait_for(lambda: not ({w["name"] for w in self.workloads()} & set(names)),
                             timeout=timeout, interval=0.05))

    def cleanup(self) -> str:
        """Stop what the scenario started; release what the agent still lists. Returns a problem, if any."""
        stop_all(self.launched)
        if self.agent.proc is None or self.agent.proc.poll() is not None:
            return ""
        if not wait_for(lambda: not self.workloads(), timeout=20, interval=0.1):
            names = [w["name"] for w in self.workloads()]
            for name in names:
                self.agent.call("DELETE", f"/v1/workloads/{name}")
            return f"workloads still listed after their programs were killed: {', '.join(names)}"
        if not wait_for(lambda: not unlisted_cgroups([]), timeout=10, interval=0.1):
            return f"cgroups left behind after every workload was released: {unlisted_cgroups([])}"
        return ""

    def undo_scenario_setup(self) -> str:
        return undo_all(self.after_cleanup)

    # -- checks shared by several scenarios
    def check_pinned(self, running: "Running", *, expect_mems: CpuSet | None = None) -> tuple[CpuSet, CpuSet]:
        """The process, its cgroup and the agent agree on CPUs and memory nodes. Returns (cpus, mems)."""
        name, record = running.name, running.record
        rel = workload_cgroup(name, record.get("pod"))
        cpus = CpuSet.parse(record["cpus"])
        mems = CpuSet.parse(",".join(str(n) for n in record["mems"]) or "")
        if expect_mems is not None:
            check(mems == expect_mems, f"{name}: agent booked memory nodes {mems.format() or '-'}, "
                                       f"expected {expect_mems.format()}")
        pid = running.proc.pid
        check(proc_cgroup(pid) == f"/numa-agent/{rel}",
              f"{name}: /proc/{pid}/cgroup is {proc_cgroup(pid)!r}, expected /numa-agent/{rel}")
        check(str(pid) in cg_read(rel, "cgroup.procs").split(), f"{name}: pid {pid} not in {rel}/cgroup.procs")
        for file in ("cpuset.cpus", "cpuset.cpus.effective"):
            check(cg_cpus(rel, file) == cpus, f"{name}: {rel}/{file} is {cg_read(rel, file)!r}, "
                                              f"agent says {cpus.format()}")
        for file in ("cpuset.mems", "cpuset.mems.effective"):
            check(CpuSet.parse(cg_read(rel, file)) == mems,
                  f"{name}: {rel}/{file} is {cg_read(rel, file)!r}, agent says {mems.format()}")
        running.wait_exec()
        allowed_cpus, allowed_mems = proc_allowed(pid)
        check(allowed_cpus == cpus, f"{name}: Cpus_allowed_list is {allowed_cpus.format()}, "
                                    f"expected {cpus.format()}")
        check(allowed_mems == mems, f"{name}: Mems_allowed_list is {allowed_mems.format()}, "
                                    f"expected {mems.format()}")
        env = proc_env(pid)
        check(env.get("NUMA_AGENT_WORKLOAD") == name and env.get("NUMA_AGENT_CPUS") == cpus.format()
              and CpuSet.parse(env.get("NUMA_AGENT_MEMS", "")) == mems and bool(env.get("NUMA_AGENT_MARK")),
              f"{name}: environment NUMA_AGENT_* is "
              f"{ {k: v for k, v in env.items() if k.startswith('NUMA_AGENT_')} }")
        return cpus, mems

    def check_exclusive(self, name: str, rel: str, cpus: CpuSet) -> None:
        """No other cgroup below the agent's root (the shared pool included) may use `cpus`."""
        for other in agent_cgroups():
            if other == rel or other.startswith(rel + "/") or rel.startswith(other + "/"):
                continue  # itself, its children, the pod that contains it
            overlap = cg_cpus(other) & cpus
            check(not overlap, f"{name}'s exclusive CPUs {overlap.format()} are also in "
                               f"{other}/cpuset.cpus.effective ({cg_read(other, 'cpuset.cpus.effective')})")

    def shared_pool(self) -> CpuSet:
        return cg_cpus("shared")


class Running:
    def __init__(self, guest: Guest, name: str, proc: subprocess.Popen, record: dict, out, err) -> None:
        self.guest, self.name, self.proc, self.record, self.out, self.err = guest, name, proc, record, out, err

    @property
    def cpus(self) -> CpuSet:
        return CpuSet.parse(self.record["cpus"])

    @property
    def rel(self) -> str:
        return workload_cgroup(self.name, self.record.get("pod"))

    def wait_exec(self) -> None:
        """Until numa-run has exec'd the command (the environment is the command's then)."""
        def execd():
            try:
                return "NUMA_AGENT_WORKLOAD" in proc_env(self.proc.pid)
            except OSError:
                return False
        check(wait_for(execd, timeout=ADMIT_TIMEOUT, interval=0.1),
              f"{self.name}: numa-run did not exec its command within {ADMIT_TIMEOUT:g} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(30)


def last_lines(text: str, n: int) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


def json_in(text: str) -> dict:
    """The first JSON object in `text` (numa-run --json prints the record among other lines)."""
    start = text.find("{")
    check(start >= 0, f"no JSON in {last_lines(text, 4)!r}")
    return json.JSONDecoder().raw_decode(text[start:])[0]


# ---------------------------------------------------------------- scenarios
def one_core(g: Guest) -> int:
    """CPUs in one core: what `--cpus N` asks for to get exactly one whole core."""
    return g.kernel.threads_per_core


def s1_pin_core(g: Guest) -> str | None:
    n = one_core(g) if one_core(g) > 1 else 2
    a = g.launch("pin-a", "--cpus", str(n))
    cpus = a.cpus
    nodes = g.kernel.nodes_of(cpus)
    check(len(cpus) == n, f"asked for {n} CPUs, got {cpus.format()}")
    check(len(nodes) == 1, f"CPUs {cpus.format()} span nodes {nodes}")
    check(g.kernel.whole_cores(cpus), f"CPUs {cpus.format()} are not whole cores "
                                      f"(siblings {[g.kernel.siblings[c].format() for c in cpus.ids()]})")
    if g.kernel.threads_per_core > 1:
        check(cpus == g.kernel.siblings[cpus.min()], f"{cpus.format()} is not both threads of one core")
    g.check_pinned(a, expect_mems=CpuSet(nodes))
    check(not set(g.kernel.memory_only_nodes) & set(a.record["mems"]),
          f"memory on the CPU-less node(s) {g.kernel.memory_only_nodes} without being asked")


def s2_exclusive(g: Guest) -> str | None:
    n = one_core(g) if one_core(g) > 1 else 2
    a = g.launch("excl-a", "--cpus", str(n))
    b = g.launch("excl-b", "--cpus", str(n))
    check(not a.cpus & b.cpus, f"two exclusive workloads share CPUs: {a.cpus.format()} and {b.cpus.format()}")
    for w in (a, b):
        cpus, _ = g.check_pinned(w)
        check(len(cpus) == n and len(g.kernel.nodes_of(cpus)) == 1 and g.kernel.whole_cores(cpus),
              f"{w.name} got {cpus.format()}, not {n} CPUs of whole cores on one node")
        g.check_exclusive(w.name, w.rel, cpus)
    check(not g.shared_pool() & (a.cpus | b.cpus), f"the shared pool {g.shared_pool().format()} holds "
                                                    "exclusive CPUs")


def s3_single_numa(g: Guest) -> str | None:
    largest = max(len(c) for c in g.kernel.node_cpus.values())
    want = largest + 1  # more than any node has, less than the machine has
    r = g.numa_run("--cpus", str(want), "--policy", "single-numa-node", command=("true",))
    check(r.returncode == 125, f"single-numa-node --cpus {want}: exit {r.returncode}, expected 125; "
                               f"stderr: {last_lines(r.stderr, 4)}")
    check("TopologyAffinityError" in r.stderr, f"refusal does not say TopologyAffinityError: "
                                               f"{last_lines(r.stderr, 6)}")
    check("hints" in r.stderr and "merged hint" in r.stderr,
          f"refusal does not explain the hints and the merged hint: {last_lines(r.stderr, 8)}")
    check(g.workloads() == [], f"a refused request left workloads behind: {g.workloads()}")
    r = g.numa_run("--cpus", str(want), "--policy", "best-effort", "--json",
                   command=("grep", "_allowed_list", "/proc/self/status"))
    check(r.returncode == 0, f"best-effort --cpus {want}: exit {r.returncode}: {last_lines(r.stderr, 6)}")
    record = json_in(r.stderr)
    cpus, mems = parse_allowed(r.stdout)
    check(cpus == CpuSet.parse(record["cpus"]) and len(cpus) == want,
          f"best-effort ran on {cpus.format()}, agent granted {record['cpus']} (asked {want})")
    nodes = g.kernel.nodes_of(cpus)
    check(len(nodes) >= 2, f"{want} CPUs cannot fit one node, yet {cpus.format()} is on {nodes}")
    check(mems == CpuSet(record["mems"]) and set(mems.ids()) <= set(nodes) | set(g.kernel.memory_only_nodes),
          f"memory nodes {mems.format()} do not follow the CPUs' nodes {nodes}")


def s4_devices(g: Guest) -> str | None:
    tried = 0
    for resource, prefix in (("nvme", "0x0108"), ("nic", "0x0200")):
        located = [a for a in g.kernel.devices_of_class(prefix) if g.kernel.pci_nodes[a] >= 0]
        if not located:
            continue
        tried += 1
        n = one_core(g) if one_core(g) > 1 else 2
        r = g.numa_run("--cpus", str(n), "--device", f"{resource}=1", "--json",
                       command=("sh", "-c", 'grep _allowed_list /proc/self/status; '
                                            'echo "devices=$NUMA_AGENT_DEVICES"'))
        check(r.returncode == 0, f"--device {resource}=1: exit {r.returncode}: {last_lines(r.stderr, 6)}")
        devices = re.search(r"^devices=(.*)$", r.stdout, re.M).group(1).split(",")
        check(len(devices) == 1 and devices[0] in located,
              f"--device {resource}=1 got {devices}; the {resource} with a known node is {located}")
        node = g.kernel.pci_nodes[devices[0]]
        cpus, mems = parse_allowed(r.stdout)
        check(g.kernel.nodes_of(cpus) == [node], f"{resource} {devices[0]} is on node {node}, "
                                                 f"but the CPUs {cpus.format()} are on {g.kernel.nodes_of(cpus)}")
        check(mems == CpuSet([node]), f"{resource} {devices[0]} is on node {node}, memory on {mems.format()}")
        record = json_in(r.stderr)
        check([d["address"] for d in record["devices"]] == devices, f"record devices {record['devices']}")
    if not tried:
        raise ScenarioSkipped("no NVMe or NIC on this shape reports a NUMA node")


# Touches 32 MiB of anonymous memory, then says so and waits to be killed.
TOUCH_MEMORY = ("import os, sys, time\n"
                "block = bytes([1]) * (int(os.environ.get('VM_E2E_TOUCH_MIB', '32')) << 20)\n"
                "open(os.environ['VM_E2E_READY'], 'w').write('ok')\n"
                "time.sleep(600)\n")


def _memory_workload(g: Guest, name: str, *args: str, mib: int = 32) -> tuple[Running, dict[int, int]]:
    ready = g.work / f"{name}.ready"
    ready.unlink(missing_ok=True)
    w = g.launch(name, *args, command=(sys.executable, "-c", TOUCH_MEMORY),
                 env={"VM_E2E_READY": str(ready), "VM_E2E_TOUCH_MIB": str(mib)})
    check(wait_for(lambda: ready.exists() or w.proc.poll() is not None, timeout=ADMIT_TIMEOUT, interval=0.1)
          and w.proc.poll() is None, f"{name}: the memory toucher did not get ready (exit {w.proc.poll()}): "
                                     f"{last_lines(Path(w.err.name).read_text(), 4)}")
    return w, anon_per_node(w.rel)


def s5_memory(g: Guest) -> str | None:
    n = one_core(g) if one_core(g) > 1 else 2
    limit = 128 * MIB
    w, anon = _memory_workload(g, "mem-a", "--cpus", str(n), "--memory", "128Mi")
    cpu_nodes = g.kernel.nodes_of(w.cpus)
    check(len(cpu_nodes) == 1, f"{w.cpus.format()} spans nodes {cpu_nodes}")
    g.check_pinned(w, expect_mems=CpuSet(cpu_nodes))
    check(cg_read(w.rel, "memory.max") == str(limit), f"{w.rel}/memory.max is {cg_read(w.rel, 'memory.max')}, "
                                                      f"expected {limit}")
    node = cpu_nodes[0]
    elsewhere = {k: v for k, v in anon.items() if k != node and v}
    check(anon.get(node, 0) >= 30 * MIB and sum(elsewhere.values()) < 2 * MIB,
          f"the 32 MiB the workload touched are not on node {node}: anon per node {anon}")
    for only in g.kernel.memory_only_nodes:
        check(anon.get(only, 0) < MIB, f"memory landed on CPU-less node {only} unasked: {anon}")
    w.stop()
    if g.kernel.memory_only_nodes:
        return _memory_only_nodes(g, n)
    return None


def numa_maps_anon(pid: int) -> dict[int, int]:
    """A process's anonymous memory per NUMA node in bytes, from /proc/PID/numa_maps: the
    mappings with no file behind them (heap, stacks, anonymous mmap), whose pages the
    process itself placed (a file's page cache may sit where an earlier reader put it)."""
    out: dict[int, int] = {}
    for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
        if "anon" not in fields or "file" in fields:
            continue
        page = int(fields.get("kernelpagesize_kB", "4")) << 10
        for key, pages in fields.items():
            if key[0] == "N" and key[1:].isdigit():
                out[int(key[1:])] = out.get(int(key[1:]), 0) + int(pages) * page
    return out


def _memory_only_nodes(g: Guest, n: int) -> str:
    """The CPU-less node is memory-only: out of a plain booking and of `-i all` (pages read
    from /proc/PID/numa_maps), used when -m and -p name it, and a request over the CPU
    nodes' memory is refused naming it."""
    only, cpu_nodes = g.kernel.memory_only_nodes[0], g.kernel.cpu_nodes
    memory_only = set(g.kernel.memory_only_nodes)

    def pages_apart(w: Running, what: str) -> dict[int, int]:
        anon = numa_maps_anon(w.proc.pid)
        check(not memory_only & set(w.record["mems"]), f"{what}: booked memory nodes {w.record['mems']}")
        check(all(anon.get(m, 0) == 0 for m in memory_only), f"{what}: pages on a memory-only node: {anon}")
        return anon

    w, _ = _memory_workload(g, "mem-plain", "--cpus", str(n), "--memory", "64Mi")
    pages_apart(w, "a plain --memory booking")
    w.stop()
    w, _ = _memory_workload(g, "mem-all", "-i", "all", "--cpus", str(n))
    anon = pages_apart(w, "-i all")
    check(sorted(w.record["mems"]) == cpu_nodes and all(anon.get(c, 0) >= 8 * MIB for c in cpu_nodes),
          f"-i all: mems {w.record['mems']}, anon per node {anon}: not interleaved over {cpu_nodes}")
    w.stop()
    near = cpu_nodes[0]
    w, _ = _memory_workload(g, "mem-named", "--cpus", str(n), "--memory", "64Mi", "-m", f"{near},{only}",
                            "-p", str(only))
    g.check_pinned(w, expect_mems=CpuSet([near, only]))
    anon = numa_maps_anon(w.proc.pid)
    check(anon.get(only, 0) >= 30 * MIB, f"-m {near},{only} -p {only}: anon per node {anon}")
    w.stop()
    check(g.wait_released([w.name]), f"{w.name} still listed 30 s after it exited")  # its booking counts till then
    free = sum(node["memory_bytes"]["free"] for node in g.status()["nodes"] if node["id"] in cpu_nodes)
    r = g.numa_run("--cpus", "1", "--memory", str(free + 64 * MIB), command=("true",))
    check(r.returncode == 125 and "TopologyAffinityError" in r.stderr
          and f"to use memory-only node(s) {only}" in r.stderr,
          f"--memory {(free + 64 * MIB) >> 20} MiB (over nodes {cpu_nodes}' free): exit {r.returncode}: "
          f"{last_lines(r.stderr, 4)}")
    return (f"node {only} memory-only: plain booking and -i all kept off it (numa_maps), "
            f"-m {near},{only} -p {only} put {anon[only] >> 20} MiB there, an over-large request refused")


def s6_release(g: Guest) -> str | None:
    n = one_core(g) if one_core(g) > 1 else 2
    w = g.launch("rel-a", "--cpus", str(n))
    cpus, _ = g.check_pinned(w)
    check(not g.shared_pool() & cpus, f"shared pool {g.shared_pool().format()} holds {cpus.format()}")
    w.stop()
    exited = time.monotonic()

    def released():
        return (not (AGENT_ROOT / w.rel).exists() and cpus.issubset(g.shared_pool())
                and g.listed(w.name) is None)
    done = wait_for(released, timeout=30, interval=0.02)
    elapsed = time.monotonic() - exited
    check(done, f"30 s after exit: cgroup exists={(AGENT_ROOT / w.rel).exists()}, shared pool "
                f"{g.shared_pool().format()}, listed={g.listed(w.name) is not None}")
    check(elapsed <= RELEASE_LIMIT, f"released only {elapsed:.2f} s after the program exited "
                                    f"(limit {RELEASE_LIMIT:g} s)")
    return f"cgroup gone and CPUs back in the shared pool {elapsed:.2f} s after exit"


def s7_restart(g: Guest) -> str | None:
    n = one_core(g) if one_core(g) > 1 else 2
    a = g.launch("keep-a", "--cpus", str(n))
    b = g.launch("keep-b", "--cpus", str(n))
    before = {w.name: g.check_pinned(w)[0] for w in (a, b)}

    def still_pinned(when: str) -> None:
        listed = {w["name"]: w for w in g.workloads()}
        check(set(before) <= set(listed), f"{when}: listed {sorted(listed)}, expected {sorted(before)}")
        for w in (a, b):
            check(CpuSet.parse(listed[w.name]["cpus"]) == before[w.name],
                  f"{when}: {w.name} is listed with {listed[w.name]['cpus']}, had {before[w.name].format()}")
            check(listed[w.name]["pid"] == w.proc.pid, f"{when}: {w.name} pid {listed[w.name]['pid']}")
            w.record = listed[w.name]
            g.check_pinned(w)
            g.check_exclusive(w.name, w.rel, before[w.name])

    def tree_matches_listing(when: str) -> None:
        stray = unlisted_cgroups(g.workloads())
        check(not stray, f"{when}: cgroups the agent no longer lists: {stray}")

    def new_admission_is_apart(when: str, name: str) -> None:
        c = g.launch(name, "--cpus", str(n))
        cpus, _ = g.check_pinned(c)
        taken = before["keep-a"] | before["keep-b"]
        check(len(cpus) == n and not cpus & taken,
              f"{when}: new admission got {cpus.format()}, overlapping running {taken.format()}")
        g.check_exclusive(name, c.rel, cpus)
        c.stop()
        check(g.wait_released([name]), f"{when}: {name} still listed after it exited")

    g.agent.kill()
    # What a kill between a cgroup's mkdir and its writes leaves (issue 36): nothing
    # asked, or only cpuset.mems; the next start removes them, nobody booked them.
    half_made = ("wl-half-made", "wl-half-mems")
    for rel in half_made:
        (AGENT_ROOT / rel).mkdir()
    (AGENT_ROOT / "wl-half-mems" / "cpuset.mems").write_text(str(min(cg_cpus("", "cpuset.mems.effective"))))
    g.start_agent()
    still_pinned("after kill -9 and restart")
    tree_matches_listing("after restart")
    left = [rel for rel in half_made if (AGENT_ROOT / rel).exists()]
    check(not left, f"after restart: half-made cgroups {left} are still there")
    new_admission_is_apart("after restart", "keep-c")

    g.agent.kill()
    checkpoint = g.agent.state_dir / "checkpoint.json"
    check(checkpoint.exists(), f"no checkpoint at {checkpoint}")
    checkpoint.write_bytes(b'{"version": 1, "checksum": "sha256:00", "data": {trunc')
    g.start_agent()
    quarantined = list(g.agent.state_dir.glob("checkpoint.json.corrupt-*"))
    check(quarantined, f"the corrupt checkpoint was not moved aside: {sorted(os.listdir(g.agent.state_dir))}")
    still_pinned("after a corrupt checkpoint")
    tree_matches_listing("after a corrupt checkpoint")
    new_admission_is_apart("after a corrupt checkpoint", "keep-d")
    return f"adopted from the cgroup tree; corrupt checkpoint kept as {quarantined[0].name}"


def s8_pods(g: Guest) -> str | None:
    node = g.kernel.cpu_nodes[-1]  # the last node holds no reserved CPU (the agent reserves CPU 0)
    budget = len(g.kernel.node_cpus[node])
    n = one_core(g)
    check(budget > n, f"node {node} has only {budget} CPUs, too few for a pod with a sidecar")
    main = g.launch("main", "--pod", "pd", "--pod-cpus", str(budget), "--cpus", str(n))
    side = g.launch("side", "--pod", "pd")
    pod_cpus = cg_cpus("pod-pd")
    check(len(pod_cpus) == budget and len(g.kernel.nodes_of(pod_cpus)) == 1,
          f"pod-pd/cpuset.cpus.effective is {pod_cpus.format()}, expected {budget} CPUs of one node")
    pod_node = g.kernel.nodes_of(pod_cpus)[0]
    for w in (main, side):
        check(w.record.get("pod") == "pd", f"{w.name} is listed in pod {w.record.get('pod')!r}")
    main_cpus, _ = g.check_pinned(main, expect_mems=CpuSet([pod_node]))
    check(len(main_cpus) == n and main_cpus.issubset(pod_cpus) and g.kernel.whole_cores(main_cpus),
          f"main got {main_cpus.format()}, expected one whole core inside the pod's {pod_cpus.format()}")
    side_cpus, _ = g.check_pinned(side, expect_mems=CpuSet([pod_node]))
    check(side_cpus == pod_cpus - main_cpus,
          f"the sidecar runs on {side_cpus.format()}, expected the rest of the pod: "
          f"{(pod_cpus - main_cpus).format()}")
    g.check_exclusive("main", main.rel, main_cpus)
    g.check_exclusive("pod pd", "pod-pd", pod_cpus)  # the shared pool and other workloads stay out


def s9_metrics(g: Guest) -> str | None:
    node = g.kernel.cpu_nodes[-1]
    n = one_core(g) if one_core(g) > 1 else 2
    w = g.launch("metered", "--cpus", str(n), "--cpunodebind", str(node))
    cpus, _ = g.check_pinned(w)
    check(g.kernel.nodes_of(cpus) == [node], f"--cpunodebind {node} got {cpus.format()}")
    with urllib.request.urlopen(f"http://{METRICS_ADDRESS}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for m in re.finditer(r'^numa_agent_cpus\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        samples[(labels.get("numa_node"), labels.get("state"))] = float(m.group(2))
    for other in g.kernel.cpu_nodes:
        want = len(cpus) if other == node else 0
        got = samples.get((str(other), "allocated"))
        check(got == want, f'numa_agent_cpus{{numa_node="{other}",state="allocated"}} is {got}, expected {want}')
    _, status = g.agent.call("GET", "/v1/status")
    for entry in status["nodes"]:
        got = samples.get((str(entry["id"]), "free"))
        check(got == entry["cpus"]["free"], f"node {entry['id']}: metrics free {got}, status "
                                            f"{entry['cpus']['free']}")



HOTPLUG_LIMIT = 15.0  # "within a few seconds", with room for emulation


def _node_capacity(status: dict, node: int) -> int:
    return next(e["cpus"]["capacity"] for e in status["nodes"] if e["id"] == node)


def _lost_cpus(record: dict) -> CpuSet:
    """The CPUs named in a workload's `lost` list (entries read `cpus 5` or `pci ...`)."""
    found = CpuSet()
    for entry in record.get("lost") or ():
        if entry.startswith("cpus "):
            found |= CpuSet.parse(entry[len("cpus "):])
    return found


def _hotplug_cpu_events(metrics_text: str) -> float:
    m = re.search(r'^numa_agent_hotplug_events_total\{kind="cpu"\} (\S+)$', metrics_text, re.M)
    return float(m.group(1)) if m else 0.0


def s10_hotplug(g: Guest) -> str | None:
    g.restart_agent("hotplug", hotplug=True)
    check("runs without hotplug" not in g.agent.log(),
          f"the agent started without hotplug events: {last_lines(g.agent.log(), 3)}")
    node = g.kernel.cpu_nodes[-1]  # CPU 0 (which cannot go offline) is on the first node
    n = one_core(g) if one_core(g) > 1 else 2
    a = g.launch("hot-a", "--cpus", str(n), "--cpunodebind", str(node))
    cpus, _ = g.check_pinned(a)
    check(g.kernel.nodes_of(cpus) == [node], f"--cpunodebind {node} got {cpus.format()}")
    victim = cpus.max()
    online = SYS_CPUS / f"cpu{victim}" / "online"
    check(victim != 0 and online.exists(), f"CPU {victim} cannot be taken offline (no {online})")
    capacity = _node_capacity(g.status(), node)
    kept = cpus - CpuSet([victim])
    try:
        online.write_text("0")
        went = time.monotonic()

        def noticed():
            status = g.status()
            record = next((w for w in status["workloads"] if w["name"] == a.name), None)
            return (record is not None and victim in _lost_cpus(record)
                    and CpuSet.parse(record["cpus"]) == kept and _node_capacity(status, node) == capacity - 1)
        done = wait_for(noticed, timeout=HOTPLUG_LIMIT, interval=0.1)
        offline_seconds = time.monotonic() - went
        status = g.status_cli()
        record = next((w for w in status["workloads"] if w["name"] == a.name), None)
        check(done and record is not None,
              f"{HOTPLUG_LIMIT:g} s after CPU {victim} went offline, status --json shows {a.name} as "
              f"{record and {k: record[k] for k in ('cpus', 'lost')}}, node {node} capacity "
              f"{_node_capacity(status, node)} (was {capacity})")
        check(victim in _lost_cpus(record) and CpuSet.parse(record["cpus"]) == kept,
              f"status --json: {a.name} cpus {record['cpus']}, lost {record['lost']}; expected cpus "
              f"{kept.format()} and CPU {victim} lost")
        check(_node_capacity(status, node) == capacity - 1,
              f"node {node} capacity {_node_capacity(status, node)} with CPU {victim} offline, was {capacity}")
        check(cg_cpus(a.rel, "cpuset.cpus") == kept,
              f"{a.rel}/cpuset.cpus is {cg_read(a.rel, 'cpuset.cpus')!r} with CPU {victim} offline, "
              f"expected {kept.format()}")
        allowed, _ = proc_allowed(a.proc.pid)
        check(allowed == kept, f"{a.name}: Cpus_allowed_list is {allowed.format()} with CPU {victim} offline")
        events = _hotplug_cpu_events(g.scrape())
        check(events > 0, f'numa_agent_hotplug_events_total{{kind="cpu"}} is {events} after CPU {victim} '
                          "went offline")

        online.write_text("1")
        came = time.monotonic()

        def returned():
            status = g.status()
            return (_node_capacity(status, node) == capacity and victim in CpuSet.parse(status["shared_pool"])
                    and victim in g.shared_pool())
        done = wait_for(returned, timeout=HOTPLUG_LIMIT, interval=0.1)
        online_seconds = time.monotonic() - came
        status = g.status()
        check(done, f"{HOTPLUG_LIMIT:g} s after CPU {victim} came back: node {node} capacity "
                    f"{_node_capacity(status, node)} (expected {capacity}), shared pool {status['shared_pool']} "
                    f"(cgroup {g.shared_pool().format()})")
        record = next(w for w in status["workloads"] if w["name"] == a.name)
        check(CpuSet.parse(record["cpus"]) == kept and cg_cpus(a.rel, "cpuset.cpus") == kept,
              f"CPU {victim} came back and {a.name} has {record['cpus']} (cgroup {cg_read(a.rel, 'cpuset.cpus')}); "
              f"it must stay on {kept.format()}: a returning CPU goes to the shared pool")
        b = g.launch("hot-b", "--cpus", str(n))
        b_cpus, _ = g.check_pinned(b)
        check(not b_cpus & kept, f"new admission got {b_cpus.format()}, overlapping {a.name}'s {kept.format()}")
        g.check_exclusive(b.name, b.rel, b_cpus)
        g.check_exclusive(a.name, a.rel, kept)
    finally:
        if online.read_text().strip() == "0":
            online.write_text("1")
    return (f"CPU {victim} offline seen in {offline_seconds:.2f} s, back in the shared pool in "
            f"{online_seconds:.2f} s; cpu hotplug events {events:g}")


PARTITIONS_CONFIG = AGENT_CONFIG + '\n[agent]\ncpuset_partitions = "isolated"\n'


def dmesg_tail(n: int = 5) -> str:
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    return last_lines(r.stdout, n) if r.returncode == 0 else f"(dmesg failed: {r.stderr.strip()})"


def remove_agent_root() -> None:
    """rmdir the agent's cgroup tree, children first (the agent is stopped, nothing runs there)."""
    if not AGENT_ROOT.exists():
        return
    for path in sorted((p.parent for p in AGENT_ROOT.rglob("cgroup.procs")), key=lambda p: -len(p.parts)):
        procs = (path / "cgroup.procs").read_text().split()
        check(not procs, f"{path} still holds processes {procs}")
        path.rmdir()


def s11_partitions(g: Guest) -> str | None:
    cpus_file = AGENT_ROOT / "cpuset.cpus.partition"

    def undo() -> None:
        g.agent.stop()
        g.variant = "stopped"  # the next scenario starts the standard agent again
        if cpus_file.exists():
            cpus_file.write_text("member")
            state = cpus_file.read_text().strip()
            check(state == "member", f"{cpus_file} reads {state!r} after writing member")
        remove_agent_root()
    g.after_cleanup.append(undo)

    # The administrator's part: a fresh agent root that is a partition root of every CPU
    # but CPU 0 (the top cgroup keeps CPU 0 for everything else on the machine).
    g.agent.stop()
    remove_agent_root()
    AGENT_ROOT.mkdir()
    every_cpu = CpuSet.parse((SYS_CPUS / "online").read_text().strip())
    given = every_cpu - CpuSet([0])
    mems = (SYS_NODES / "has_memory").read_text().strip()
    (AGENT_ROOT / "cpuset.cpus").write_text(given.format())
    (AGENT_ROOT / "cpuset.mems").write_text(mems)
    cpus_file.write_text("root")
    state = cpus_file.read_text().strip()
    check(state == "root", f"{cpus_file} reads {state!r} after writing root (cpuset.cpus {given.format()}); "
                           f"dmesg: {dmesg_tail()}")
    check(cg_cpus("", "cpuset.cpus.effective") == given,
          f"the partition root's cpuset.cpus.effective is {cg_read('', 'cpuset.cpus.effective')!r}, "
          f"expected {given.format()}")

    # The agent hands out what its cgroup root grants (cpuset.cpus.effective), not its own
    # affinity: started from the top cgroup, as here, it is itself allowed only CPU 0.
    g.restart_agent("partitions", config=PARTITIONS_CONFIG)
    check(f"grants cpus {given.format()}" in g.agent.log(),
          f"the agent did not take its CPUs from its cgroup root: {last_lines(g.agent.log(), 4)}")
    check("exclusive workloads become isolated cpuset partitions" in g.agent.log(),
          f"the agent did not take up partitions: {last_lines(g.agent.log(), 4)}")
    n = one_core(g) if one_core(g) > 1 else 2
    w = g.launch("part-a", "--cpus", str(n))
    cpus, _ = g.check_pinned(w)
    partition = cg_read(w.rel, "cpuset.cpus.partition")
    check(partition == "isolated", f"{w.rel}/cpuset.cpus.partition reads {partition!r}, expected 'isolated'; "
                                   f"agent log: {last_lines(g.agent.log(), 3)}; dmesg: {dmesg_tail(3)}")
    parent = cg_cpus("", "cpuset.cpus.effective")
    check(not parent & cpus, f"the agent root's cpuset.cpus.effective {parent.format()} still holds the "
                             f"isolated partition's {cpus.format()}")
    check(parent | cpus == given, f"the agent root's effective {parent.format()} and the partition's "
                                  f"{cpus.format()} do not add up to {given.format()}")
    check(not g.shared_pool() & cpus, f"the shared pool {g.shared_pool().format()} holds {cpus.format()}")
    g.check_exclusive(w.name, w.rel, cpus)
    w.stop()

    def released():
        return (not (AGENT_ROOT / w.rel).exists() and cpus.issubset(g.shared_pool())
                and cpus.issubset(cg_cpus("", "cpuset.cpus.effective")) and g.listed(w.name) is None)
    check(wait_for(released, timeout=30, interval=0.05),
          f"30 s after exit: cgroup exists={(AGENT_ROOT / w.rel).exists()}, shared pool "
          f"{g.shared_pool().format()}, agent root effective {cg_read('', 'cpuset.cpus.effective')}")
    return f"agent root partition {given.format()}; {w.name} isolated on {cpus.format()}"


def s12_recovery(g: Guest) -> str | None:
    """The checkpoint lost under a workload with a memory limit: rebuilt from the
    cgroup tree with its memory booking, owner and memory.max intact. Then, in the
    affinity fallback, the workload's PID recycled while the agent was down: the
    stranger is neither pinned nor taken for the workload."""
    node0 = next(n for n in g.status()["nodes"] if n["id"] == g.kernel.cpu_nodes[0])
    size = (node0["memory_bytes"]["free"] * 6 // 10) // MIB * MIB
    w = g.launch("rec-mem", "--shared", "--memory", str(size), "-N", str(node0["id"]), "-m", str(node0["id"]))
    rel = "shared/rec-mem"  # a workload without exclusive CPUs lives below the shared pool
    limit = cg_read(rel, "memory.max")
    check(limit == str(size), f"{rel}/memory.max is {limit}, expected {size}")
    g.agent.kill()
    for name in ("checkpoint.json", "checkpoint.json.prev"):
        (g.agent.state_dir / name).unlink(missing_ok=True)
    g.start_agent()
    listed = g.listed("rec-mem")
    check(listed is not None, f"rec-mem was not rebuilt: listed {[x['name'] for x in g.workloads()]}")
    check(listed["memory_bytes"] == {str(node0["id"]): size},
          f"rebuilt rec-mem books {listed['memory_bytes']}, expected {size} bytes on node {node0['id']}")
    check(listed["owner_uid"] == w.record["owner_uid"], f"owner {listed['owner_uid']}, was {w.record['owner_uid']}")
    check(cg_read(rel, "memory.max") == limit, f"memory.max became {cg_read(rel, 'memory.max')} (was {limit})")
    again = g.numa_run("--shared", "--memory", str(size), "-N", str(node0["id"]), "-m", str(node0["id"]),
                       command=("true",))
    check(again.returncode == 125, f"a second {size // MIB} MiB on node {node0['id']} was not refused: "
                                   f"exit {again.returncode}")
    w.stop()
    return f"memory.max {limit} and {size // MIB} MiB on node {node0['id']} kept after the checkpoint was lost; " \
           f"{_recycled_pid(g)}"


def _recycled_pid(g: Guest) -> str:
    """A second agent in the affinity fallback; its workload's PID recycled while it was down."""
    b = AgentProcess(g.work / "agent-affinity", "--cgroup-root", "none", "--metrics-address", "")
    b.start(timeout=AGENT_START_TIMEOUT)
    stranger = None
    try:
        victim = subprocess.Popen([*g.numa_run_argv, "--socket", b.socket, "--name", "victim", "--cpus", "1",
                                   "--", *SLEEP], stdin=subprocess.DEVNULL)
        g.launched.append(victim)
        check(wait_for(lambda: any(x["name"] == "victim" for x in b.call("GET", "/v1/workloads")[1]["workloads"]),
                       timeout=ADMIT_TIMEOUT, interval=0.1), "victim was not admitted by the affinity agent")
        pid = victim.pid
        b.kill()
        victim.kill()
        victim.wait()
        stranger = _process_with_pid(pid)
        check(stranger is not None, f"could not get PID {pid} recycled (ns_last_pid)")
        before = os.sched_getaffinity(stranger.pid)
        b.start(timeout=AGENT_START_TIMEOUT)
        names = [x["name"] for x in b.call("GET", "/v1/workloads")[1]["workloads"]]
        check("victim" not in names, f"after PID {pid} was recycled the agent still lists victim: {names}")
        check(os.sched_getaffinity(stranger.pid) == before,
              f"the process now holding PID {pid} was re-pinned to {sorted(os.sched_getaffinity(stranger.pid))}")
        return (f"PID {pid} recycled: the new process kept CPUs {CpuSet(before).format()}, victim released; "
                f"{_rebuilt_from_process(g, b)}")
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
        b.stop()


def _listed_by(b: AgentProcess, name: str) -> dict | None:
    return next((x for x in b.call("GET", "/v1/workloads")[1]["workloads"] if x["name"] == name), None)


def _marked_on(g: Guest, b: AgentProcess, name: str) -> tuple[subprocess.Popen, CpuSet]:
    """`numa-run --cpus 1` of a sleeper on the affinity agent `b`, admitted and exec'd
    with its mark; the process and its CPUs."""
    proc = subprocess.Popen([*g.numa_run_argv, "--socket", b.socket, "--name", name, "--cpus", "1",
                             "--", *SLEEP], stdin=subprocess.DEVNULL)
    g.launched.append(proc)
    check(wait_for(lambda: _listed_by(b, name) and "NUMA_AGENT_MARK" in proc_env(proc.pid),
                   timeout=ADMIT_TIMEOUT, interval=0.1), f"{name} was not admitted and exec'd by the affinity agent")
    return proc, CpuSet.parse(_listed_by(b, name)["cpus"])


def _rebuilt_from_process(g: Guest, b: AgentProcess) -> str:
    """The affinity agent's checkpoint truncated and its previous generation gone
    under a running workload: rebuilt from the process, its CPU never handed out again."""
    keeper, cpus = _marked_on(g, b, "keeper")
    # Another user copies keeper's mark, token included, into a process of theirs on
    # a CPU of the shared pool: the token is keeper's pid's, so it books nothing.
    pool = CpuSet(os.sched_getaffinity(0)) - cpus
    forger = subprocess.Popen(SLEEP, stdin=subprocess.DEVNULL, user=65534, group=65534,
                              env={**proc_env(keeper.pid), "NUMA_AGENT_WORKLOAD": "forged"},
                              preexec_fn=lambda: os.sched_setaffinity(0, pool.ids()[:1] or cpus.ids()))
    g.launched.append(forger)
    b.kill()
    checkpoint = b.state_dir / "checkpoint.json"
    checkpoint.write_bytes(checkpoint.read_bytes()[:40])
    (b.state_dir / "checkpoint.json.prev").unlink(missing_ok=True)
    b.start(timeout=AGENT_START_TIMEOUT)
    again = _listed_by(b, "keeper")
    check(again is not None and CpuSet.parse(again["cpus"]) == cpus and again["pid"] == keeper.pid,
          f"keeper was not rebuilt from its process with CPUs {cpus.format()}: {again}")
    held = [q for q in b.call("GET", "/v1/status")[1]["quarantined"] if q["pid"] == forger.pid]
    check(_listed_by(b, "forged") is None and not held and f"unverified mark on pid {forger.pid}" in b.log(),
          f"a forged mark was rebuilt or held: {_listed_by(b, 'forged')} {held}")
    other = subprocess.run([*g.numa_run_argv, "--socket", b.socket, "--cpus", "1", "--", "sh", "-c",
                            "grep Cpus_allowed_list /proc/self/status"],
                           capture_output=True, text=True, timeout=ADMIT_TIMEOUT)
    got = CpuSet.parse(other.stdout.split(":", 1)[1].strip()) if other.returncode == 0 else CpuSet()
    check(other.returncode in (0, 125) and not got & cpus,
          f"after the rebuild a new --cpus 1 got {got.format()} (exit {other.returncode}), keeper holds {cpus.format()}")
    for p in (keeper, forger):
        p.kill()
        p.wait()
    return (f"keeper rebuilt from its process on CPUs {cpus.format()} after a truncated checkpoint; "
            "a copied mark of another user ignored")


def _process_with_pid(pid: int, attempts: int = 20) -> subprocess.Popen | None:
    """Start `sleep` so that the kernel gives it `pid` (root writes ns_last_pid)."""
    for _ in range(attempts):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(SLEEP, stdin=subprocess.DEVNULL)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def s19_release_sticks(g: Guest) -> str | None:
    """In the affinity fallback an operator releases a running `--cpus 1` workload, and
    the agent is killed and restarted: the workload stays gone and its process runs on
    the shared pool, unmanaged."""
    b = AgentProcess(g.work / "agent-release", "--cgroup-root", "none", "--metrics-address", "")
    b.start(timeout=AGENT_START_TIMEOUT)
    try:
        proc, cpus = _marked_on(g, b, "let-go")
        check(proc_allowed(proc.pid)[0] == cpus, f"let-go runs on {proc_allowed(proc.pid)[0].format()}, booked "
                                                 f"{cpus.format()}")
        released = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "release", "let-go",
                                   "--socket", b.socket], capture_output=True, text=True, timeout=ADMIT_TIMEOUT)
        check(released.returncode == 0, f"numa-agent release let-go: exit {released.returncode} {released.stderr}")
        pool = CpuSet.parse(b.call("GET", "/v1/status")[1]["shared_pool"])
        check(cpus.issubset(pool) and proc_allowed(proc.pid)[0] == pool,
              f"after the release let-go runs on {proc_allowed(proc.pid)[0].format()}, the pool is {pool.format()}")
        b.kill()  # kill -9
        b.start(timeout=AGENT_START_TIMEOUT)
        status = b.call("GET", "/v1/status")[1]
        names = [x["name"] for x in status["workloads"]] + [q["name"] for q in status["quarantined"]]
        check("let-go" not in names, f"after kill -9 and a restart the released let-go is back: {names}")
        check([r["pid"] for r in status["released"] if r["name"] == "let-go"] == [proc.pid],
              f"status does not list pid {proc.pid} as released: {status['released']}")
        pool = CpuSet.parse(status["shared_pool"])
        allowed = proc_allowed(proc.pid)[0]
        check(allowed == pool, f"after the restart let-go runs on {allowed.format()}, the pool is {pool.format()}")
        text = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--socket", b.socket],
                              capture_output=True, text=True, timeout=ADMIT_TIMEOUT).stdout
        check(f"UNMANAGED pid {proc.pid}: was workload let-go" in text, f"numa-agent status says: {last_lines(text, 4)}")
        proc.kill()
        proc.wait()
        return (f"let-go (CPUs {cpus.format()}) released while it ran, agent killed and restarted: not listed, "
                f"pid {proc.pid} unmanaged on the shared pool {pool.format()}")
    finally:
        b.stop()


def _resize(g: Guest, socket: str, name: str, cpus: int) -> None:
    done = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "resize", name, "--cpus", str(cpus),
                           "--socket", socket], capture_output=True, text=True, timeout=ADMIT_TIMEOUT)
    check(done.returncode == 0, f"numa-agent resize {name} --cpus {cpus}: exit {done.returncode} "
                                f"{last_lines(done.stderr, 3)}")


def s20_resize(g: Guest) -> str | None:
    """A running workload is resized in place: its process's Cpus_allowed_list and its
    cgroup follow a grow and a shrink (and its affinity in the fallback); kill -9 of the
    agent while a resize is under way leaves one booking, old or new, that the process,
    the cgroup and the shared pool agree on after the restart."""
    w = g.launch("stretch", "--cpus", "1")
    first, _ = g.check_pinned(w)
    pid = w.proc.pid
    _resize(g, g.agent.socket, "stretch", 2)
    grown = CpuSet.parse(g.listed("stretch")["cpus"])
    check(len(grown) == 2 and first.issubset(grown), f"grown to {grown.format()} from {first.format()}")
    check(proc_allowed(pid)[0] == grown == cg_cpus(w.rel, "cpuset.cpus"),
          f"after the grow pid {pid} runs on {proc_allowed(pid)[0].format()}, booked {grown.format()}")
    _resize(g, g.agent.socket, "stretch", 1)
    check(proc_allowed(pid)[0] == first == cg_cpus(w.rel, "cpuset.cpus"),
          f"after the shrink pid {pid} runs on {proc_allowed(pid)[0].format()}, expected {first.format()}")
    # kill -9 while a resize is on its way: whichever booking the checkpoint kept is the one enforced
    racing = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_agent", "resize", "stretch", "--cpus",
                               "2", "--socket", g.agent.socket], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    g.agent.kill()
    racing.wait(timeout=ADMIT_TIMEOUT)
    g.start_agent()
    after = CpuSet.parse(g.listed("stretch")["cpus"])
    pool = CpuSet.parse(g.status()["shared_pool"])
    check(after in (first, grown) or (len(after) == 2 and first.issubset(after)),
          f"after kill -9 during a resize stretch holds {after.format()}, neither {first.format()} nor a grow of it")
    check(proc_allowed(pid)[0] == after == cg_cpus(w.rel, "cpuset.cpus") and pool.isdisjoint(after),
          f"after the restart pid {pid} runs on {proc_allowed(pid)[0].format()}, booked {after.format()}, "
          f"pool {pool.format()}")
    w.stop()
    # the affinity fallback: the threads' affinity follows
    b = AgentProcess(g.work / "agent-resize", "--cgroup-root", "none", "--metrics-address", "")
    b.start(timeout=AGENT_START_TIMEOUT)
    try:
        proc, cpus = _marked_on(g, b, "stretch-affinity")
        _resize(g, b.socket, "stretch-affinity", 2)
        wide = CpuSet.parse(_listed_by(b, "stretch-affinity")["cpus"])
        check(len(wide) == 2 and proc_allowed(proc.pid)[0] == wide,
              f"affinity fallback: pid {proc.pid} runs on {proc_allowed(proc.pid)[0].format()}, booked {wide.format()}")
        _resize(g, b.socket, "stretch-affinity", 1)
        check(proc_allowed(proc.pid)[0] == cpus, f"affinity fallback: after the shrink pid {proc.pid} runs on "
                                                  f"{proc_allowed(proc.pid)[0].format()}, expected {cpus.format()}")
        proc.kill()
        proc.wait()
    finally:
        b.stop()
    return (f"stretch {first.format()} -> {grown.format()} -> {first.format()}; after kill -9 mid-resize "
            f"{after.format()}; affinity fallback {cpus.format()} -> {wide.format()} -> {cpus.format()}")


# The NVMe stands in for a GPU: `--tasks` aligns each rank with its device whatever it is.
TASKS_CONFIG = """\
[devices.gpu]
class_prefixes = ["0x0108"]

[devices.nic]
class_prefixes = ["0x0200"]
"""
# Each rank writes what the kernel says of it (its /proc/self/status), its cgroup and its
# environment, then rank 1 fails with 7.
RANK_REPORT = ('f="$0/$NUMA_RUN_TASK"; { grep -E "^(Cpus|Mems)_allowed_list" /proc/self/status; '
               'echo "cgroup=$(cut -d: -f3 /proc/self/cgroup)"; echo "devices=$NUMA_AGENT_DEVICES"; '
               'echo "rank=$NUMA_RUN_TASK/$NUMA_RUN_TASKS local=$LOCAL_RANK/$LOCAL_WORLD_SIZE"; } > "$f.tmp"; '
               'mv "$f.tmp" "$f"; [ "$NUMA_RUN_TASK" != 1 ] || exit 7')


def _rank_reports(g: Guest, where: Path, tasks: int, cores: int) -> list[tuple[CpuSet, CpuSet, str, str]]:
    """(CPUs, mems, cgroup, devices) of each rank as it reported them, checked: whole cores,
    distinct, on one node with its memory, its rank and count in the environment."""
    seen: list[tuple[CpuSet, CpuSet, str, str]] = []
    taken = CpuSet()
    for rank in range(tasks):
        text = (where / str(rank)).read_text()
        cpus, mems = parse_allowed(text)
        fields = dict(re.findall(r"^(cgroup|devices)=(.*)$", text, re.M))
        check(f"rank={rank}/{tasks} local={rank}/{tasks}" in text, f"rank {rank}'s environment: {text!r}")
        nodes = g.kernel.nodes_of(cpus)
        check(len(cpus) == cores * g.kernel.threads_per_core and g.kernel.whole_cores(cpus),
              f"rank {rank} runs on {cpus.format()}, not {cores} whole core(s)")
        check(nodes == list(mems.ids()) and len(nodes) == 1,
              f"rank {rank}: CPUs {cpus.format()} on nodes {nodes}, memory on {mems.format()}")
        check(taken.isdisjoint(cpus), f"rank {rank}'s CPUs {cpus.format()} are another rank's too")
        taken = taken | cpus
        seen.append((cpus, mems, fields.get("cgroup", ""), fields.get("devices", "")))
    return seen


def s21_tasks(g: Guest) -> str | None:
    """numa-run --tasks: ranks booked together on distinct whole cores, each on its node
    (cyclic: one on each node) or its device's node, the failing rank's status returned,
    every booking released when numa-run returns; more ranks than devices refused with one
    line and nothing booked; numa-run killed with -9: its ranks end and are released."""
    g.restart_agent("tasks", config=TASKS_CONFIG)
    cores = 1
    n = str(cores * g.kernel.threads_per_core)
    spread = g.work / "tasks-cyclic"
    spread.mkdir()
    r = g.numa_run("--tasks", "2", "--cpus", n, "--distribution", "cyclic", "--name", "rk", "-v",
                   command=("sh", "-c", RANK_REPORT, str(spread)))
    check(r.returncode == 7, f"--tasks 2 (rank 1 exits 7): exit {r.returncode}: {last_lines(r.stderr, 4)}")
    check(not g.workloads(), f"still listed once numa-run returned: {[w['name'] for w in g.workloads()]}")
    ranks = _rank_reports(g, spread, 2, cores)
    check([m.format() for _, m, _, _ in ranks] == [str(k) for k in g.kernel.cpu_nodes[:2]],
          f"cyclic: ranks' memory on {[m.format() for _, m, _, _ in ranks]}, expected one rank per node")
    check([c for _, _, c, _ in ranks] == ["/numa-agent/wl-rk-0", "/numa-agent/wl-rk-1"],
          f"the ranks' cgroups are {[c for _, _, c, _ in ranks]}")
    gpus = [a for a in g.kernel.devices_of_class("0x0108") if g.kernel.pci_nodes[a] >= 0]
    if not gpus:
        raise ScenarioSkipped("no NVMe on this shape reports a NUMA node")
    aligned = g.work / "tasks-device"
    aligned.mkdir()
    r = g.numa_run("--tasks", "1", "--cpus", n, "--device", "gpu=1", command=("sh", "-c", RANK_REPORT, str(aligned)))
    check(r.returncode == 0, f"--tasks 1 --device gpu=1: exit {r.returncode}: {last_lines(r.stderr, 4)}")
    (cpus, mems, _, devices), = _rank_reports(g, aligned, 1, cores)
    node = g.kernel.pci_nodes[gpus[0]]
    check(devices == gpus[0] and mems == CpuSet([node]),
          f"the rank got device {devices!r} and memory on {mems.format()}; the gpu {gpus[0]} is on node {node}")
    paired = _rank_with_the_nic_under_its_gpu(g, n, cores, gpus[0])
    r = g.numa_run(f"--tasks={len(gpus) + 1}", "--device", "gpu=1", command=("true",))
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    check(r.returncode == 125 and len(errors) == 1 and "more tasks than gpu devices" in errors[0],
          f"more ranks than gpus: exit {r.returncode}: {last_lines(r.stderr, 4)}")
    check(not g.workloads(), "a refused --tasks left bookings behind")
    # numa-run killed: the ranks' PR_SET_PDEATHSIG ends them and the agent releases what they held
    err = open(g.work / "tasks-killed.err", "w+")
    proc = subprocess.Popen([*g.numa_run_argv, "--socket", g.agent.socket, "--tasks", "2", "--name", "rkill",
                             "--", *SLEEP], stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    g.launched.append(proc)
    listed = wait_for(lambda: proc.poll() is not None or len(g.workloads()) == 2, timeout=ADMIT_TIMEOUT,
                      interval=0.1)
    check(listed is True and proc.poll() is None, f"--tasks 2 -- sleep: not both listed (exit {proc.poll()})")
    pids = [w["pid"] for w in g.workloads()]
    proc.kill()
    proc.wait()
    check(g.wait_released(["rkill-0", "rkill-1"], timeout=30),
          f"numa-run killed with -9: its ranks {pids} are still listed after 30 s")
    return (f"cyclic ranks on {', '.join(c.format() for c, _, _, _ in ranks)}; the gpu's rank on "
            f"{cpus.format()} (node {node}){paired}")


def _kernel_pci_root(address: str) -> str | None:
    """The host bridge a device is under, from the kernel's own link (sys/devices/pciDDDD:BB/...)."""
    parts = Path(os.path.realpath(SYS_PCI / address)).parts
    return next((p for p in parts if re.fullmatch(r"pci[0-9a-f]{4,}:[0-9a-f]{2}", p)), None)


def _rank_with_the_nic_under_its_gpu(g: Guest, n: str, cores: int, gpu: str) -> str:
    """--tasks 1 --device gpu=1 --device nic=1: the rank's NIC is one under its gpu's host
    bridge where the kernel shows one (2node: nic1 behind the NVMe's pxb-pcie, another NIC
    on pcie.0), and GET /v1/topology's pci_root says so too. '' where no NIC shares it."""
    root = _kernel_pci_root(gpu)
    near = [a for a in g.kernel.devices_of_class("0x0200") if root and _kernel_pci_root(a) == root]
    if not near:
        return ""
    where = g.work / "tasks-nic"
    where.mkdir()
    r = g.numa_run("--tasks", "1", "--cpus", n, "--device", "gpu=1", "--device", "nic=1",
                   command=("sh", "-c", RANK_REPORT, str(where)))
    check(r.returncode == 0, f"--tasks 1 --device gpu=1 --device nic=1: exit {r.returncode}: {last_lines(r.stderr, 4)}")
    (_, _, _, devices), = _rank_reports(g, where, 1, cores)
    nics = [a for a in devices.split(",") if a != gpu]
    check(gpu in devices.split(",") and len(nics) == 1 and nics[0] in near,
          f"the rank got {devices!r}; the gpu {gpu} is under {root}, as are the NICs {near}")
    status, body = g.agent.call("GET", "/v1/topology")
    agent_roots = {d["address"]: d.get("pci_root") for d in body.get("pci_devices", [])}
    check(status == 200 and agent_roots.get(gpu) == agent_roots.get(nics[0]) == root,
          f"/v1/topology: the gpu under {agent_roots.get(gpu)}, the NIC {nics[0]} under "
          f"{agent_roots.get(nics[0])}; the kernel says {root}")
    return f"; with the NIC {nics[0]} under its {root}"


INFLIGHT_CLIENTS = 40
# Under TCG 40 numa-runs starting together saturate the guest: the restarted agent took
# 3.5 min to start in a first run (70-80 s for the whole scenario since). numa-run's retry
# budget (30 s by default) is the one thing this scenario stretches. Its waits share one
# budget that leaves the guest time to report: a scenario that overruns fails with the
# names of the numa-runs still pending instead of taking its guest's time with it.
INFLIGHT_BUDGET = 600.0
INFLIGHT_RETRY_SECONDS = str(int(INFLIGHT_BUDGET - 60))
INFLIGHT_SLEEP = ("sleep", "3600")
AGENT_TROUBLE = ("cannot reach the agent", "incomplete HTTP response", "not an HTTP response",
                 "did not answer in time", "is busy", "internal error", "Traceback")


def _text_of(stream) -> str:
    """What a child wrote to `stream`, read without moving the offset it shares with the child."""
    fd = stream.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")


def s13_restart_inflight(g: Guest) -> str | None:
    """40 numa-runs start while the agent is stopped and started again: each ends admitted
    (running, listed, pinned) or refused for capacity, none with an agent or connection
    error, and no CPU is booked twice."""
    n = one_core(g) if one_core(g) > 1 else 2
    env = {**os.environ, "NUMA_AGENT_RETRY_SECONDS": INFLIGHT_RETRY_SECONDS}
    deadline = time.monotonic() + INFLIGHT_BUDGET

    def left() -> float:
        return max(1.0, deadline - time.monotonic())
    procs: dict[str, tuple[subprocess.Popen, object]] = {}
    for i in range(INFLIGHT_CLIENTS):
        name = f"inflight-{i}"
        err = open(g.work / f"{name}.err", "w+")
        proc = subprocess.Popen([*g.numa_run_argv, "--socket", g.agent.socket, "--name", name,
                                 "--cpus", str(n), "--", *INFLIGHT_SLEEP], stdout=subprocess.DEVNULL, stderr=err,
                                stdin=subprocess.DEVNULL, env=env)
        g.launched.append(proc)
        procs[name] = (proc, err)
    # Restart once the first is admitted: the others are asking, queued or still starting.
    check(wait_for(lambda: any(w["name"].startswith("inflight-") for w in g.workloads()),
                   timeout=left(), interval=0.2), "no numa-run was admitted before the restart")
    g.agent.stop()
    restarted = time.monotonic()
    try:
        g.agent.start(timeout=left())
    except RuntimeError as exc:
        raise ScenarioFailed(f"agent did not start again: {last_lines(str(exc), 8)}") from None
    print(f"13-restart-inflight: the agent answered {time.monotonic() - restarted:.1f} s after its restart",
          flush=True)

    def pending() -> list[str]:
        listed = {w["name"] for w in g.workloads()}
        return [name for name, (p, _) in procs.items() if p.poll() is None and name not in listed]
    if not wait_for(lambda: not pending(), timeout=left(), interval=0.5):
        late = pending()
        tails = "; ".join(f"{name}: {last_lines(_text_of(procs[name][1]), 1) or '(nothing on stderr)'}"
                          for name in late[:4])
        raise ScenarioFailed(f"{len(late)} numa-run(s) neither admitted nor finished {INFLIGHT_BUDGET:g} s in: "
                             f"{tails}")
    listed = {w["name"]: w for w in g.workloads()}
    admitted, refused, trouble = [], [], []
    for name, (proc, err) in procs.items():
        text = _text_of(err)
        if proc.poll() is None:
            admitted.append(name)
        elif proc.returncode == 125 and ("refused" in text or "TopologyAffinityError" in text):
            refused.append(name)
        else:
            trouble.append(f"{name} exited {proc.returncode}: {last_lines(text, 2)}")
        # "waiting: ..." lines are the client riding out the restart; errors are what count.
        errors = "\n".join(line for line in text.splitlines() if "error:" in line or "Traceback" in line)
        trouble += [f"{name}: {t!r} in its stderr" for t in AGENT_TROUBLE if t in errors]
    check(not trouble, f"{len(trouble)} numa-run(s) met agent trouble: {'; '.join(trouble[:4])}")
    check(admitted, "no numa-run was admitted")
    inflight = {name for name in listed if name.startswith("inflight-")}
    check(inflight == set(admitted), f"listed {sorted(inflight)}, running {sorted(admitted)}")
    seen = CpuSet()
    for name in admitted:
        record = listed[name]
        check(record["pid"] == procs[name][0].pid, f"{name} listed with pid {record['pid']}")
        cpus = CpuSet.parse(record["cpus"])
        check(len(cpus) == n and not cpus & seen, f"{name}: CPUs {cpus.format()} (already booked: "
                                                   f"{(cpus & seen).format() or '-'})")
        seen = seen | cpus
        running = Running(g, name, procs[name][0], record, None, procs[name][1])
        g.check_pinned(running)
        g.check_exclusive(name, running.rel, cpus)
    waited = sum(1 for _, (_, err) in procs.items() if "retrying" in _text_of(err))
    return (f"{len(admitted)} admitted, {len(refused)} refused for capacity, none failed; "
            f"{waited} waited for the restarted agent")


# ---------------------------------------------------------------- 14-scale
SCALE_COUNTS = (10, 200)
SCALE_NUMA_RUNS = 6  # timed `numa-run --shared -- true` per count (each ~2 s under emulation)
SCALE_API_PROBES = 15  # timed admissions + releases through the API client per count
SCALE_KILL_BATCH = 25  # holders killed at once at the end


def _scale_holders_follow_pool(names: list[str], context: str) -> CpuSet:
    """Every holder's cgroup runs on exactly the shared pool (it inherits it)."""
    pool = cg_cpus("shared")
    for name in names:
        rel = f"shared/{name}"
        effective = cg_cpus(rel)
        check(effective == pool, f"{context}: {rel}/cpuset.cpus.effective is {effective.format()}, "
                                 f"the shared pool is {pool.format()}")
    return pool


def s14_scale(g: Guest) -> str | None:
    """Admission p50/p99 through numa-run (and through the API) at 10 and 200 live shared
    workloads held by sleeping processes; figures only, no timing is asserted. Checks
    that every holder's cgroup follows the shared pool, also while an exclusive workload
    takes CPUs from it, and that releasing them all leaves nothing behind."""
    from benchmarks.scale import holder_body, run_probes, spawn_holder, stop_holders
    from benchmarks.stats import percentile

    sleep = shutil.which("sleep")
    check(sleep is not None, "no sleep program in the guest")
    holders: list[int] = []
    names: list[str] = []
    figures = []
    try:
        for count in SCALE_COUNTS:
            while len(holders) < count:
                body = holder_body(len(holders), exclusive=False)
                holders.append(spawn_holder(g.agent.socket, body, sleep))
                names.append(body["name"])
            check(len(g.workloads()) == count, f"{len(g.workloads())} workloads listed, expected {count}")
            _scale_holders_follow_pool(names, f"{count} holders")
            for name, pid in zip(names, holders, strict=True):
                check(str(pid) in cg_read(f"shared/{name}", "cgroup.procs").split(),
                      f"holder {name} (pid {pid}) is not in shared/{name}/cgroup.procs")
            wall = []
            for _ in range(SCALE_NUMA_RUNS + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                r = g.numa_run("--shared", command=("true",))
                wall.append((time.perf_counter() - t0) * 1000)
                check(r.returncode == 0, f"numa-run --shared -- true exited {r.returncode}: "
                                         f"{last_lines(r.stderr, 4)}")
            wall = wall[1:]
            admit_ms, release_ms = run_probes(g.agent.socket, "shared", SCALE_API_PROBES, f"vm-{count}")
            figures.append(f"{count} live: numa-run p50 {percentile(wall, 50):.0f} ms p99 "
                           f"{percentile(wall, 99):.0f} ms; API admit p50 {percentile(admit_ms, 50):.1f} ms "
                           f"p99 {percentile(admit_ms, 99):.1f} ms, release p50 "
                           f"{percentile(release_ms, 50):.1f} ms")
            print(f"14-scale: {figures[-1]}", flush=True)  # kept even if a later check fails
        # An exclusive workload shrinks the pool: the holders follow by inheritance.
        before = cg_cpus("shared")
        x = g.launch("scale-x", "--cpus", "1")
        after = _scale_holders_follow_pool(names, "with an exclusive workload")
        check(after == before - x.cpus and not after & x.cpus,
              f"the pool is {after.format()} beside {x.cpus.format()}, it was {before.format()}")
        x.stop()
        check(wait_for(lambda: cg_cpus("shared") == before, timeout=30, interval=0.05),
              f"the pool is {cg_cpus('shared').format()} after scale-x exited, expected {before.format()}")
        _scale_holders_follow_pool(names, "after the exclusive workload left")
        # Released as their processes exit, a batch at a time.
        slowest = 0.0
        while holders:
            batch, batch_names = holders[-SCALE_KILL_BATCH:], names[-SCALE_KILL_BATCH:]
            del holders[-SCALE_KILL_BATCH:], names[-SCALE_KILL_BATCH:]
            t0 = time.monotonic()
            stop_holders(batch)
            check(_scale_wait_released(g, batch_names, 120), f"holders {batch_names[0]}.. still listed "
                                                              "120 s after they were killed")
            slowest = max(slowest, time.monotonic() - t0)
        figures.append(f"slowest release of {SCALE_KILL_BATCH} killed holders {slowest:.1f} s")
    finally:
        stop_holders(holders)
    left = [rel for rel in agent_cgroups() if rel.startswith("shared/hold-")]
    check(not left, f"cgroups left behind by released holders: {left[:5]}")
    return "; ".join(figures)


def _scale_wait_released(g: Guest, names: list[str], timeout: float) -> bool:
    """Until the agent lists none of `names`; a request that times out is asked again."""
    from numa_agent.api.client import ClientError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if g.wait_released(names, timeout=max(0.0, deadline - time.monotonic())):
                return True
        except ClientError as exc:
            print(f"14-scale: waiting for releases: {exc}", flush=True)
    return False


INTRUDER_LIMIT = 5.0  # the issue's promise: a busy loop on a workload's CPU reported within 5 s
PF_KTHREAD = 0x00200000


def _user_tasks_outside_agent() -> list[int]:
    """Every thread of every user-space process outside the agent's cgroup tree."""
    tids = []
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[6]) & PF_KTHREAD or proc_cgroup(int(task.parent.parent.name)).startswith("/numa-agent/"):
                continue
        except (OSError, IndexError, ValueError):
            continue
        tids.append(int(task.name))
    return tids


def _keep_user_tasks_off(cpus: CpuSet):
    """What docs/enforcement.md asks of an administrator: the rest of the machine off the CPUs the
    agent hands out (here every user task outside its tree; the guest has no systemd
    slices). Otherwise the guest's own processes, this script included, are intruders too,
    rightly. Returns the undo step."""
    before: dict[int, set[int]] = {}
    for tid in _user_tasks_outside_agent():
        try:
            allowed = os.sched_getaffinity(tid)
            if allowed & set(cpus.ids()) and allowed - set(cpus.ids()):
                os.sched_setaffinity(tid, allowed - set(cpus.ids()))
                before[tid] = allowed
        except OSError:
            pass  # gone, or a task that refuses (PF_NO_SETAFFINITY)

    def undo() -> None:
        for tid, allowed in before.items():
            try:
                os.sched_setaffinity(tid, allowed)
            except OSError:
                pass
    return undo


def _intruders_of(g: Guest, name: str) -> list[dict]:
    record = next((w for w in g.status()["workloads"] if w["name"] == name), None)
    check(record is not None, f"{name} is not in /v1/status")
    check("intruders" in record, f"/v1/status lists no intruders field for {name}: {sorted(record)}")
    return record["intruders"]


def _intruder_gauge(g: Guest, name: str) -> float | None:
    m = re.search(r'^numa_agent_exclusive_cpu_intruders\{workload="%s"\} (\S+)$' % re.escape(name), g.scrape(), re.M)
    return float(m.group(1)) if m else None


def s15_observe(g: Guest) -> str | None:
    w = g.launch("guarded", "--cpus", "2")
    cpus, _ = g.check_pinned(w)
    cpu = cpus.ids()[-1]
    g.after_cleanup.append(_keep_user_tasks_off(cpus))
    loop_cmd = ["sh", "-c", "while :; do :; done"]
    if shutil.which("taskset"):
        loop = subprocess.Popen(["taskset", "-c", str(cpu), *loop_cmd])
    else:
        loop = subprocess.Popen(loop_cmd, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    g.launched.append(loop)
    started = time.monotonic()
    found = wait_for(lambda: [i for i in _intruders_of(g, "guarded") if i["pid"] == loop.pid],
                     timeout=INTRUDER_LIMIT, interval=0.1)
    seconds = time.monotonic() - started
    check(found, f"the busy loop (pid {loop.pid}) on CPU {cpu} was not reported within {INTRUDER_LIMIT:g} s: "
                 f"intruders {_intruders_of(g, 'guarded')}")
    # "taskset" when the scan saw it before it exec'd sh: the same process
    check(found[0]["cpu"] == cpu and found[0]["command"] in ("sh", "taskset"), f"intruder reported as {found[0]}")
    record = next(x for x in g.status_cli()["workloads"] if x["name"] == "guarded")
    check([i["pid"] for i in record["intruders"]] == [loop.pid],
          f"numa-agent status --json lists these intruders: {record['intruders']}")
    # The gauge and status come from the same scan; retried in case a scan fell between the two reads.
    gauge = wait_for(lambda: (n := _intruder_gauge(g, "guarded")) == len(_intruders_of(g, "guarded")) and n,
                     timeout=10, interval=0.2)
    check(gauge == 1, f"numa_agent_exclusive_cpu_intruders{{workload=\"guarded\"}} is "
                                f"{_intruder_gauge(g, 'guarded')}, status lists {_intruders_of(g, 'guarded')}")
    kernel = [i["command"] for i in record["kernel_threads"]]
    loop.kill()
    loop.wait(30)
    check(wait_for(lambda: not [i for i in _intruders_of(g, "guarded") if i["pid"] == loop.pid],
                   timeout=30, interval=0.2), "the busy loop is still listed after it was killed")
    w.stop()
    m, _ = _memory_workload(g, "touch64", "--cpus", "2", "--memory", "256Mi", mib=64)
    node = m.record["mems"][0]

    def on_node():
        record = next(x for x in g.status_cli()["workloads"] if x["name"] == "touch64")
        numa = record.get("memory_numa") or {}
        return numa if (numa.get("bytes") or {}).get(str(node), 0) >= 64 * MIB else None
    numa = wait_for(on_node, timeout=ADMIT_TIMEOUT, interval=0.5)
    check(numa, f"status --json does not show 64 MiB of touch64 on its node {node}: "
                f"{next(x for x in g.status_cli()['workloads'] if x['name'] == 'touch64').get('memory_numa')}")
    return (f"intruder reported after {seconds:.1f} s (gauge {gauge:g}; kernel threads listed apart: "
            f"{', '.join(kernel) or 'none'}); memory {numa['bytes']}, outside booked node "
            f"{numa['outside_bytes']} bytes")
PROC_IRQ = Path("/proc/irq")


def irq_values() -> dict[str, str]:
    """Every interrupt's affinity list and the default mask, as the kernel reads them now."""
    out = {"default": (PROC_IRQ / "default_smp_affinity").read_text().strip()}
    for irq in sorted(PROC_IRQ.iterdir()):
        if irq.name.isdigit() and (irq / "smp_affinity_list").exists():
            out[irq.name] = (irq / "smp_affinity_list").read_text().strip()
    return out


def pm_qos_values() -> dict[int, str]:
    out = {}
    for path in sorted(SYS_CPUS.glob("cpu[0-9]*/power/pm_qos_resume_latency_us")):
        out[int(path.parent.parent.name[3:])] = path.read_text().strip()
    return out


def device_irqs(g: Guest) -> dict[str, str]:
    """IRQ number -> the NVMe or NIC (PCI address) whose MSI it is."""
    out = {}
    for prefix in ("0x0108", "0x0200"):
        for address in g.kernel.devices_of_class(prefix):
            for irq in sorted((SYS_PCI / address / "msi_irqs").glob("*")):
                out[irq.name] = address
    return out


def cause_io() -> None:
    """Interrupts from the NVMe and the NIC, so effective affinities follow the new masks."""
    commands = [["dd", f"if={dev}", "of=/dev/null", "bs=4k", "count=256", "iflag=direct"]
                for dev in sorted(Path("/dev").glob("nvme[0-9]n1"))[:1]]
    commands.append(["ping", "-c", "2", "-W", "1", "10.0.2.2"])
    for argv in commands:
        if shutil.which(argv[0]):
            subprocess.run(argv, capture_output=True, timeout=120)


def _effective(irq: str) -> CpuSet | None:
    path = PROC_IRQ / irq / "effective_affinity_list"
    return CpuSet.parse(path.read_text().strip()) if path.exists() else None


def _check_isolated(g: Guest, w: Running, before: dict[str, str], when: str) -> str:
    """The workload's CPUs gone from every movable NVMe and NIC IRQ and from the default mask
    (each exactly its original minus them), its CPUs' PM QoS limit set, and after some I/O
    the changed IRQs' effective affinities off them too. Returns what changed, for the note."""
    cpus = w.cpus
    not_movable = {k.split("/", 1)[1] for k in g.status()["isolation"]["not_movable"]}
    now = irq_values()
    irqs = device_irqs(g)
    checked, changed = [], []
    for irq in sorted(irqs, key=int):
        if irq not in before or irq in not_movable or not CpuSet.parse(before[irq]) - cpus:
            continue  # not requested (interface down), managed, or only on the isolated CPUs
        original, affinity = CpuSet.parse(before[irq]), CpuSet.parse(now[irq])
        check(affinity == original - cpus,
              f"{when}: irq {irq} ({irqs[irq]}) affinity {now[irq]}, was {before[irq]}, "
              f"isolated CPUs {cpus.format()}")
        checked.append(irq)
        if now[irq] != before[irq]:
            changed.append(irq)
    kinds = {g.kernel.pci_classes[irqs[irq]][:6] for irq in changed}
    check(kinds == {"0x0108", "0x0200"}, f"{when}: changed only irqs {changed} ({sorted(kinds)}) of "
                                          f"{sorted(irqs, key=int)}; not movable: {sorted(not_movable)}")
    default = CpuSet.parse_mask(now["default"])
    check(not default & cpus, f"{when}: default_smp_affinity {now['default']} holds {cpus.format()}")
    qos = pm_qos_values()
    for cpu in cpus.ids():
        check(qos.get(cpu) not in (None, "0"), f"{when}: cpu{cpu} pm_qos_resume_latency_us is {qos.get(cpu)!r}")

    def effective_off() -> bool:
        cause_io()  # an effective affinity follows the mask at the IRQ's next interrupt
        return all(not ((_effective(irq) or CpuSet()) & cpus) for irq in changed)
    check(wait_for(effective_off, timeout=60, interval=1),
          f"{when}: effective affinities still on {cpus.format()} after I/O: "
          f"{ {irq: str(_effective(irq)) for irq in changed} }")
    return (f"irqs {','.join(changed)} changed to leave {cpus.format()} (of {len(checked)} movable NVMe/NIC "
            f"irqs checked; effective after I/O {' '.join(f'{i}:{_effective(i)}' for i in changed)})")


def _check_restored(irqs_before: dict[str, str], qos_before: dict[int, str], when: str) -> None:
    def same():
        return irq_values() == irqs_before and pm_qos_values() == qos_before
    if wait_for(same, timeout=30, interval=0.1):
        return
    irqs_now, qos_now = irq_values(), pm_qos_values()
    diff = {k: (irqs_before.get(k), v) for k, v in irqs_now.items() if irqs_before.get(k) != v}
    diff.update({f"cpu{c}": (qos_before.get(c), v) for c, v in qos_now.items() if qos_before.get(c) != v})
    raise ScenarioFailed(f"{when}: not back to the values before (before, now): {diff}")


def nics_up(g: Guest) -> None:
    """A NIC requests its interrupts when its interface goes up: up for the scenario, down after."""
    for address in g.kernel.devices_of_class("0x0200"):
        for net in sorted((SYS_PCI / address / "net").glob("*")):
            if not set_link(net.name, up=True):
                g.after_cleanup.append(lambda name=net.name: set_link(name, up=False))


class _Irqbalance:
    """The guest's irqbalance (the host's binary), in the foreground with a one-second
    interval and a policy script banning every interrupt from balancing: it never moves
    an interrupt (the affinities checked stay the agent's), and its banned CPUs are what
    is checked, as it reports them itself (`setup`, from its next rescan on)."""

    BINARY = shutil.which("irqbalance", path="/usr/sbin:/usr/bin:/sbin:/bin")

    def __init__(self, work: Path) -> None:
        from numa_agent.isolation.irqbalance import RUN_DIR
        script = work / "irqbalance-ban-all"
        script.write_text("#!/bin/sh\necho ban=true\n")
        script.chmod(0o700)
        Path(RUN_DIR).mkdir(parents=True, exist_ok=True)  # systemd's RuntimeDirectory in a unit
        self.script = script
        self.start()

    def start(self) -> None:
        from numa_agent.isolation.irqbalance import RUN_DIR
        self.error = ""
        self.proc = subprocess.Popen([self.BINARY, "--foreground", "-t", "1", "-l", str(self.script)],
                                     env={k: v for k, v in os.environ.items() if not k.startswith("IRQBALANCE_")},
                                     stdout=subprocess.DEVNULL, stderr=open(self.script.with_suffix(".log"), "a"))
        sock = Path(RUN_DIR) / f"irqbalance{self.proc.pid}.sock"
        check(wait_for(lambda: sock.exists() or self.proc.poll() is not None, timeout=30, interval=0.1)
              and self.proc.poll() is None, f"irqbalance did not start (exit {self.proc.poll()})")

    def banned(self) -> CpuSet | None:
        from numa_agent.isolation.irqbalance import IrqbalanceSocket
        try:
            # A fresh edge: what it reports. Its rescan runs the policy script for every
            # interrupt, seconds under TCG, while the socket waits.
            return CpuSet.parse(IrqbalanceSocket(timeout=20).read())
        except OSError as exc:
            gone = self.proc.poll() is not None
            said = last_lines(self.script.with_suffix(".log").read_text(), 3) if gone else ""
            self.error = f"{exc} (irqbalance {f'exited {self.proc.poll()}: {said}' if gone else 'runs'})"
            return None

    def expect(self, cpus: CpuSet, when: str) -> None:
        self.error = ""
        check(wait_for(lambda: self.banned() == cpus, timeout=30, interval=0.2),
              f"{when}: irqbalance bans {self.banned()}, expected {cpus.format() or 'none'} {self.error}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def s16_isolation(g: Guest) -> str | None:
    if not (PROC_IRQ / "default_smp_affinity").exists():
        raise ScenarioSkipped("no /proc/irq/default_smp_affinity in this guest")
    balancer = _Irqbalance(g.work) if _Irqbalance.BINARY else None
    try:
        return _s16(g, balancer)
    finally:
        if balancer is not None:
            balancer.stop()


def _s16(g: Guest, balancer: _Irqbalance | None) -> str | None:
    nics_up(g)
    n = one_core(g) if one_core(g) > 1 else 2
    irqs_before, qos_before = irq_values(), pm_qos_values()
    banned_before = balancer.banned() if balancer else None
    if balancer:
        check(banned_before is not None, "irqbalance's banned CPUs could not be read")
    w = g.launch("iso-a", "--cpus", str(n), "--isolate", "irqs,idle", "-v")
    g.check_pinned(w)
    w.wait_exec()  # numa-run execs once answered: the isolation is written by then (listed before)
    note = _check_isolated(g, w, irqs_before, "while running")
    if balancer:
        balancer.expect(banned_before | w.cpus, "while running")
        note += f"; irqbalance banned {(banned_before | w.cpus).format()}"
    w.err.seek(0)
    said = w.err.read()
    check("isolation (irqs, idle): irqs, idle done" in said,
          f"numa-run -v did not say what was isolated: {last_lines(said, 4)}")
    w.stop()
    check(g.wait_released([w.name]), f"{w.name} still listed after exit")
    _check_restored(irqs_before, qos_before, "after exit")
    if balancer:
        balancer.expect(banned_before, "after exit")

    w = g.launch("iso-b", "--cpus", str(n), "--isolate", "irqs,idle")
    w.wait_exec()
    _check_isolated(g, w, irqs_before, "second workload")
    if balancer:
        balancer.expect(banned_before | w.cpus, "second workload")
        balancer.stop()  # restarted: the new one knows only its own set until the agent tells it
        balancer.start()
        balancer.expect(banned_before | w.cpus, "irqbalance restarted")
        note += "; told again after an irqbalance restart"
    g.agent.kill()
    w.stop()  # exits while the agent is down
    check(irq_values() != irqs_before, "the settings were restored with no agent running")
    g.start_agent()
    _check_restored(irqs_before, qos_before, "after kill -9, exit and restart")
    if balancer:
        balancer.expect(banned_before, "after kill -9, exit and restart")
    check(g.listed(w.name) is None, f"{w.name} still listed after the restart")
    return note


def _kubelet_views(g: Guest) -> tuple[dict, dict, list]:
    """The two state files (parsed, checksums checked) and List's pods, sorted by name."""
    import grpc

    from numa_agent.kubelet import podresources_pb2 as pb
    from numa_agent.kubelet import podresources_pb2_grpc as pb_grpc
    from numa_agent.kubelet.state_files import checksum_ok

    names = ("cpu_manager_state", "memory_manager_state")
    code, shown = g.agent.call("GET", "/v1/kubelet")
    check(code == 200, f"GET /v1/kubelet answered {code}: {shown}")

    def written() -> dict | None:  # the files follow the change from a thread of their own
        data = {name: (g.agent.state_dir / name).read_bytes() for name in names}
        docs = {name: json.loads(d) for name, d in data.items()}
        return data if all(docs[n] == shown[n] for n in names) else None

    data = wait_for(written, timeout=10)
    check(data is not None, f"the state files do not hold what GET /v1/kubelet shows: {shown}")
    for name in names:
        check(checksum_ok(data[name]), f"{name}: the checksum does not match the file")
    docs = {name: json.loads(data[name]) for name in names}
    socket_path = Path(g.agent.socket).parent / "pod-resources.sock"
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        listed = pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=ADMIT_TIMEOUT)
    pods = sorted(([p.name, p.namespace, sorted((c.name, sorted(c.cpu_ids),
                                                 sorted((m.memory_type, m.size, tuple(n.ID for n in m.topology.nodes))
                                                        for m in c.memory))
                                                for c in p.containers)] for p in listed.pod_resources))
    return docs["cpu_manager_state"], docs["memory_manager_state"], pods


def s17_kubelet(g: Guest) -> str | None:
    """The kubelet-shaped state files and PodResources List agree, workload by
    workload, with the kernel's cpuset.cpus.effective / cpuset.mems.effective,
    and come back unchanged after kill -9 and a restart."""
    node = g.kernel.cpu_nodes[-1]
    budget = len(g.kernel.node_cpus[node])
    n = one_core(g)
    check(budget > n, f"node {node} has only {budget} CPUs, too few for a pod with a sidecar")
    running = [g.launch("kmain", "--pod", "kp", "--pod-cpus", str(budget), "--cpus", str(n)),
               g.launch("kside", "--pod", "kp"),
               g.launch("kdb", "--cpus", str(n), "--memory", "64Mi"),
               g.launch("kshared", "--shared")]

    def agree(when: str) -> tuple[dict, dict, list]:
        cpu, memory, pods = _kubelet_views(g)
        containers = {c[0]: c for p in pods for c in p[2]}
        for w in running:
            rel = w.rel if w.name != "kshared" else f"shared/{w.name}"
            cpus, mems = cg_cpus(rel), CpuSet.parse(cg_read(rel, "cpuset.mems.effective"))
            pod = w.record.get("pod") or w.name
            entry = cpu["entries"].get(pod, {}).get(w.name)
            if w.name == "kshared":
                check(entry is None and CpuSet.parse(cpu["defaultCpuSet"]) == cpus,
                      f"{when}: kshared runs on {cpus.format()}, defaultCpuSet is {cpu['defaultCpuSet']}, "
                      f"its entry {entry}")
            else:
                check(entry is not None and CpuSet.parse(entry) == cpus,
                      f"{when}: {w.name}: cpu_manager_state says {entry}, {rel}/cpuset.cpus.effective {cpus.format()}")
            listed = containers.get(w.name)
            check(listed is not None, f"{when}: {w.name} is not in PodResources List")
            check(listed[1] == ([] if w.name == "kshared" else list(cpus)),
                  f"{when}: {w.name}: List cpu_ids {listed[1]}, cpuset.cpus.effective {cpus.format()}")
            blocks = memory["entries"].get(pod, {}).get(w.name, [])
            for block in blocks:
                check(CpuSet(block["numaAffinity"]) == mems,
                      f"{when}: {w.name}: numaAffinity {block['numaAffinity']}, cpuset.mems.effective "
                      f"{mems.format()}")
            for _, _, nodes in listed[2]:
                check(CpuSet(nodes) == mems, f"{when}: {w.name}: List memory on {nodes}, cpuset.mems.effective "
                                             f"{mems.format()}")
            check(bool(blocks) == (w.name == "kdb") == bool(listed[2]),
                  f"{when}: {w.name}: memory entries {blocks}, List memory {listed[2]}")
        return cpu, memory, pods

    before = agree("while running")
    g.agent.kill()
    g.start_agent()
    after = agree("after kill -9 and restart")
    for doc, a, b in zip(("cpu_manager_state", "memory_manager_state", "List"), before, after, strict=True):
        if doc != "List":
            a, b = {k: v for k, v in a.items() if k != "checksum"}, {k: v for k, v in b.items() if k != "checksum"}
        check(a == b, f"{doc} changed across kill -9 and restart: {a} then {b}")
    for w in running:
        w.stop()
    return f"{len(running)} workloads agree with the kernel before and after kill -9"


# ---------------------------------------------------------------- 18: memory hotplug
SYS_MEMORY = Path("/sys/devices/system/memory")
DIMM_MIB = 256  # two memory blocks of 128 MiB in this guest


def kernel_memtotal(node: int) -> int:
    """Node's MemTotal in bytes, as the kernel says it."""
    for line in (SYS_NODES / f"node{node}" / "meminfo").read_text().splitlines():
        if "MemTotal:" in line:
            return int(line.split()[-2]) * 1024
    raise ScenarioFailed(f"no MemTotal in node{node}/meminfo")


def memory_blocks(node: int) -> list[int]:
    return sorted(int(p.name[len("memory"):]) for p in (SYS_NODES / f"node{node}").glob("memory[0-9]*"))


def set_block(block: int, state: str) -> None:
    (SYS_MEMORY / f"memory{block}" / "state").write_text(state)


def _memory_node(status: dict, node: int) -> dict:
    return next(e for e in status["nodes"] if e["id"] == node)


def _memory_short_metric(text: str, node: int) -> float | None:
    m = re.search(rf'^numa_agent_memory_short_bytes\{{numa_node="{node}",resource="memory"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def _plug_dimm(node: int) -> list[int]:
    """A DIMM plugged into `node` through QEMU's monitor, its blocks onlined
    (this kernel leaves hot-added blocks offline: auto_online_blocks). Returns them."""
    job = os.environ.get("NUMA_AGENT_VM_JOB")
    if not job:
        raise ScenarioSkipped("the harness gave no job folder (NUMA_AGENT_VM_JOB) to ask QEMU's monitor through")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from vmharness.monitor import MonitorError, ask
    before = set(memory_blocks(node))
    try:
        replies = ask(job, [
            {"execute": "object-add", "arguments": {"qom-type": "memory-backend-ram", "id": "memhot0",
                                                    "size": DIMM_MIB * MIB}},
            {"execute": "device_add", "arguments": {"driver": "pc-dimm", "id": "dimm0", "memdev": "memhot0",
                                                    "node": node}}])
    except MonitorError as exc:
        raise ScenarioSkipped(f"QEMU's monitor cannot be asked from this guest: {exc}") from None
    check(all("return" in r for r in replies), f"QEMU refused the DIMM: {replies}")
    block_bytes = int((SYS_MEMORY / "block_size_bytes").read_text().strip(), 16)
    want = DIMM_MIB * MIB // block_bytes
    check(wait_for(lambda: len(set(memory_blocks(node)) - before) >= want, timeout=HOTPLUG_LIMIT, interval=0.1),
          f"no new memory blocks on node {node} {HOTPLUG_LIMIT:g} s after the DIMM was plugged "
          f"(blocks {memory_blocks(node)})")
    new = sorted(set(memory_blocks(node)) - before)
    for block in new:
        if (SYS_MEMORY / f"memory{block}" / "state").read_text().strip() == "offline":
            set_block(block, "online_movable")  # movable: can go offline again below
    return new


def s18_memhot(g: Guest) -> str | None:
    g.restart_agent("hotplug", hotplug=True)
    node = g.kernel.cpu_nodes[-1]
    before = _memory_node(g.status(), node)
    capacity, total = before["memory_bytes"]["capacity"], before["memory_total_bytes"]
    check(total == kernel_memtotal(node), f"node {node}: status says MemTotal {total}, the kernel "
                                          f"{kernel_memtotal(node)}")
    big = str(capacity + 128 * MIB)  # fits one node (this one) only once the DIMM is in
    one_node = ("--policy", "single-numa-node", "--cpus", "1", "--memory", big)
    r = g.numa_run("--dry-run", *one_node, command=("true",))
    check(r.returncode == 125, f"{' '.join(one_node)} before the DIMM: exit {r.returncode}, expected a "
                               f"refusal: {last_lines(r.stdout + r.stderr, 3)}")
    t0 = time.monotonic()
    blocks = _plug_dimm(node)

    def grown():
        n = _memory_node(g.status(), node)
        return n["memory_total_bytes"] == kernel_memtotal(node) and n["memory_bytes"]["capacity"] > capacity
    check(wait_for(grown, timeout=HOTPLUG_LIMIT, interval=0.1),
          f"node {node} capacity still {_memory_node(g.status(), node)['memory_bytes']['capacity']} "
          f"{HOTPLUG_LIMIT:g} s after a {DIMM_MIB} MiB DIMM (kernel MemTotal {kernel_memtotal(node)})")
    grew = time.monotonic() - t0
    after = _memory_node(g.status_cli(), node)
    check(after["memory_bytes"]["capacity"] - capacity == kernel_memtotal(node) - total == DIMM_MIB * MIB,
          f"node {node} capacity {capacity} -> {after['memory_bytes']['capacity']}, kernel MemTotal {total} -> "
          f"{kernel_memtotal(node)}; expected both to grow by {DIMM_MIB} MiB")
    m = re.search(r'^numa_agent_hotplug_events_total\{kind="memory"\} (\S+)$', g.scrape(), re.M)
    events = float(m.group(1)) if m else 0.0
    check(events >= len(blocks), f'numa_agent_hotplug_events_total{{kind="memory"}} is {events} after '
                                 f"{len(blocks)} blocks were added and onlined")
    a = g.launch("memhot-a", *one_node)
    check(a.record["memory_bytes"] == {str(node): int(big)}, f"{a.name} booked {a.record['memory_bytes']}")
    offlined: list[int] = []
    try:
        for block in blocks:  # the DIMM's blocks are movable and hold nothing pinned
            set_block(block, "offline")
            offlined.append(block)
        check(wait_for(lambda: _memory_node(g.status(), node)["memory_short"], timeout=HOTPLUG_LIMIT,
                       interval=0.1),
              f"node {node} not reported short {HOTPLUG_LIMIT:g} s after its DIMM went offline under "
              f"{a.name}'s {big} bytes: {_memory_node(g.status(), node)}")
        short = _memory_node(g.status_cli(), node)["memory_short"]
        check(short[0]["booked_bytes"] == int(big) and short[0]["allocatable_bytes"] < int(big),
              f"status --json memory_short: {short}")
        missing = _memory_short_metric(g.scrape(), node)
        check(missing == int(big) - short[0]["allocatable_bytes"],
              f"numa_agent_memory_short_bytes for node {node} is {missing}; status says {short}")
        r = g.numa_run("--cpus", "1", "-N", str(node), command=("true",))
        check(r.returncode == 125 and "take no new admission" in r.stderr,
              f"--cpus 1 -N {node} on the short node: exit {r.returncode}: {last_lines(r.stderr, 3)}")
        check(g.listed(a.name)["memory_bytes"] == {str(node): int(big)} and
              cg_read(a.rel, "memory.max") == big, f"{a.name}'s booking or memory.max changed under the shrink")
        for block in offlined:
            set_block(block, "online_movable")
        offlined = []
        check(wait_for(lambda: not _memory_node(g.status(), node)["memory_short"], timeout=HOTPLUG_LIMIT,
                       interval=0.1), f"node {node} still short after its DIMM came back online")
        r = g.numa_run("--dry-run", "--cpus", "1", "-N", str(node), command=("true",))
        check(r.returncode == 0, f"--cpus 1 -N {node} after the DIMM came back: exit {r.returncode}: "
                                 f"{last_lines(r.stderr, 3)}")
    finally:
        for block in offlined:
            set_block(block, "online_movable")
    return (f"node {node}: {DIMM_MIB} MiB DIMM seen in {grew:.2f} s (capacity {capacity >> 20} -> "
            f"{after['memory_bytes']['capacity'] >> 20} MiB); offlined under a {int(big) >> 20} MiB booking: "
            f"short {missing:g} bytes, -N {node} refused; back online: admitted; memory events {events:g}")


RUNNERS = {
    "1-pin-core": s1_pin_core,
    "2-exclusive": s2_exclusive,
    "3-single-numa": s3_single_numa,
    "4-devices": s4_devices,
    "5-memory": s5_memory,
    "6-release": s6_release,
    "7-restart": s7_restart,
    "8-pods": s8_pods,
    "9-metrics": s9_metrics,
    "10-hotplug": s10_hotplug,
    "11-partitions": s11_partitions,
    "12-recovery": s12_recovery,
    "13-restart-inflight": s13_restart_inflight,
    "14-scale": s14_scale,
    "15-observe": s15_observe,
    "16-isolation": s16_isolation,
    "17-kubelet": s17_kubelet,
    "19-release-sticks": s19_release_sticks,
    "20-resize": s20_resize,
    "21-tasks": s21_tasks,
    "18-memhot": s18_memhot,
}
assert tuple(RUNNERS) == SCENARIOS


# ---------------------------------------------------------------- driver
def run_all(shape: str, out_dir: Path | None, only: list[str], runners=None, make_guest=None) -> int:
    """Run `runners` (scenario name -> function of the guest; default this module's) in
    order, on the guest `make_guest(shape, work)` sets up once."""
    runners = RUNNERS if runners is None else runners
    make_guest = _standard_guest if make_guest is None else make_guest
    report = {"shape": shape, "results": []}
    report_path = out_dir / f"report-{shape}.json" if out_dir else None

    def record(scenario: str, status: str, reason: str = "", seconds: float = 0.0, note: str = "") -> None:
        print(result_line(status, scenario, shape, reason), flush=True)
        report["results"].append({"scenario": scenario, "status": status, "reason": reason,
                                  "seconds": round(seconds, 2), "note": note})
        if report_path:  # after every scenario: a guest that dies still leaves what it finished
            report_path.write_text(json.dumps(report, indent=2) + "\n")

    work = Path("/tmp/vm-e2e")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    guest = None
    started = time.monotonic()
    try:
        guest = make_guest(shape, work)
        guest.start_agent()
        setup_error = ""
    except Exception as exc:  # every planned scenario fails with the reason
        setup_error = f"set-up: {exc}"
    report["setup_seconds"] = round(time.monotonic() - started, 2)
    failed = 0
    for scenario in runners:
        if scenario not in planned(shape) or (only and scenario not in only):
            record(scenario, "SKIP", skip_reason(shape) if scenario not in planned(shape) else "not selected")
            continue
        if setup_error:
            record(scenario, "FAIL", setup_error)
            failed += 1
            continue
        t0 = time.monotonic()
        status, reason, note = "PASS", "", ""
        try:
            guest.ensure_agent()
            with ScenarioWatch(scenario, shape, lambda: guest.agent.log()):
                note = runners[scenario](guest) or ""
        except ScenarioSkipped as exc:
            status, reason = "SKIP", str(exc)
        except ScenarioFailed as exc:
            status, reason = "FAIL", str(exc)
        except Exception as exc:  # a bug here or in the agent: say where
            where = traceback.extract_tb(exc.__traceback__)[-1]
            status, reason = "FAIL", f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})"
        finally:
            problem = _clean_up(guest)
        if status == "PASS" and problem:
            status, reason = "FAIL", problem
        failed += status == "FAIL"
        record(scenario, status, reason, time.monotonic() - t0, note)
    if guest is not None:
        guest.agent.stop()
        report["agent_log"] = guest.agent.log()[-200_000:]
        if out_dir:
            (out_dir / f"agent-{shape}.log").write_text(guest.agent.log())
    report["total_seconds"] = round(time.monotonic() - started, 2)
    if report_path:
        report_path.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


def _clean_up(guest) -> str:
    """After a scenario: its workloads released, its set-up undone; the problem, if any."""
    try:
        problem = guest.cleanup()
    except ClientError as exc:  # the agent stopped answering: say where it was stuck
        dump = getattr(guest.agent, "dump_stacks", None)  # not the systemd shape's service
        if dump is not None:
            dump()
        problem = (f"the agent did not answer during clean-up ({exc}); "
                   + ("its threads' stacks are at the end of the agent log, and the next scenario "
                      "starts it again" if dump is not None else "see its journal"))
    return guest.undo_scenario_setup() or problem


def _standard_guest(shape: str, work: Path) -> Guest:
    bring_loopback_up()
    return Guest(shape, work, Kernel.read())


def main(argv: list[str] | None = None) -> int:
    return guest_main(argv, RUNNERS, _standard_guest, prog="python -m tests.vm_e2e.scenarios")


def guest_main(argv: list[str] | None, runners, make_guest, *, prog: str) -> int:
    """The command line of a scenario module: refuses to run outside the guest or as non-root."""
    parser = argparse.ArgumentParser(prog=prog, description="End-to-end scenarios; run inside the QEMU guest only.")
    parser.add_argument("--shape", required=True, help="the guest's shape (decides which scenarios run)")
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: the shape's plan)")
    args = parser.parse_args(argv)
    if os.environ.get("NUMA_AGENT_IN_VM") != "1":
        print("vm-e2e scenarios: refusing to run outside the QEMU guest (NUMA_AGENT_IN_VM is not 1): they "
              "take over /sys/fs/cgroup and bring interfaces up; use scripts/vm-e2e", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("vm-e2e scenarios: must run as root in the guest", file=sys.stderr)
        return 2
    only = [s for s in args.only.split(",") if s]
    unknown = sorted(set(only) - set(runners))
    if unknown:
        print(f"vm-e2e scenarios: unknown scenario(s) {', '.join(unknown)}; known: {', '.join(runners)}",
              file=sys.stderr)
        return 2
    out = os.environ.get("NUMA_AGENT_VM_OUT")
    return run_all(args.shape, Path(out) if out else None, only, runners, make_guest)


if __name__ == "__main__":
    sys.exit(main())
