"""The Slurm cluster scenarios (shape `slurm2`: two 2node guests joined by a private link),
run INSIDE both guests by scripts/vm-e2e:

    .venv/bin/python -m tests.vm_e2e.slurm_cluster_scenarios --shape slurm2

The harness boots both guests with the same command; NUMA_AGENT_VM_GUEST says which one
runs here. Guest 0 is node `numa1` (10.0.2.11): munged, its agent, slurmctld and slurmd,
and the scenarios. Guest 1 is node `numa2` (10.0.2.12): munged, its agent and slurmd,
which guest 0 sets up and inspects through a small command server on the link (the part
ssh plays on a site; only guest 0 reaches it, the link joins the two guests and nothing
else). Both nodes get the same slurm.conf, cgroup.conf and munge key from guest 0.

Each guest's root is its own throwaway overlay of the host's, so nothing written in one is
seen by the other; the per-node paths (`%n` in slurm.conf) keep it so on a shared root as well.
The oracle is each node's kernel (/proc/PID/status read from inside each task, sysfs) and
Slurm (sinfo, scontrol, the Epilog's output), not the agents.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from numa_agent.api.client import request
from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import AgentProcess, wait_for
from tests.vm_e2e.plan import SLURM_CLUSTER_SCENARIOS
from tests.vm_e2e.scenarios import (
    AGENT_CONFIG,
    AGENT_START_TIMEOUT,
    CGROUP_MOUNT,
    METRICS_ADDRESS,
    Guest,
    Kernel,
    ScenarioFailed,
    check,
    guest_main,
    last_lines,
    parse_allowed,
    stop_all,
)
from tests.vm_e2e.slurm_scenarios import node_fields, sh, start_slurm_host, stop_daemons

REPO = Path(__file__).resolve().parents[2]
NODES = ("numa1", "numa2")  # guest 0, guest 1
HOSTLIST = "numa[1-2]"
PEER_PORT = 7070  # the command server, on the second guest's end of the private link
SOCKET = "/run/numa-agent/agent.sock"  # the default: the Epilog's numa-agent finds it
EPILOG = REPO / "contrib" / "slurm" / "epilog"
WORK = Path("/tmp/vm-e2e")
SLURM_DIR = WORK / "slurm"  # the same path on both nodes: slurm.conf, cgroup.conf, the Epilog
# The plugins sites combine. Slurm 22.05 keeps a step's tasks on a node in one cgroup
# under task/cgroup (task_special), where each task is pinned inside it (docs/slurm.md).
TASK_PLUGIN = "task/cgroup,task/affinity"
SLURM_TIMEOUT = 180.0  # daemons and steps of two emulated guests on a busy host
PEER_TIMEOUT = 420.0  # the second guest's boot (once more after a hung one: 180 s) and first Python import
SLEEP = 900


def logs_dir() -> Path:
    """Where each node keeps its logs: its own out share (the host keeps it), the same path in both."""
    out = os.environ.get("NUMA_AGENT_VM_OUT")
    return Path(out) / "slurm" if out else WORK / "slurm-logs"


def slurm_env() -> dict[str, str]:
    return {"SLURM_CONF": str(SLURM_DIR / "slurm.conf")}


# ---------------------------------------------------------------- what each node does for itself
def set_up_node(name: str, munge_key: bytes) -> None:
    """Hostname, every node's address in /etc/hosts, the cluster's munge key and munged,
    /sys/fs/cgroup/system.slice for slurmd, numa-agent where the Epilog looks."""
    addresses = os.environ["NUMA_AGENT_VM_ADDRESSES"].split()
    sh("hostname", name)
    with open("/etc/hosts", "a") as hosts:
        for node, address in zip(NODES, addresses, strict=True):
            hosts.write(f"{address} {node}\n")
    start_slurm_host(munge_key, Path(sys.executable).parent / "numa-agent")
    for d in (SLURM_DIR / name / "spool", logs_dir()):
        d.mkdir(parents=True, exist_ok=True)


def write_slurm_files(files: dict[str, str]) -> None:
    """slurm.conf, cgroup.conf and the Epilog wrapper, the same on every node."""
    SLURM_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (SLURM_DIR / name).write_text(text)
    (SLURM_DIR / "epilog").chmod(0o755)


def node_agent_args(work: Path) -> AgentProcess:
    """This node's agent as Guest runs it (its own state directory under `work`), on the
    default socket and metrics address."""
    (work / "agent").mkdir(parents=True, exist_ok=True)
    agent = AgentProcess(work / "agent", "--cgroup-root", "auto", config=AGENT_CONFIG)
    agent.args[agent.args.index("--metrics-address") + 1] = METRICS_ADDRESS
    agent.args[agent.args.index("--socket") + 1] = SOCKET
    agent.socket = SOCKET
    Path(SOCKET).parent.mkdir(parents=True, exist_ok=True)
    return agent


def kernel_view() -> dict:
    k = Kernel.read()
    return {"node_cpus": {str(n): c.format() for n, c in k.node_cpus.items()},
            "siblings": {str(c): s.format() for c, s in k.siblings.items()}}


def kernel_from(view: dict) -> Kernel:
    return Kernel({int(n): CpuSet.parse(c) for n, c in view["node_cpus"].items()},
                  {int(c): CpuSet.parse(s) for c, s in view["siblings"].items()}, {}, {})


# ---------------------------------------------------------------- the second guest: a command server
class PeerNode:
    """What guest 0 may ask of guest 1; one JSON request a connection, one JSON answer."""

    def __init__(self) -> None:
        self.work = WORK / NODES[1]
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.agent = node_agent_args(self.work)
        self.spawned: dict[str, subprocess.Popen] = {}

    def op_setup(self, munge_key: str) -> dict:
        set_up_node(NODES[1], base64.b64decode(munge_key))
        return {"kernel": kernel_view()}

    def op_files(self, files: dict[str, str]) -> dict:
        write_slurm_files(files)
        return {}

    def op_run(self, argv: list[str], seconds: float = 60) -> dict:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    def op_spawn(self, name: str, argv: list[str], env: dict | None = None) -> dict:
        self.op_stop(name)
        log = open(logs_dir() / f"{name}.out", "a")
        self.spawned[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env={**os.environ, **(env or {})})
        return {"pid": self.spawned[name].pid}

    def op_stop(self, name: str) -> dict:
        proc = self.spawned.pop(name, None)
        if proc is not None:
            stop_all([proc])
        return {}

    def op_agent_start(self) -> dict:
        if self.agent.proc is None or self.agent.proc.poll() is not None:
            self.agent.start(timeout=AGENT_START_TIMEOUT)
        return {"pid": self.agent.proc.pid}

    def op_agent_kill(self) -> dict:
        pid = self.agent.proc.pid if self.agent.proc else None
        self.agent.kill()
        return {"pid": pid}

    def op_agent(self, method: str, path: str) -> dict:
        status, body = request(SOCKET, method, path)
        return {"status": status, "body": body}

    def op_agent_log(self, lines: int = 8) -> dict:
        return {"log": last_lines(self.agent.log(), lines)}

    def stop(self) -> None:
        for name in list(self.spawned):
            self.op_stop(name)
        self.agent.stop()
        (logs_dir() / "agent-numa2.log").write_text(self.agent.log())

    def serve(self) -> int:
        address = os.environ["NUMA_AGENT_VM_ADDRESSES"].split()[1]
        with socket.create_server((address, PEER_PORT)) as server:
            print(f"{NODES[1]}: serving guest 0 on {address}:{PEER_PORT}", flush=True)
            while True:
                conn, _ = server.accept()
                with conn:
                    try:
                        conn.settimeout(60)  # for the request line; guest 0 sends it at once
                        line = conn.makefile("r").readline()
                    except OSError:
                        continue
                    if not line.strip():
                        continue  # guest 0 only looking whether the server is up
                    ask = json.loads(line)
                    op = ask.pop("op", "")
                    if op == "exit":
                        self.stop()
                        answer: dict = {}
                    else:
                        try:
                            answer = getattr(self, f"op_{op}")(**ask)
                        except Exception as exc:  # the caller's scenario fails with it
                            answer = {"error": f"{op}: {type(exc).__name__}: {exc}"}
                    try:
                        conn.sendall((json.dumps(answer) + "\n").encode())
                    except OSError:
                        pass  # guest 0 gave up waiting; the next request is its own
                    if op == "exit":
                        return 0


class Peer:
    """Guest 0's side of the command server on guest 1."""

    def __init__(self, address: str) -> None:
        self.address = address

    def call(self, op: str, timeout: float = SLURM_TIMEOUT, **args) -> dict:
        with socket.create_connection((self.address, PEER_PORT), timeout=timeout) as conn:
            conn.sendall((json.dumps({"op": op, **args}) + "\n").encode())
            answer = json.loads(conn.makefile("r").readline() or '{"error": "no answer"}')
        if "error" in answer:
            raise ScenarioFailed(f"{NODES[1]}: {answer['error']}")
        return answer

    def wait_ready(self) -> None:
        def up():
            try:
                with socket.create_connection((self.address, PEER_PORT), timeout=5):
                    return True
            except OSError:
                return False
        check(wait_for(up, timeout=PEER_TIMEOUT, interval=1),
              f"{NODES[1]} ({self.address}) did not answer on port {PEER_PORT} within {PEER_TIMEOUT:g} s")

    def run(self, *argv: str, seconds: float = 60, check_rc: bool = True) -> str:
        done = self.call("run", timeout=seconds + 30, argv=list(argv), seconds=seconds)
        if check_rc and done["rc"] != 0:
            raise ScenarioFailed(f"{NODES[1]}: `{' '.join(argv)}` exited {done['rc']}: "
                                 f"{last_lines(done['stderr'] or done['stdout'], 4)}")
        return done["stdout"]

    def agent(self, method: str, path: str) -> dict:
        answer = self.call("agent", method=method, path=path)
        check(answer["status"] == 200, f"{NODES[1]}'s agent answered {method} {path} with {answer['status']}: "
                                       f"{answer['body']}")
        return answer["body"]

    def workloads(self) -> list[dict]:
        return self.agent("GET", "/v1/workloads")["workloads"]


