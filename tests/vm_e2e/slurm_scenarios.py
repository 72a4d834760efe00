"""The Slurm scenarios (shape `slurm`: the 2node machine), run INSIDE its guest by scripts/vm-e2e:

    .venv/bin/python -m tests.vm_e2e.slurm_scenarios --shape slurm

The real engine: Debian's slurmctld and slurmd 22.05 with munge, one node, started here
(the guest's root is a throwaway overlay of the host's, where they are installed but not
started). The node line slurm.conf gets is `numa-agent slurm-node`'s, the Epilog is the
shipped contrib/slurm/epilog, and every task runs `srun ... numa-run --cpus N -- ...` as a
user would write it. The oracle is the kernel (/proc/PID/status, the cgroup files) and
Slurm itself (`slurmd -C`, `scontrol show node`, slurmd's log), not the agent.

Set-up (once): a hostname, `dummy0` with 192.0.2.1/32 named in /etc/hosts (both daemons
refuse to start while only loopback has an address; the guest has no network backend, so
nothing leaves it), a munge key and munged, /sys/fs/cgroup/system.slice with its
controllers (slurmd's cgroup/v2 plugin outside systemd: IgnoreSystemd=yes), the agent on
the default socket (the Epilog, run by slurmd with a bare environment, finds it there) and
numa-agent in /usr/local/bin. The daemons run with TaskPlugin=task/none first, then are
restarted with task/affinity, then with task/cgroup and ConstrainCores=yes, then with both
(task/cgroup,task/affinity), then with both and the guest's PCI devices as GRES (GresTypes=,
`numa-agent slurm-node --gres` and `--gres-conf`), and last with task/none again but without
per-task cgroups.
JobAcctGatherType=jobacct_gather/{'cgroup' if per_task_cgroups else 'none'} gives each task a cgroup of its own (task_<id>):
without it Slurm 22.05 keeps all of a step's tasks on a node in one (user/task_special),
which holds one booking, and a task that left it for a cgroup of its own would no longer
be killed by scancel (both seen in this guest).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import wait_for
from tests.vm_e2e.plan import SLURM_SCENARIOS
from tests.vm_e2e.scenarios import (
    CGROUP_MOUNT,
    Guest,
    Kernel,
    ScenarioFailed,
    bring_loopback_up,
    check,
    guest_main,
    last_lines,
    parse_allowed,
    proc_cgroup,
    stop_all,
)

REPO = Path(__file__).resolve().parents[2]
NODE = "numa1"
ADDRESS = "192.0.2.1"
SOCKET = "/run/numa-agent/agent.sock"  # the default: the Epilog's numa-agent finds it
EPILOG = REPO / "contrib" / "slurm" / "epilog"
SLURM_TIMEOUT = 120.0  # daemons and steps under emulation
SLEEP = 600


def sh(*argv: str, timeout: float = SLURM_TIMEOUT, check_rc: bool = True,
       env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check_rc and done.returncode != 0:
        raise ScenarioFailed(f"`{' '.join(argv)}` exited {done.returncode}: "
                             f"{last_lines(done.stderr or done.stdout, 4)}")
    return done


def start_slurm_host(munge_key: bytes, numa_agent: Path) -> None:
    """What slurmd needs of a guest: the cluster's munge key and munged, the
    controllers in /sys/fs/cgroup/system.slice, and numa-agent where the
    Epilog looks (where scripts/install links it)."""
    key = Path("/etc/munge/munge.key")
    key.write_bytes(munge_key)
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    sh("runuser", "-u", "munge", "--", "/usr/sbin/munged")
    system_slice = CGROUP_MOUNT / "system.slice"
    system_slice.mkdir(exist_ok=True)
    (system_slice / "cgroup.subtree_control").write_text("+cpuset +cpu +memory +pids")
    link = Path("/usr/local/bin/numa-agent")
    link.unlink(missing_ok=True)
    link.symlink_to(numa_agent)


def stop_daemons(daemons: list[subprocess.Popen]) -> None:
    """SIGTERM to each, then each waited for (30 s, then SIGKILL); the list emptied."""
    for daemon in daemons:
        if daemon.poll() is None:
            daemon.terminate()
    for daemon in daemons:
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
    daemons.clear()


def node_fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


class Slurm:
    """slurmctld, slurmd and munged for one node, configured under `work`."""

    def __init__(self, work: Path, logs: Path, node_line: str) -> None:
        self.work, self.logs, self.node_line = work, logs, node_line
        self.conf = work / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []
        self.task_plugin: tuple[str, bool, bool] | None = None
        self.epilog_log = logs / "epilog.log"
        # `numa-agent slurm-node --gres` and `--gres-conf`: what start(gres=True) configures.
        self.gres_node_line = self.gres_conf = ""

    def write_config(self, task_plugin: str, per_task_cgroups: bool = True, gres: bool = False) -> None:
        wrapper = self.work / "epilog"
        # The shipped Epilog, its output and exit status kept where the scenarios read them.
        wrapper.write_text(f"#!/bin/sh\n{{ echo \"epilog job $SLURM_JOB_ID\"; {EPILOG}; "
                           f"echo \"epilog exit $?\"; }} >> {self.epilog_log} 2>&1\nexit 0\n")
        wrapper.chmod(0o755)
        w, logs = self.work, self.logs
        self.conf.write_text(f"""\