def serve_peer(argv: list[str] | None) -> int:
    """Guest 1's whole run: serve guest 0 until it says `exit`."""
    if os.environ.get("NUMA_AGENT_IN_VM") != "1" or os.geteuid() != 0:
        print("vm-e2e cluster node: runs as root inside the slurm2 guest only (scripts/vm-e2e)", file=sys.stderr)
        return 2
    node = PeerNode()
    try:
        return node.serve()
    finally:
        node.stop()


# ---------------------------------------------------------------- Slurm across both nodes
def slurm_files(node_line: str) -> dict[str, str]:
    """What both nodes get, byte for byte: slurm.conf, cgroup.conf and the Epilog wrapper.
    Per-node paths carry `%n` (the node's name), so two nodes sharing a root would not
    share a spool, a pid file or a log either."""
    logs, d = logs_dir(), SLURM_DIR
    conf = f"""\
ClusterName=numa
SlurmctldHost={NODES[0]}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/%n/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/%n/slurmd.pid
SlurmctldLogFile={logs}/slurmctld.log
SlurmdLogFile={logs}/slurmd-%n.log
SlurmdDebug=debug
ProctrackType=proctrack/cgroup
TaskPlugin={TASK_PLUGIN}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/cgroup
AccountingStorageType=accounting_storage/none
KillWait=5
Epilog={d}/epilog
{node_line}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    # The shipped Epilog, its output and exit status kept where the scenarios read them.
    epilog = (f"#!/bin/sh\n{{ echo \"epilog job $SLURM_JOB_ID\"; {EPILOG}; echo \"epilog exit $?\"; }} "
              f">> {logs}/epilog.log 2>&1\nexit 0\n")
    cgroup = "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainCores=yes\n"
    return {"slurm.conf": conf, "cgroup.conf": cgroup, "epilog": epilog}


def cluster_node_line(lines: dict[str, str]) -> str:
    """One NodeName line for both nodes from each node's own `numa-agent slurm-node`: the
    same machine, so every field agrees but the name (RealMemory: the smaller)."""
    fields = {node: node_fields(line) for node, line in lines.items()}
    first, second = (fields[n] for n in NODES)
    differ = sorted(k for k in first.keys() | second.keys()
                    if k not in ("NodeName", "RealMemory") and first.get(k) != second.get(k))
    check(not differ, f"the nodes' lines differ in {differ}: {lines}")
    merged = {**first, "NodeName": HOSTLIST,
              "RealMemory": str(min(int(first["RealMemory"]), int(second["RealMemory"])))}
    return " ".join(f"{k}={v}" for k, v in merged.items())


class Cluster:
    """slurmctld and slurmd on numa1 (here), slurmd on numa2 (through the peer)."""

    def __init__(self, peer: Peer, node_line: str) -> None:
        self.peer, self.node_line = peer, node_line
        self.daemons: list[subprocess.Popen] = []
        self.running = False

    def start(self) -> None:
        if self.running and all(d.poll() is None for d in self.daemons):
            return
        self.stop()
        files = slurm_files(self.node_line)
        write_slurm_files(files)
        self.peer.call("files", files=files)
        (SLURM_DIR / "ctld").mkdir(parents=True, exist_ok=True)
        for daemon in ("slurmctld", "slurmd"):
            out = open(logs_dir() / f"{daemon}.out", "a")
            self.daemons.append(subprocess.Popen([daemon, "-D"], stdout=out, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env={**os.environ, **slurm_env()}))
        self.peer.call("spawn", name="slurmd", argv=["slurmd", "-D"], env=slurm_env())
        self.running = True
        idle = wait_for(lambda: set(self.states().values()) == {"idle"} and len(self.states()) == 2,
                        timeout=SLURM_TIMEOUT, interval=2)
        check(idle, f"the nodes are not both idle within {SLURM_TIMEOUT:g} s (sinfo: {self.states()}); "
                    f"slurmctld: {self.tail('slurmctld.log')}; numa2's slurmd: "
                    f"{self.peer_tail('slurmd-numa2.log')}")

    def stop(self) -> None:
        stop_daemons(self.daemons)
        if self.running:
            self.peer.call("stop", name="slurmd")
        self.running = False

    def states(self) -> dict[str, str]:
        try:
            out = sh("sinfo", "-h", "-N", "-o", "%N %T", timeout=30, check_rc=False, env=slurm_env()).stdout
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)

    def tail(self, name: str, n: int = 4) -> str:
        path = logs_dir() / name
        return last_lines(path.read_text(errors="replace"), n) if path.exists() else "(no log)"

    def peer_tail(self, name: str, n: int = 4) -> str:
        try:
            return last_lines(self.peer.run("tail", f"-{n}", str(logs_dir() / name), check_rc=False), n)
        except (ScenarioFailed, OSError) as exc:
            return f"(unreadable: {exc})"

    def jobs(self) -> list[str]:
        return sh("squeue", "-h", "-o", "%i", env=slurm_env()).stdout.split()

    def cancel_all(self) -> None:
        if not self.running:
            return
        if self.jobs():
            sh("scancel", "--user", "root", check_rc=False, env=slurm_env())
        wait_for(lambda: not self.jobs(), timeout=SLURM_TIMEOUT, interval=1)


# ---------------------------------------------------------------- numa1: the scenarios' side
_LABEL = re.compile(r"^\s*(\d+): (.*)$")


def task_script(name: str) -> str:
    """What each task runs inside numa-run: says where it is and what the kernel allows it,
    from inside itself, then waits until its node has the scenario's end file."""
    end = WORK / f"end-{name}"
    numa_run = Path(sys.executable).parent / "numa-run"
    return ('echo "job $SLURM_JOB_ID node $SLURMD_NODENAME pid $$"; grep _allowed_list /proc/self/status; '
            f'cat /proc/self/cgroup; {numa_run} --show | grep -E "^(policy|membind):"; echo ready; '
            f'while [ ! -e {end} ]; do sleep 1; done')


def parse_tasks(text: str) -> dict[int, dict]:
    """srun --label output -> procid -> {job, node, pid, status (the _allowed_list lines), cgroup, ready}."""
    tasks: dict[int, dict] = {}
    for line in text.splitlines():
        m = _LABEL.match(line)
        if not m:
            continue
        t = tasks.setdefault(int(m.group(1)), {"status": "", "ready": False})
        body = m.group(2)
        where = re.match(r"job (\d+) node (\S+) pid (\d+)$", body)
        if where:
            t.update(job=where.group(1), node=where.group(2), pid=int(where.group(3)))
        elif body.startswith(("Cpus_allowed_list", "Mems_allowed_list")):
            t["status"] += body + "\n"
        elif body.startswith("0::"):
            t["cgroup"] = body[3:]
        elif body.startswith(("policy:", "membind:")):
            key, _, value = body.partition(":")
            t[key] = value.strip()
        elif body == "ready":
            t["ready"] = True
    return tasks


class ClusterGuest(Guest):
    def __init__(self, shape: str, work: Path) -> None:
        super().__init__(shape, work, Kernel.read())
        # The agent on the default socket, as installed: the Epilog and srun's tasks find it.
        Path(SOCKET).parent.mkdir(parents=True, exist_ok=True)
        for args in (self.agent.args, self.standard_args):
            args[args.index("--socket") + 1] = SOCKET
        self.agent.socket = SOCKET
        self.numa_run = Path(sys.executable).parent / "numa-run"
        self.peer = Peer(os.environ["NUMA_AGENT_VM_ADDRESSES"].split()[1])
        self.peer.wait_ready()
        key = os.urandom(1024)  # one key for the cluster, each node its own munged
        set_up_node(NODES[0], key)
        view = self.peer.call("setup", munge_key=base64.b64encode(key).decode())["kernel"]
        self.kernels = {NODES[0]: self.kernel, NODES[1]: kernel_from(view)}
        self.peer.call("agent_start", timeout=AGENT_START_TIMEOUT + 30)
        numa_agent = str(Path(sys.executable).parent / "numa-agent")
        lines = {
            NODES[0]: sh(numa_agent, "slurm-node", "--config", str(work / "agent" / "config.toml"),
                         "--node-name", NODES[0]).stdout.strip(),
            NODES[1]: self.peer.run(numa_agent, "slurm-node", "--config",
                                    str(WORK / NODES[1] / "agent" / "config.toml"), "--node-name", NODES[1]).strip(),
        }
        self.node_lines = lines
        self.cluster = Cluster(self.peer, cluster_node_line(lines))
        self.strays: list[str] = []

    # -- either node
    def node_workloads(self, node: str, job: str | None = None) -> list[dict]:
        every = self.workloads() if node == NODES[0] else self.peer.workloads()
        return [w for w in every if job is None or w["name"].startswith(f"slurm-{job}-")]

    def read(self, node: str, path: str) -> str:
        if node == NODES[0]:
            return Path(path).read_text()
        return self.peer.run("cat", path)

    def touch(self, path: Path) -> None:
        path.touch()
        self.peer.run("touch", str(path))

    def shared_pools(self) -> dict[str, CpuSet]:
        rel = "sys/fs/cgroup/numa-agent/shared/cpuset.cpus.effective"
        return {node: CpuSet.parse(self.read(node, f"/{rel}").strip()) for node in NODES}

    def epilog_logs(self) -> dict[str, str]:
        """Each node's Epilog log so far ("" before its first run)."""
        path = logs_dir() / "epilog.log"
        return {NODES[0]: path.read_text(errors="replace") if path.exists() else "",
                NODES[1]: self.peer.run("sh", "-c", f"cat {path} 2>/dev/null; true")}

    # -- Slurm
    def srun(self, name: str, *srun_args: str, cpus: int) -> subprocess.Popen:
        out = open(self.work / f"{name}.srun", "w+")
        proc = subprocess.Popen(["srun", "--label", *srun_args, str(self.numa_run), "--cpus", str(cpus), "--",
                                 "sh", "-c", task_script(name)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **slurm_env()})
        self.launched.append(proc)
        return proc

    def wait_tasks(self, output: Path, count: int, alive=lambda: True) -> dict[int, dict]:
        """Until `count` tasks said they are ready in `output` (srun --label's)."""
        def ready():
            if not alive():
                return "ended"
            tasks = parse_tasks(output.read_text(errors="replace") if output.exists() else "")
            return tasks if len(tasks) == count and all(t["ready"] for t in tasks.values()) else None
        got = wait_for(ready, timeout=SLURM_TIMEOUT * 2, interval=1)
        text = output.read_text(errors="replace") if output.exists() else ""
        check(isinstance(got, dict), f"{count} tasks did not start within {SLURM_TIMEOUT * 2:g} s ({got or 'waiting'}): "
                                     f"{last_lines(text, 8)}; numa1's slurmd: {self.cluster.tail('slurmd-numa1.log')}; "
                                     f"numa2's slurmd: {self.cluster.peer_tail('slurmd-numa2.log')}")
        assert isinstance(got, dict)
        return got

    def cleanup(self) -> str:
        problems = []
        self.cluster.cancel_all()
        stop_all(self.launched)
        try:
            self.peer.call("stop", name="stray")
            self.peer.call("agent_start", timeout=AGENT_START_TIMEOUT + 30)  # after a scenario that killed it
            self.peer.run("sh", "-c", f"rm -f {WORK}/end-*")
            if not wait_for(lambda: not self.peer.workloads(), timeout=60, interval=1):
                problems.append(f"{NODES[1]} still lists {[w['name'] for w in self.peer.workloads()]}")
        except (ScenarioFailed, OSError) as exc:
            problems.append(f"{NODES[1]}: {exc}")
        for end in WORK.glob("end-*"):
            end.unlink()
        problems.append(super().cleanup())
        return "; ".join(p for p in problems if p)