ClusterName=numa
SlurmctldHost={NODE}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation={w}/ctld
SlurmdSpoolDir={w}/d
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd.pid
SlurmctldLogFile={logs}/slurmctld.log
SlurmdLogFile={logs}/slurmd.log
SlurmdDebug=debug
ProctrackType=proctrack/cgroup
TaskPlugin={task_plugin}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/{'cgroup' if per_task_cgroups else 'none'}
AccountingStorageType=accounting_storage/none
KillWait=5
Epilog={wrapper}
{self.gres_types() if gres else ''}
{self.gres_node_line if gres else self.node_line}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        constrain = "task/cgroup" in task_plugin.split(",")
        (w / "cgroup.conf").write_text("CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"
                                       f"ConstrainCores={'yes' if constrain else 'no'}\n")
        gres_conf = w / "gres.conf"  # beside slurm.conf, where both daemons look
        if gres:
            gres_conf.write_text(self.gres_conf + "\n")
        else:
            gres_conf.unlink(missing_ok=True)

    def gres_types(self) -> str:
        """slurm.conf's GresTypes= naming every GRES of the node line's Gres=."""
        gres = node_fields(self.gres_node_line).get("Gres", "")
        return "GresTypes=" + ",".join(item.split(":")[0] for item in gres.split(","))

    def start(self, task_plugin: str, per_task_cgroups: bool = True, gres: bool = False) -> None:
        """The daemons running with this TaskPlugin and the node idle; without per-task
        cgroups (no jobacct_gather/cgroup) a step's tasks share one; with gres, the node's
        devices are GRES (numa-agent slurm-node --gres and --gres-conf)."""
        wanted = (task_plugin, per_task_cgroups, gres)
        if self.task_plugin == wanted and all(d.poll() is None for d in self.daemons):
            return
        self.stop()
        for sub in ("ctld", "d"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        self.write_config(task_plugin, per_task_cgroups, gres)
        for daemon in ("slurmctld", "slurmd"):
            out = open(self.logs / f"{daemon}.out", "a")
            self.daemons.append(subprocess.Popen([daemon, "-D"], stdout=out, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env={**os.environ, **self.env}))
        state = wait_for(lambda: self.node_state() == "idle" or None, timeout=SLURM_TIMEOUT, interval=1)
        check(state, f"the node is not idle within {SLURM_TIMEOUT:g} s with {task_plugin} "
                     f"(sinfo: {self.node_state()!r}); slurmctld: {self.tail('slurmctld.log')}; "
                     f"slurmd: {self.tail('slurmd.log')}")
        self.task_plugin = wanted

    def stop(self) -> None:
        stop_daemons(self.daemons)
        self.task_plugin = None

    def node_state(self) -> str:
        try:
            return sh("sinfo", "-h", "-o", "%T", timeout=20, check_rc=False, env=self.env).stdout.strip()
        except subprocess.TimeoutExpired:
            return ""

    def tail(self, name: str, n: int = 4) -> str:
        path = self.logs / name
        return last_lines(path.read_text(errors="replace"), n) if path.exists() else "(no log)"

    def jobs(self) -> list[str]:
        return sh("squeue", "-h", "-o", "%i", env=self.env).stdout.split()

    def cancel_all(self) -> None:
        if self.jobs():
            sh("scancel", "--user", "root", check_rc=False, env=self.env)
        wait_for(lambda: not self.jobs(), timeout=SLURM_TIMEOUT, interval=1)


class SlurmGuest(Guest):
    def __init__(self, shape: str, work: Path) -> None:
        bring_loopback_up()
        super().__init__(shape, work, Kernel.read())
        # The agent on the default socket, as installed: the Epilog and srun's tasks find it.
        Path(SOCKET).parent.mkdir(parents=True, exist_ok=True)
        for args in (self.agent.args, self.standard_args):
            args[args.index("--socket") + 1] = SOCKET
        self.agent.socket = SOCKET
        out = os.environ.get("NUMA_AGENT_VM_OUT")
        logs = Path(out) / "slurm" if out else work / "slurm-logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.slurm_work = work / "slurm"
        self.slurm_work.mkdir(parents=True, exist_ok=True)
        self.numa_agent = Path(sys.executable).parent / "numa-agent"
        self.numa_run = Path(sys.executable).parent / "numa-run"
        self.bring_up_node()
        node_cmd = (str(self.numa_agent), "slurm-node", "--config", str(work / "agent" / "config.toml"),
                    "--node-name", NODE)
        self.node_line = sh(*node_cmd).stdout.strip()
        self.slurm = Slurm(self.slurm_work, logs, self.node_line)
        # A failure here is slurm-gres's to report, not every scenario's.
        self.gres_said = [sh(*node_cmd, flag, check_rc=False) for flag in ("--gres", "--gres-conf")]
        self.slurm.gres_node_line, self.slurm.gres_conf = (done.stdout.strip() for done in self.gres_said)

    def bring_up_node(self) -> None:
        """Hostname, an address of its own, munge, cgroups for slurmd, numa-agent on PATH."""
        sh("hostname", NODE)
        if sh("ip", "link", "show", "dummy0", check_rc=False).returncode != 0:
            sh("ip", "link", "add", "dummy0", "type", "dummy")
        sh("ip", "link", "set", "dummy0", "up")
        if ADDRESS not in sh("ip", "-4", "addr", "show", "dummy0").stdout:
            sh("ip", "addr", "add", f"{ADDRESS}/32", "dev", "dummy0")
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"{ADDRESS} {NODE}\n")
        start_slurm_host(os.urandom(1024), self.numa_agent)

    def srun(self, name: str, *srun_args: str, cpus: int, record: str) -> subprocess.Popen:
        """`srun SRUN_ARGS numa-run --cpus N -- sh -c ...`: each task writes its
        /proc/self/status lines, cgroup and memory policy (`numa-run --show`, which the
        shell's child inherits) to record.<procid>, then sleeps."""
        script = (f"grep _allowed_list /proc/self/status > {record}.$SLURM_PROCID.tmp; "
                  f"cat /proc/self/cgroup >> {record}.$SLURM_PROCID.tmp; "
                  f"{self.numa_run} --show >> {record}.$SLURM_PROCID.tmp; "
                  f"mv {record}.$SLURM_PROCID.tmp {record}.$SLURM_PROCID; exec sleep {SLEEP}")
        out = open(self.work / f"{name}.srun", "w+")
        proc = subprocess.Popen(["srun", *srun_args, str(self.numa_run), "--cpus", str(cpus), "--",
                                 "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **self.slurm.env})
        self.launched.append(proc)
        return proc

    def slurm_workloads(self, job: str | None = None) -> list[dict]:
        prefix = f"slurm-{job}-" if job else "slurm-"
        return [w for w in self.workloads() if w["name"].startswith(prefix)]

    def cleanup(self) -> str:
        self.slurm.cancel_all()
        stop_all(self.launched)
        return super().cleanup()


def _output(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def running_tasks(g: SlurmGuest, name: str, proc: subprocess.Popen, record: Path, tasks: int) -> list[dict]:
    """Until `tasks` workloads slurm-<job>-0-<procid>-u<uid> are listed and each task wrote
    its record; returns the listed workloads by procid."""
    def ready():
        if proc.poll() is not None:
            return "exited"
        listed = g.slurm_workloads()
        written = all(Path(f"{record}.{i}").exists() for i in range(tasks))
        return listed if len(listed) == tasks and written else None
    got = wait_for(ready, timeout=SLURM_TIMEOUT, interval=0.5)
    srun_out = _output(g.work / f"{name}.srun")
    check(isinstance(got, list), f"srun exited {proc.poll()} or {tasks} task(s) were not admitted within "
                                 f"{SLURM_TIMEOUT:g} s: listed {[w['name'] for w in g.slurm_workloads()]}; "
                                 f"srun: {last_lines(srun_out, 6)}; slurmd: {g.slurm.tail('slurmd.log')}")
    assert isinstance(got, list)
    return sorted(got, key=lambda w: int(w["name"].rsplit("-", 2)[1]))  # slurm-J-S-<procid>-u<uid>


def check_task(g: SlurmGuest, w: dict, record: Path, procid: int) -> tuple[CpuSet, CpuSet, str]:
    """The task's own view (what it wrote before exec'ing sleep) and the agent's agree: whole
    cores on one NUMA node, memory of that node; the task stayed in Slurm's step cgroup.
    Returns (cpus, mems, its cgroup)."""
    text = Path(f"{record}.{procid}").read_text()
    cpus, mems = parse_allowed(text)
    cgroup = next((line[3:] for line in text.splitlines() if line.startswith("0::")), "")
    booked = CpuSet.parse(w["cpus"])
    check(cpus == booked, f"{w['name']}: the task's Cpus_allowed_list is {cpus.format()}, the agent booked "
                          f"{booked.format()}")
    check(g.kernel.whole_cores(cpus), f"{w['name']}: CPUs {cpus.format()} are not whole cores")
    nodes = g.kernel.nodes_of(cpus)
    check(len(nodes) == 1, f"{w['name']}: CPUs {cpus.format()} span NUMA nodes {nodes}")
    check(mems == CpuSet(nodes), f"{w['name']}: Mems_allowed_list {mems.format()}, its CPUs are on node {nodes}")
    job = w["name"].split("-")[1]
    check(f"/job_{job}/step_0/" in cgroup,
          f"{w['name']}: the task runs in {cgroup!r}, not in Slurm's job_{job}/step_0 (it left Slurm's tracking)")
    check(w.get("engine_cgroup") == cgroup, f"{w['name']}: the agent enforces on {w.get('engine_cgroup')!r}, the task is in "
                                     f"{cgroup!r}")
    live = proc_cgroup(w["pid"]) if Path(f"/proc/{w['pid']}").exists() else ""
    check(live == cgroup, f"{w['name']}: pid {w['pid']} is in {live!r} now")
    return cpus, mems, cgroup


def check_pinned_tasks(g: SlurmGuest, tasks: list[dict], record: Path) -> str:
    """Tasks of one step that share Slurm's one cgroup (user/task_special), each pinned
    inside it: the task's own affinity is its booking, whole cores of one node, distinct
    from the other tasks', inside the step's cpuset; its memory policy binds that node
    (the cgroup's mems stay the step's); it stayed in the cgroup, which the agent did not
    take over (no engine_cgroup, its cpuset still the step's)."""
    said, seen = [], []
    for procid, w in enumerate(tasks):
        text = Path(f"{record}.{procid}").read_text()
        cpus, _ = parse_allowed(text)
        cgroup = next((line[3:] for line in text.splitlines() if line.startswith("0::")), "")
        booked = CpuSet.parse(w["cpus"])
        check(cgroup.endswith("/user/task_special"), f"{w['name']}: the task runs in {cgroup!r}, not Slurm's one cgroup")
        check(w.get("pinned_in") == cgroup and w.get("engine_cgroup") is None,
              f"{w['name']}: pinned_in {w.get('pinned_in')!r}, engine_cgroup {w.get('engine_cgroup')!r}; task in {cgroup!r}")
        check(cpus == booked, f"{w['name']}: the task's Cpus_allowed_list is {cpus.format()}, booked {booked.format()}")
        check(g.kernel.whole_cores(cpus), f"{w['name']}: CPUs {cpus.format()} are not whole cores")
        nodes = g.kernel.nodes_of(cpus)
        check(len(nodes) == 1, f"{w['name']}: CPUs {cpus.format()} span NUMA nodes {nodes}")
        policy = dict(re.findall(r"^(policy|membind): *(.*?) *$", text, re.M))
        bound = CpuSet(int(n) for n in policy.get("membind", "").split())
        every = CpuSet.parse(Path("/sys/devices/system/node/has_memory").read_text().strip())
        check(bound == CpuSet(nodes) and (policy.get("policy") == "bind" or bound == every),
              f"{w['name']}: memory policy {policy}, its CPUs are on node {nodes}")
        step = CGROUP_MOUNT / cgroup.lstrip("/")
        granted = CpuSet.parse((step / "cpuset.cpus.effective").read_text().strip())
        check(cpus.issubset(granted), f"{w['name']}: booked {cpus.format()} outside the cgroup's {granted.format()}")
        for other in seen:
            check(not (other & cpus), f"the tasks share CPUs {(other & cpus).format()}: {[t['cpus'] for t in tasks]}")
        seen.append(cpus)
        said.append(f"{w['name']} pinned to {cpus.format()} (node {min(nodes)}) in {cgroup.rsplit('/', 3)[-3]}/... "
                    f"of CPUs {granted.format()}")
    return "; ".join(said)


def pinned_pair(g: SlurmGuest, name: str) -> tuple[list[dict], str]:
    """`srun -n2 -c2 numa-run --cpus 2`: both tasks running, each checked pinned inside the
    step's one cgroup (check_pinned_tasks); their workloads and what was seen."""
    record = g.work / name
    proc = g.srun(name, "-n2", "-c2", cpus=2, record=record)
    tasks = running_tasks(g, name, proc, record, 2)
    return tasks, check_pinned_tasks(g, tasks, record)


def case_line(g: SlurmGuest, name: str, job: str, procid: int) -> str:
    srun_out = _output(g.work / f"{name}.srun")
    line = next((ln for ln in srun_out.splitlines() if ln.startswith(f"numa-run: Slurm step {job}.0 task {procid}: ")), "")
    check(line, f"numa-run said nothing of its Slurm case for task {procid}: {last_lines(srun_out, 4)}")
    return line


# ---------------------------------------------------------------- scenarios
def s_node(g: SlurmGuest) -> str:
    """The NodeName line numa-agent prints agrees with slurmd's own view of the machine and
    with the agent's reservation: Slurm reserves the agent's CPU (widened to its core)."""
    g.slurm.start("task/none")
    ours = node_fields(g.node_line)
    seen = node_fields(sh("slurmd", "-C", env=g.slurm.env).stdout.splitlines()[0])
    for key in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory"):
        check(ours.get(key) == seen.get(key), f"{key}: numa-agent slurm-node says {ours.get(key)}, "
                                              f"slurmd -C {seen.get(key)} ({g.node_line})")
    shown = sh("scontrol", "show", "node", NODE, env=g.slurm.env).stdout
    spec = re.search(r"CPUSpecList=(\S+)", shown)
    check(spec is not None, f"scontrol show node has no CPUSpecList: {last_lines(shown, 4)}")
    assert spec is not None
    # Abstract ids as Slurm shows them, whole cores; on this shape they equal the kernel's.
    slurm_reserved = CpuSet.parse(spec.group(1))
    agent_reserved = CpuSet.parse(g.status()["reserved_cpus"])
    widened = CpuSet.union_of(g.kernel.siblings[c] for c in agent_reserved.ids())
    check(slurm_reserved == widened, f"Slurm reserves CPUSpecList={slurm_reserved.format()}, the agent's "
                                     f"reserved CPUs {agent_reserved.format()} are the cores {widened.format()}")
    effective = re.search(r"CPUEfctv=(\d+)", shown)
    return f"{g.node_line}; Slurm: CPUSpecList={spec.group(1)}, CPUEfctv={effective.group(1) if effective else '?'}"


def s_one_task(g: SlurmGuest) -> str:
    """task/none: `srun -n1 -c2 numa-run --cpus 2` books 2 CPUs of one core from the agent's
    pool, enforced on the task's own Slurm cgroup; the shared pool gives them up."""
    g.slurm.start("task/none")
    record = g.work / "one"
    proc = g.srun("one", "-n1", "-c2", cpus=2, record=record)
    (w,) = running_tasks(g, "one", proc, record, 1)
    cpus, mems, cgroup = check_task(g, w, record, 0)
    job = w["name"].split("-")[1]
    check(w["name"] == f"slurm-{job}-0-0-u{w['owner_uid']}", f"the workload is named {w['name']}")
    check(not (g.shared_pool() & cpus), f"the shared pool {g.shared_pool().format()} still has {cpus.format()}")
    line = case_line(g, "one", job, 0)
    check("did not confine" in line, f"numa-run's case line: {line!r}")
    return f"{w['name']} on CPUs {cpus.format()}, memory node {mems.format()}, in {cgroup}; {line}"


def s_three_tasks(g: SlurmGuest) -> str:
    """task/none: `srun -n3 -c2`, started at once: three workloads on distinct whole cores."""
    g.slurm.start("task/none")
    record = g.work / "three"
    proc = g.srun("three", "-n3", "-c2", cpus=2, record=record)
    ws = running_tasks(g, "three", proc, record, 3)
    seen: list[CpuSet] = []
    for i, w in enumerate(ws):
        cpus, _, _ = check_task(g, w, record, i)
        for other in seen:
            check(not (other & cpus), f"tasks share CPUs {(other & cpus).format()}: {[x['cpus'] for x in ws]}")
        seen.append(cpus)
    return ", ".join(f"{w['name']}: {w['cpus']}" for w in ws)


def s_epilog(g: SlurmGuest) -> str:
    """A job killed with scancel: slurmd runs the shipped Epilog, which exits 0, and the agent
    lists nothing of the job afterwards. Besides the task (released when its cgroup empties),
    the job left a workload whose process escaped Slurm (started outside srun under the job's
    name): only the Epilog releases that one. For a job with nothing booked it exits 0 too."""
    g.slurm.start("task/none")
    before = len(_output(g.slurm.epilog_log))
    record = g.work / "epilog"
    proc = g.srun("epilog", "-n1", "-c2", cpus=2, record=record)
    (w,) = running_tasks(g, "epilog", proc, record, 1)
    job = w["name"].split("-")[1]
    stray = f"slurm-{job}-extern-9"
    g.launch(stray, "--cpus", "2")  # moved into the agent's own tree: scancel does not reach it
    sh("scancel", job, env=g.slurm.env)
    log = epilog_ran(g, job, before)
    check(f"released {stray}" in log, f"the Epilog did not release {stray}: {last_lines(log, 4)}")
    check(wait_for(lambda: not g.slurm_workloads(job), timeout=30, interval=0.2),
          f"the agent still lists {[x['name'] for x in g.slurm_workloads(job)]} after the Epilog")
    state = g.slurm.node_state()
    check(state in ("idle", "mixed", "allocated"), f"the node is {state!r} after the Epilog (drained?)")
    nothing = sh(str(EPILOG), check_rc=False, env={"SLURM_JOB_ID": "999999"})
    check(nothing.returncode == 0 and "no workloads of Slurm job 999999" in nothing.stdout,
          f"the Epilog for a job with nothing booked exited {nothing.returncode}: {nothing.stdout}{nothing.stderr}")
    said = " | ".join(ln for ln in log.splitlines() if not ln.startswith("epilog "))
    return f"job {job} cancelled; Epilog said: {said or '(nothing)'}; node {state}"


def s_affinity(g: SlurmGuest) -> str:
    """task/affinity alone: Slurm binds the task to its 4 CPUs without confining its cgroup;
    numa-run books 2 of them, one aligned core, in place (within_cpus: never outside)."""
    g.slurm.start("task/affinity")
    record = g.work / "affinity"
    proc = g.srun("affinity", "-n1", "-c4", cpus=2, record=record)
    (w,) = running_tasks(g, "affinity", proc, record, 1)
    job = w["name"].split("-")[1]
    cpus, mems, _ = check_task(g, w, record, 0)
    line = case_line(g, "affinity", job, 0)
    bound = re.search(r"confined by Slurm to CPUs (\S+?)[;,]", line)
    check(bound is not None, f"numa-run's case line names no binding: {line!r}")
    assert bound is not None
    check(len(CpuSet.parse(bound.group(1))) == 4 and cpus.issubset(CpuSet.parse(bound.group(1))),
          f"booked {cpus.format()}, Slurm bound the task to {bound.group(1)}: {line!r}")
    return f"booked {cpus.format()} (node {mems.format()}); {line}"


def s_confined(g: SlurmGuest) -> str:
    """task/cgroup with ConstrainCores=yes: Slurm grants the step 4 CPUs; numa-run books 2,
    one aligned core inside them, in Slurm's cgroup. Asking for more than Slurm granted is
    refused, exit 125, and srun shows why."""
    g.slurm.start("task/cgroup")
    record = g.work / "confined"
    proc = g.srun("confined", "-n1", "-c4", cpus=2, record=record)
    (w,) = running_tasks(g, "confined", proc, record, 1)
    cpus, mems, cgroup = check_task(g, w, record, 0)
    job = w["name"].split("-")[1]
    step = cgroup.split("/step_0/")[0] + "/step_0"
    granted = CpuSet.parse((CGROUP_MOUNT / step.lstrip("/") / "cpuset.cpus.effective").read_text().strip())
    check(len(granted) == 4, f"Slurm's step cpuset is {granted.format()}, expected 4 CPUs")
    check(cpus.issubset(granted), f"booked {cpus.format()} outside Slurm's step cpuset {granted.format()}")
    check(not (g.shared_pool() & cpus), f"the shared pool {g.shared_pool().format()} still has {cpus.format()}")
    line = case_line(g, "confined", job, 0)
    check(f"confined by Slurm to CPUs {granted.format()}" in line, f"numa-run's case line: {line!r}")
    spec = re.search(r"Resource spec: Reserved machine CPU IDs: (\S+)", (g.slurm.logs / "slurmd.log").read_text())
    # The refusal a user sees: more CPUs than the step was granted.
    refused = sh("srun", "-n1", "-c2", str(g.numa_run), "--cpus", "4", "--", "true", check_rc=False,
                 env=g.slurm.env)
    (g.slurm.logs / "refusal.txt").write_text(refused.stdout + refused.stderr)  # what docs/slurm.md shows
    check(refused.returncode != 0 and "numa-run: Slurm gave this task CPUs " in refused.stdout + refused.stderr,
          f"srun -c2 numa-run --cpus 4 exited {refused.returncode}: {last_lines(refused.stderr, 6)}")
    return (f"step cpuset {granted.format()}, booked {cpus.format()} (node {mems.format()}); {line}; "
            f"slurmd reserved machine CPUs {spec.group(1) if spec else '?'}; refusal: "
            f"{last_lines(refused.stderr, 8)}")


def s_shared_cgroup(g: SlurmGuest) -> str:
    """Without per-task cgroups Slurm 22.05 keeps a step's tasks on a node in one cgroup
    (user/task_special): a lone task is still booked in place there; two tasks are each
    pinned inside it on CPUs of their own, rebuilt alike when the checkpoint is lost under
    them, and released when the step ends."""
    g.slurm.start("task/none", per_task_cgroups=False)
    record = g.work / "lone"
    proc = g.srun("lone", "-n1", "-c2", cpus=2, record=record)
    (w,) = running_tasks(g, "lone", proc, record, 1)
    _, _, cgroup = check_task(g, w, record, 0)
    check(cgroup.endswith("/user/task_special"), f"the lone task runs in {cgroup!r}, not Slurm's shared cgroup")
    g.slurm.cancel_all()
    check(wait_for(lambda: not g.slurm_workloads(), timeout=30, interval=0.2),
          f"the agent still lists {[x['name'] for x in g.slurm_workloads()]} after the lone task's step")
    tasks, pair = pinned_pair(g, "pair")
    # The checkpoint lost (both generations) under them: each rebuilt from its marked
    # process, pinned inside the cgroup again on the same CPUs, not double-booked.
    before = {t["name"]: (t["cpus"], t["pid"], t["pinned_in"]) for t in tasks}
    g.agent.kill()
    for name in ("checkpoint.json", "checkpoint.json.prev"):
        (g.agent.state_dir / name).unlink(missing_ok=True)
    g.start_agent()
    after = {t["name"]: (t["cpus"], t["pid"], t["pinned_in"]) for t in g.slurm_workloads()}
    check(after == before, f"after a lost checkpoint the agent lists {after}, before {before}")
    g.slurm.cancel_all()
    check(wait_for(lambda: not g.slurm_workloads(), timeout=30, interval=0.2),
          f"the agent still lists {[x['name'] for x in g.slurm_workloads()]} after the step ended")
    return (f"{w['name']} in place on {cgroup}; two tasks: {pair}; rebuilt alike after a lost checkpoint; "
            "released at the step's end")


def epilog_ran(g: SlurmGuest, job: str, before: int) -> str:
    """slurmd ran the Epilog for `job` (after `before` characters of its log) and it exited 0;
    returns what it wrote."""
    def output() -> str:
        return _output(g.slurm.epilog_log)[before:]
    ran = wait_for(lambda: f"epilog job {job}\n" in output() and "epilog exit" in output(),
                   timeout=SLURM_TIMEOUT, interval=0.5)
    log = output()
    check(ran, f"slurmd did not run the Epilog for job {job} within {SLURM_TIMEOUT:g} s: "
               f"epilog.log {last_lines(log, 4)!r}; slurmd: {g.slurm.tail('slurmd.log')}")
    check("epilog exit 0" in log, f"the Epilog did not exit 0: {last_lines(log, 4)}")
    return log


def s_combined(g: SlurmGuest) -> str:
    """TaskPlugin=task/cgroup,task/affinity with ConstrainCores=yes: two one-task steps
    (`srun -n1 -c2 numa-run --cpus 2`, at once) are each booked inside what Slurm gave the
    task (its cgroup and its binding), in place, on distinct whole cores with their node's
    memory. More CPUs than Slurm gave is refused in numa-run's one line. Two tasks of one
    step share Slurm 22.05's one cgroup under task/cgroup (jobacct_gather/cgroup or not):
    each is pinned inside it, within its binding. The jobs' Epilogs leave nothing booked."""
    g.slurm.start("task/cgroup,task/affinity")
    procs = {name: g.srun(name, "-n1", "-c2", cpus=2, record=g.work / name) for name in ("comb-a", "comb-b")}

    def both() -> list[dict] | str | None:
        if any(p.poll() is not None for p in procs.values()):
            return "exited"
        listed = g.slurm_workloads()
        written = all(Path(f"{g.work / name}.0").exists() for name in procs)
        return listed if len(listed) == 2 and written else None
    got = wait_for(both, timeout=SLURM_TIMEOUT, interval=0.5)
    check(isinstance(got, list), f"the two steps were not both admitted within {SLURM_TIMEOUT:g} s: "
                                 f"{ {n: last_lines(_output(g.work / f'{n}.srun'), 4) for n in procs} }")
    assert isinstance(got, list)
    seen: list[CpuSet] = []
    said = []
    for name in procs:
        record = g.work / name
        task_cgroup = next(ln[3:] for ln in Path(f"{record}.0").read_text().splitlines() if ln.startswith("0::"))
        job = re.search(r"/job_(\d+)/", task_cgroup)
        check(job is not None, f"{name}: the task runs in {task_cgroup!r}, not in a Slurm job's cgroup")
        assert job is not None
        (w,) = [x for x in got if x["name"].startswith(f"slurm-{job.group(1)}-0-0-")]
        cpus, mems, cgroup = check_task(g, w, record, 0)
        step = cgroup.split("/step_0/")[0] + "/step_0"
        granted = CpuSet.parse((CGROUP_MOUNT / step.lstrip("/") / "cpuset.cpus.effective").read_text().strip())
        line = case_line(g, name, job.group(1), 0)
        check(cpus.issubset(granted) and f"confined by Slurm to CPUs {granted.format()}" in line,
              f"{name}: booked {cpus.format()}, Slurm's step cpuset {granted.format()}: {line!r}")
        for other in seen:
            check(not (other & cpus), f"the tasks share CPUs {(other & cpus).format()}: {[x['cpus'] for x in got]}")
        seen.append(cpus)
        said.append(f"{w['name']}: {cpus.format()} (node {mems.format()}) in step cpuset {granted.format()}")
    refused = sh("srun", "-n1", "-c2", str(g.numa_run), "--cpus", "4", "--", "true", check_rc=False,
                 env=g.slurm.env)
    out = refused.stdout + refused.stderr
    (g.slurm.logs / "refusal-combined.txt").write_text(out)  # what docs/slurm.md shows
    line = next((ln for ln in out.splitlines() if ln.startswith("numa-run: Slurm gave this task CPUs ")), "")
    check(refused.returncode != 0 and line.endswith("(2), --cpus 4 asked"),
          f"srun -c2 numa-run --cpus 4 exited {refused.returncode}: {last_lines(out, 6)}")
    before = len(_output(g.slurm.epilog_log))
    jobs = [w["name"].split("-")[1] for w in got]
    for job in jobs:
        sh("scancel", job, env=g.slurm.env)
    for job in jobs:
        epilog_ran(g, job, before)
    check(wait_for(lambda: not g.slurm_workloads(), timeout=30, interval=0.2),
          f"the agent still lists {[x['name'] for x in g.slurm_workloads()]} after the Epilogs")
    # With the jobs gone, a step of two tasks has the cores it needs: each pinned inside
    # the step's one cgroup, within what task/affinity bound it to.
    tasks, pair = pinned_pair(g, "comb-pair")
    job = tasks[0]["name"].split("-")[1]
    before = len(_output(g.slurm.epilog_log))
    sh("scancel", job, env=g.slurm.env)
    epilog_ran(g, job, before)
    check(wait_for(lambda: not g.slurm_workloads(), timeout=30, interval=0.2),
          f"the agent still lists {[x['name'] for x in g.slurm_workloads()]} after job {job}'s Epilog")
    return "; ".join(said) + f"; refusal: {line}; two tasks of a step: {pair}; released by jobs' end"


def gres_of_slurmd(g: SlurmGuest) -> dict[str, list[dict[str, str]]]:
    """`slurmd -G`: the GRES slurmd reads from slurm.conf and gres.conf, by name."""
    out = sh("slurmd", "-G", env=g.slurm.env)
    found: dict[str, list[dict[str, str]]] = {}
    for line in (out.stdout + out.stderr).splitlines():
        if "Gres Name=" in line:
            f = node_fields(line[line.index("Gres Name="):].removeprefix("Gres "))
            found.setdefault(f.get("Name", ""), []).append(f)
    return found


def s_gres(g: SlurmGuest) -> str:
    """The guest's PCI devices as GRES: `numa-agent slurm-node --gres` and `--gres-conf`
    (the NVMe controller's /dev/nvme0, the two NICs counted) with GresTypes= in slurm.conf:
    slurmctld takes them and the node comes up idle, not drained, with those counts; slurmd
    reads each device's Cores= as the cores of its NUMA node. A step asking for the NVMe
    with --gres-flags=enforce-binding runs on its node's cores and numa-run books there."""
    for done in g.gres_said:
        check(done.returncode == 0, f"`{' '.join(done.args)}` exited {done.returncode}: {last_lines(done.stderr, 4)}")
    g.slurm.start("task/cgroup,task/affinity", gres=True)
    shown = sh("scontrol", "show", "node", NODE, env=g.slurm.env).stdout
    gres = re.search(r"\bGres=(\S+)", shown)
    state = re.search(r"\bState=(\S+)", shown)
    wanted = node_fields(g.slurm.gres_node_line)["Gres"]
    # Slurm adds the sockets the cores of Cores= lie on: nvme:1(S:1).
    check(gres is not None and re.sub(r"\(S:[^)]*\)", "", gres.group(1)) == wanted,
          f"scontrol show node says Gres={gres.group(1) if gres else '?'}, the node line {wanted}")
    check(state is not None and "DRAIN" not in state.group(1) and "INVALID" not in state.group(1),
          f"the node is {state.group(1) if state else '?'}: {last_lines(shown, 4)}")
    nvmes = [a for a in g.kernel.devices_of_class("0x0108") if g.kernel.pci_nodes[a] >= 0]
    check(len(nvmes) == 1, f"the shape should have one NVMe with a node: {nvmes}")
    node = g.kernel.pci_nodes[nvmes[0]]
    cores = sorted({min(g.kernel.siblings[c].ids()) for c in g.kernel.node_cpus[node].ids()})
    firsts = sorted({min(s.ids()) for s in g.kernel.siblings.values()})
    near = CpuSet(firsts.index(c) for c in cores)  # Slurm's core index: cores in order
    read = gres_of_slurmd(g)
    nvme = read.get("nvme", [])
    check(len(nvme) == 1 and nvme[0].get("File") == "/dev/nvme0" and Path("/dev/nvme0").exists()
          and CpuSet.parse(nvme[0].get("Cores", "") or "") == near,
          f"slurmd -G reads nvme as {nvme}; expected File=/dev/nvme0 Cores={near.format()} (node {node})")
    record = g.work / "gres"
    proc = g.srun("gres", "-n1", "-c2", "--gres=nvme:1", "--gres-flags=enforce-binding", cpus=2, record=record)
    (w,) = running_tasks(g, "gres", proc, record, 1)
    cpus, mems, _ = check_task(g, w, record, 0)
    check(g.kernel.nodes_of(cpus) == [node], f"the step holding the NVMe booked {cpus.format()}, not on node {node}")
    g.slurm.cancel_all()
    return (f"{g.slurm.gres_types()}; {wanted}; gres.conf: {' | '.join(g.slurm.gres_conf.splitlines())}; "
            f"node {state.group(1) if state else '?'}; slurmd -G nvme: {nvme}; "
            f"--gres=nvme:1 booked {cpus.format()} (node {mems.format()})")


RUNNERS = {
    "slurm-node": s_node,
    "slurm-one-task": s_one_task,
    "slurm-three-tasks": s_three_tasks,
    "slurm-epilog": s_epilog,
    "slurm-affinity": s_affinity,
    "slurm-confined": s_confined,
    "slurm-combined": s_combined,
    "slurm-gres": s_gres,
    "slurm-shared-cgroup": s_shared_cgroup,
}
assert tuple(RUNNERS) == SLURM_SCENARIOS


def main(argv: list[str] | None = None) -> int:
    guest: list[SlurmGuest] = []

    def make(shape: str, work: Path) -> SlurmGuest:
        guest.append(SlurmGuest(shape, work))
        return guest[0]
    try:
        return guest_main(argv, RUNNERS, make, prog="python -m tests.vm_e2e.slurm_scenarios")
    finally:
        if guest:
            guest[0].slurm.stop()


if __name__ == "__main__":
    sys.exit(main())