def check_placement(g: ClusterGuest, tasks: dict[int, dict], job: str) -> dict[str, list[tuple[int, CpuSet, int]]]:
    """Two tasks on each node; each on whole cores of one NUMA node of its node with that
    node's memory, as read inside the task; the two of a node apart; inside the CPUs Slurm
    confined the step to there; booked by that node's agent as slurm-<job>-0-<task>-u0 for
    the task's own pid (inside the CPUs task/cgroup gave the step there). Returns node -> [(task, CPUs, NUMA node)]."""
    per_node: dict[str, list[tuple[int, CpuSet, int]]] = {}
    for procid, t in sorted(tasks.items()):
        check(t.get("job") == job, f"task {procid} says job {t.get('job')}, expected {job}")
        node, kernel = t["node"], g.kernels.get(t["node"])
        check(kernel is not None, f"task {procid} ran on {node!r}, not a node of the cluster")
        assert kernel is not None
        cpus, mems = parse_allowed(t["status"])
        numa = kernel.nodes_of(cpus)
        check(kernel.whole_cores(cpus) and len(numa) == 1,
              f"task {procid} on {node}: CPUs {cpus.format()} are not whole cores of one NUMA node ({numa})")
        cgroup = t.get("cgroup", "")
        if cgroup.endswith("/task_special"):  # pinned inside the step's one cgroup: bound by its policy
            bound = CpuSet(int(n) for n in t.get("membind", "").split())
            check(bound == CpuSet(numa), f"task {procid} on {node}: memory policy {t.get('policy')!r} binds "
                                         f"{bound.format()}, its CPUs are on {numa}")
        else:
            check(mems == CpuSet(numa), f"task {procid} on {node}: memory nodes {mems.format()}, its CPUs are on {numa}")
        check(f"/job_{job}/step_0/" in cgroup, f"task {procid} on {node} runs in {cgroup!r}, not Slurm's step")
        step = cgroup.split("/step_0/")[0] + "/step_0/cpuset.cpus.effective"
        granted = CpuSet.parse(g.read(node, f"{CGROUP_MOUNT}{step}").strip())
        check(cpus.issubset(granted), f"task {procid} on {node}: CPUs {cpus.format()} outside the step's "
                                      f"{granted.format()}")
        per_node.setdefault(node, []).append((procid, cpus, numa[0]))
        listed = {w["name"]: w for w in g.node_workloads(node, job)}
        w = next((w for w in listed.values() if w["name"].startswith(f"slurm-{job}-0-{procid}-")), None)
        check(w is not None, f"{node}'s agent lists no workload for task {procid}: {sorted(listed)}")
        assert w is not None
        check(CpuSet.parse(w["cpus"]) == cpus and w["pid"] == t["pid"],
              f"{node}'s agent books {w['name']} on {w['cpus']} for pid {w['pid']}; the task (pid {t['pid']}) "
              f"reads {cpus.format()}")
    check(sorted(per_node) == list(NODES) and all(len(v) == 2 for v in per_node.values()),
          f"tasks per node: { {n: [p for p, _, _ in v] for n, v in per_node.items()} }, expected two on each")
    for node, placed in per_node.items():
        (_, a, _), (_, b, _) = placed
        check(not (a & b), f"the two tasks on {node} share CPUs {(a & b).format()}")
    return per_node


def placement_note(g: ClusterGuest, job: str, per_node: dict[str, list[tuple[int, CpuSet, int]]]) -> str:
    """Where the tasks ran, and how much memory each guest had left while they ran (the
    shape's memory is the least that leaves room)."""
    available = {node: re.search(r"^MemAvailable:\s+(\d+) kB", g.read(node, "/proc/meminfo"), re.M)
                 for node in NODES}
    return f"job {job}: " + "; ".join(
        f"{node}: " + ", ".join(f"task {p} CPUs {c.format()} node {n}" for p, c, n in placed)
        for node, placed in sorted(per_node.items())) + "; MemAvailable " + ", ".join(
        f"{node} {int(m.group(1)) >> 10 if m else '?'} MiB" for node, m in available.items())


def end_tasks(g: ClusterGuest, name: str) -> None:
    g.touch(WORK / f"end-{name}")


def end_step(g: ClusterGuest, name: str, proc: subprocess.Popen, job: str) -> None:
    """Tell the step's tasks to end: srun exits 0 and neither node keeps a booking of the job."""
    end_tasks(g, name)
    try:
        rc = proc.wait(SLURM_TIMEOUT)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"srun exited {rc} after the tasks were told to end: "
                   f"{last_lines((g.work / f'{name}.srun').read_text(errors='replace'), 6)}")
    wait_released(g, job)


def wait_released(g: ClusterGuest, job: str) -> None:
    left = wait_for(lambda: not any(g.node_workloads(n, job) for n in NODES), timeout=SLURM_TIMEOUT, interval=1)
    check(left, "still booked after the job ended: "
                + str({n: [w["name"] for w in g.node_workloads(n, job)] for n in NODES}))


# ---------------------------------------------------------------- scenarios
def s_srun(g: ClusterGuest) -> str:
    """`srun -N2 -n4 --ntasks-per-node=2 -c2 numa-run --cpus 2`: two tasks on each node, each on whole cores of
    one NUMA node with that node's memory (read inside the task), booked by its node's
    agent; the step ends with exit 0 and both agents release it."""
    g.cluster.start()
    proc = g.srun("srun", "-N2", "-n4", "--ntasks-per-node=2", "-c2", cpus=2)
    tasks = g.wait_tasks(g.work / "srun.srun", 4, alive=lambda: proc.poll() is None)
    job = tasks[0]["job"]
    per_node = check_placement(g, tasks, job)
    note = placement_note(g, job, per_node)
    end_step(g, "srun", proc, job)
    return note + f"; node line (numa1's): {g.node_lines[NODES[0]]}"


def s_batch(g: ClusterGuest) -> str:
    """An sbatch job of two nodes: its tasks booked on both, and on each node a booking
    under the job's name held by a process outside Slurm (only the Epilog releases that).
    The job ends (COMPLETED): the Epilog runs on both nodes, exits 0 and releases it; both
    agents list nothing of the job and each node's shared pool is whole again."""
    g.cluster.start()
    pools = g.shared_pools()
    logs = {n: len(t) for n, t in g.epilog_logs().items()}
    output = g.work / "batch.out"
    script = g.work / "batch.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH -N2 -n4 --ntasks-per-node=2 -c2 --output={output}\n"
                      f"srun --label {g.numa_run} --cpus 2 -- sh -c '{task_script('batch')}'\n")
    job = sh("sbatch", "--parsable", str(script), env=slurm_env()).stdout.strip().split(";")[0]
    shown = sh("scontrol", "show", "job", job, env=slurm_env()).stdout
    batch_host = re.search(r"BatchHost=(\S+)", shown)
    check(batch_host is None or batch_host.group(1) in ("(null)", NODES[0]),
          f"the batch script runs on {batch_host.group(1) if batch_host else '?'}, not {NODES[0]} (its output "
          "would be in that guest)")
    tasks = g.wait_tasks(output, 4)
    per_node = check_placement(g, tasks, job)
    note = placement_note(g, job, per_node)
    stray = f"slurm-{job}-extern-9"
    g.launch(stray, "--cpus", "1")
    g.peer.call("spawn", name="stray", argv=[str(g.numa_run), "--socket", SOCKET, "--name", stray, "--cpus", "1",
                                             "--", "sleep", str(SLEEP)])
    check(wait_for(lambda: any(w["name"] == stray for w in g.peer.workloads()), timeout=SLURM_TIMEOUT, interval=1),
          f"{NODES[1]}: {stray} was not booked: {g.cluster.peer_tail('stray.out')}")
    end_tasks(g, "batch")

    def epilogs_done():
        now = g.epilog_logs()
        return all(f"epilog job {job}\n" in now[n][logs[n]:] and "epilog exit" in now[n][logs[n]:] for n in NODES)
    check(wait_for(epilogs_done, timeout=SLURM_TIMEOUT, interval=2),
          f"the Epilog did not run on both nodes within {SLURM_TIMEOUT:g} s: "
          + str({n: last_lines(t[logs[n]:], 3) for n, t in g.epilog_logs().items()}))
    said = {n: t[logs[n]:] for n, t in g.epilog_logs().items()}
    for node in NODES:
        check("epilog exit 0" in said[node] and f"released {stray}" in said[node],
              f"the Epilog on {node} did not release {stray} and exit 0: {last_lines(said[node], 4)}")
    wait_released(g, job)
    state = re.search(r"JobState=(\S+)", sh("scontrol", "show", "job", job, env=slurm_env()).stdout)
    check(state is not None and state.group(1) == "COMPLETED",
          f"job {job} is {state.group(1) if state else '?'}, not COMPLETED")
    check(wait_for(lambda: g.shared_pools() == pools, timeout=30, interval=1),
          f"shared pools {({n: c.format() for n, c in g.shared_pools().items()})}, before the job "
          f"{({n: c.format() for n, c in pools.items()})}")
    return note + "; Epilog: " + "; ".join(
        f"{n}: " + " | ".join(ln for ln in said[n].splitlines() if not ln.startswith("epilog ")) for n in NODES)


def s_agent_kill(g: ClusterGuest) -> str:
    """numa2's agent killed with SIGKILL while a two-node step runs: its tasks keep their
    CPUs and memory (read from their /proc/PID/status while it is down); started again (as
    systemd would), it lists the same bookings for the same pids; when the step ends both
    agents release them."""
    g.cluster.start()
    proc = g.srun("kill", "-N2", "-n4", "--ntasks-per-node=2", "-c2", cpus=2)
    tasks = g.wait_tasks(g.work / "kill.srun", 4, alive=lambda: proc.poll() is None)
    job = tasks[0]["job"]
    per_node = check_placement(g, tasks, job)
    note = placement_note(g, job, per_node)
    before = {w["name"]: (w["cpus"], w["pid"]) for w in g.node_workloads(NODES[1], job)}
    killed = g.peer.call("agent_kill")["pid"]
    for procid, t in tasks.items():
        if t["node"] != NODES[1]:
            continue
        cpus, mems = parse_allowed(g.peer.run("cat", f"/proc/{t['pid']}/status"))
        check(cpus == CpuSet.parse(before[next(n for n in before if n.startswith(f"slurm-{job}-0-{procid}-"))][0]),
              f"task {procid} on {NODES[1]} reads CPUs {cpus.format()} with its agent down")
    g.peer.call("agent_start", timeout=AGENT_START_TIMEOUT + 30)
    after = {w["name"]: (w["cpus"], w["pid"]) for w in g.node_workloads(NODES[1], job)}
    check(after == before, f"after the restart {NODES[1]}'s agent lists {after}, before the kill {before}")
    end_step(g, "kill", proc, job)
    return f"agent pid {killed} killed; kept {sorted(before)}; " + note


RUNNERS = {
    "cluster-srun": s_srun,
    "cluster-batch": s_batch,
    "cluster-agent-kill": s_agent_kill,
}
assert tuple(RUNNERS) == SLURM_CLUSTER_SCENARIOS


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("NUMA_AGENT_VM_GUEST", "0") != "0":
        return serve_peer(argv)
    guest: list[ClusterGuest] = []

    def make(shape: str, work: Path) -> ClusterGuest:
        guest.append(ClusterGuest(shape, work))
        return guest[0]
    try:
        return guest_main(argv, RUNNERS, make, prog="python -m tests.vm_e2e.slurm_cluster_scenarios")
    finally:
        try:
            if guest:
                guest[0].cluster.stop()
            addresses = os.environ.get("NUMA_AGENT_VM_ADDRESSES", "").split()
            if len(addresses) == 2:
                Peer(addresses[1]).call("exit", timeout=60)  # numa2 stops its daemons and powers off
        except (ScenarioFailed, OSError):
            pass


if __name__ == "__main__":
    sys.exit(main())
