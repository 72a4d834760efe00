"""The podman scenarios (shape `podman`), run INSIDE the guest by scripts/vm-e2e:

    .venv/bin/python -m tests.vm_e2e.podman_scenarios --shape podman

The real podman 4.3.1 with crun runs containers whose `numa-agent.io/` annotations the
shipped OCI hook (`numa-agent oci-hook`, rendered with this venv's command and the agent's
socket) turns into admissions on the container's own cgroup. The guest is set up as
docs/containers.md tells an administrator: plain containers' parent (/libpod_parent, podman's cgroupfs
default) kept on the housekeeping CPUs, annotated ones started under /numa-containers, which
keeps every CPU. The oracle is the kernel: /proc/PID/status inside and outside the
containers, and the cgroup files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import wait_for
from tests.vm_e2e.scenarios import (
    AGENT_CONFIG,
    CGROUP_MOUNT,
    RELEASE_LIMIT,
    Guest,
    Kernel,
    ScenarioFailed,
    bring_loopback_up,
    check,
    guest_main,
    last_lines,
    parse_allowed,
    proc_allowed,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED_HOOKS = REPO / "oci" / "hooks.d"
IMAGE = "localhost/numa-busybox"
# docs/containers.md's recipe: the agent's reserved CPUs are the housekeeping ones, where plain
# containers' parent is kept; annotated containers start under a parent with every CPU.
HOUSEKEEPING = "0-1"
PLAIN_PARENT = "/libpod_parent"
NUMA_PARENT = "/numa-containers"
PODMAN_CONFIG = AGENT_CONFIG + f"""
[cpu_manager]
policy = "static"
reserved_cpus = "{HOUSEKEEPING}"
"""
PODMAN_TIMEOUT = 180.0  # one `podman run` under emulation takes a few seconds; 20 at once, more
CONCURRENT = 20
BUSYBOX_TOOLS = ("sh", "cat", "grep", "sleep", "taskset", "true", "echo")
STATUS_THEN_SLEEP = ("sh", "-c", "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status; exec sleep 600")


def ctr_name(cid: str) -> str:
    return f"ctr-{cid[:12]}"


def cgroup_dir(path: str) -> Path:
    return CGROUP_MOUNT / path.lstrip("/")


class PodmanGuest(Guest):
    """The standard guest's agent (reserved CPUs = housekeeping), podman with the hook, an image."""

    def __init__(self, shape: str, work: Path, kernel: Kernel) -> None:
        super().__init__(shape, work, kernel)
        (work / "agent" / "config.toml").write_text(PODMAN_CONFIG)  # the file AgentProcess names
        self.hooks = work / "hooks"
        self.containers: list[str] = []

    # -- set-up
    def set_up(self) -> None:
        self._import_image()
        self.render_hooks(self.hooks, self.agent.socket)
        # docs/containers.md: keep plain containers off the agent's CPUs.
        parent = cgroup_dir(PLAIN_PARENT)
        parent.mkdir(exist_ok=True)
        (parent / "cpuset.cpus").write_text(HOUSEKEEPING)

    def _import_image(self) -> None:
        rootfs = self.work / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        busybox = Path("/bin/busybox")
        (rootfs / "bin" / "busybox").write_bytes(busybox.read_bytes())
        (rootfs / "bin" / "busybox").chmod(0o755)
        for tool in BUSYBOX_TOOLS:
            (rootfs / "bin" / tool).symlink_to("busybox")
        tar = self.work / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True, timeout=60)
        done = self.podman("import", str(tar), IMAGE)
        check(done.returncode == 0, f"podman import: {last_lines(done.stderr, 4)}")

    def render_hooks(self, where: Path, socket_path: str, env: list[str] | None = None) -> None:
        """The shipped hook files, calling this venv's numa-agent with the agent's socket."""
        where.mkdir(parents=True, exist_ok=True)
        command = Path(sys.executable).parent / "numa-agent"
        for shipped in sorted(SHIPPED_HOOKS.glob("*.json")):
            doc = json.loads(shipped.read_text())
            doc["hook"]["path"] = str(command)
            doc["hook"]["args"] = [*doc["hook"]["args"], "--socket", socket_path]
            if env:
                doc["hook"]["env"] = env
            (where / shipped.name).write_text(json.dumps(doc, indent=2) + "\n")

    # -- podman
    def podman(self, *args: str, hooks: Path | None = None, timeout: float = PODMAN_TIMEOUT,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        # Storage of its own: the guest's root is the host's, whose /var/lib/containers may hold
        # another driver's database (podman then refuses every command).
        argv = ["podman", "--root", str(self.work / "storage"), "--runroot", str(self.work / "run"),
                "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                "--runtime", "crun", "--hooks-dir", str(hooks or self.hooks), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})})

    def run_argv(self, annotations: dict[str, str], command=STATUS_THEN_SLEEP, *, parent: str | None = NUMA_PARENT,
                 detach: bool = True) -> list[str]:
        argv = ["run", "--network", "none"]
        argv += ["-d"] if detach else ["--rm"]
        if parent:
            argv += ["--cgroup-parent", parent]
        for key, value in annotations.items():
            argv += ["--annotation", f"{key}={value}"]
        return [*argv, IMAGE, *command]

    def start(self, annotations: dict[str, str], command=STATUS_THEN_SLEEP, *, parent: str | None = NUMA_PARENT
              ) -> str:
        """A detached container, running; returns its id."""
        done = self.podman(*self.run_argv(annotations, command, parent=parent))
        check(done.returncode == 0, f"podman run {annotations} exited {done.returncode}: "
                                    f"{last_lines(done.stderr, 4)}")
        cid = done.stdout.strip().splitlines()[-1]
        self.containers.append(cid)
        return cid

    def pid(self, cid: str) -> int:
        done = self.podman("inspect", cid, "--format", "{{.State.Pid}}")
        check(done.returncode == 0, f"podman inspect {cid[:12]}: {last_lines(done.stderr, 3)}")
        return int(done.stdout.strip())

    def cgroup(self, cid: str) -> str:
        """The container's cgroup path, from /proc/PID/cgroup of its process."""
        for line in Path(f"/proc/{self.pid(cid)}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
        raise ScenarioFailed(f"container {cid[:12]} has no cgroup v2 line")

    def logged(self, cid: str, marker: str) -> str:
        """The container's output, once it holds `marker`."""
        def output() -> str | None:
            out = self.podman("logs", cid).stdout
            return out if marker in out else None
        out = wait_for(output, timeout=PODMAN_TIMEOUT, interval=0.5)
        check(out, f"container {cid[:12]} did not print {marker!r}")
        return str(out)

    def inside(self, cid: str) -> tuple[CpuSet, CpuSet]:
        """What the container's own process read from its /proc/self/status."""
        return parse_allowed(self.logged(cid, "Mems_allowed_list"))

    def admitted(self, cid: str) -> dict:
        record = wait_for(lambda: self.listed(ctr_name(cid)), timeout=30, interval=0.1)
        check(isinstance(record, dict), f"container {cid[:12]} runs but {ctr_name(cid)} is not listed")
        return record

    def cleanup(self) -> str:
        if self.containers:
            self.podman("rm", "-f", "-t", "0", *self.containers)
            self.containers.clear()
        self.podman("rm", "-f", "-a", "-t", "0")
        return super().cleanup()


def make_guest(shape: str, work: Path) -> PodmanGuest:
    bring_loopback_up()
    guest = PodmanGuest(shape, work, Kernel.read())
    guest.set_up()
    return guest


def libpod_cgroups() -> list[Path]:
    """Every container's cgroup, whatever its parent."""
    return sorted(p for p in CGROUP_MOUNT.rglob("libpod-*") if p.is_dir())


def cpus_of(path: Path, name: str = "cpuset.cpus.effective") -> CpuSet:
    return CpuSet.parse((path / name).read_text().strip())


# ---------------------------------------------------------------- scenarios
def s_aligned(g: PodmanGuest) -> str:
    """An annotated container reads aligned CPUs and memory nodes; its own cgroup carries them; a plain
    container beside it is untouched."""
    cid = g.start({"numa-agent.io/cpus": "2", "numa-agent.io/memory": "64Mi"})
    record = g.admitted(cid)
    cgroup = f"{NUMA_PARENT}/libpod-{cid}"
    check(g.cgroup(cid) == cgroup, f"container {cid[:12]} is in {g.cgroup(cid)}, expected {cgroup}")
    check(record.get("engine_cgroup") == cgroup,
          f"{record['name']} is listed with engine_cgroup {record.get('engine_cgroup')!r}, expected {cgroup}")
    cpus, mems = CpuSet.parse(record["cpus"]), CpuSet.parse(",".join(map(str, record["mems"])))
    check(len(cpus) == 2 and record["exclusive"], f"booked {record['cpus']} (exclusive {record['exclusive']})")
    nodes = g.kernel.nodes_of(cpus)
    check(len(nodes) == 1 and mems == CpuSet(nodes), f"CPUs {cpus.format()} on nodes {nodes}, mems {mems.format()}")
    check(g.kernel.whole_cores(cpus), f"CPUs {cpus.format()} are not whole cores")
    inside = g.inside(cid)
    check(inside == (cpus, mems), f"inside: Cpus_allowed_list {inside[0].format()}, Mems_allowed_list "
                                  f"{inside[1].format()}; booked {cpus.format()} / {mems.format()}")
    check(proc_allowed(g.pid(cid)) == (cpus, mems), "the container's process is allowed other CPUs or nodes")
    where = cgroup_dir(cgroup)
    check(cpus_of(where, "cpuset.cpus") == cpus and CpuSet.parse((where / "cpuset.mems").read_text()) == mems,
          f"{cgroup}: cpuset.cpus {(where / 'cpuset.cpus').read_text().strip()!r}, cpuset.mems "
          f"{(where / 'cpuset.mems').read_text().strip()!r}")
    check((where / "memory.max").read_text().strip() == str(64 << 20),
          f"{cgroup}/memory.max is {(where / 'memory.max').read_text().strip()}")
    plain = g.start({}, parent=NUMA_PARENT)
    check(g.listed(ctr_name(plain)) is None, f"plain container {plain[:12]} was admitted")
    untouched = cgroup_dir(g.cgroup(plain)) / "cpuset.cpus"
    check(untouched.read_text().strip() == "", f"plain container's cpuset.cpus is {untouched.read_text()!r}")
    return f"{record['name']}: cpus {cpus.format()} mems {mems.format()} in {cgroup} (read inside and outside)"


def s_excluded(g: PodmanGuest) -> str:
    """The annotated container's CPUs are nobody else's: no other container's cgroup, not the agent's
    shared pool, not a plain container in the restricted parent (taskset there fails), not a plain
    process on the shared pool."""
    a = g.start({"numa-agent.io/cpus": "2"})
    mine = CpuSet.parse(g.admitted(a)["cpus"])
    other = g.start({"numa-agent.io/cpus": "1"})
    theirs = CpuSet.parse(g.admitted(other)["cpus"])
    check(not (mine & theirs), f"two annotated containers share CPUs {(mine & theirs).format()}")
    cpu = mine.ids()[0]
    plain = g.start({}, ("sh", "-c", "grep Cpus_allowed_list /proc/self/status; "
                                     f"taskset -c {cpu} true; echo taskset=$?; exec sleep 600"), parent=None)
    check(g.cgroup(plain).startswith(f"{PLAIN_PARENT}/"), f"plain container in {g.cgroup(plain)}")
    out = g.logged(plain, "taskset=")
    allowed = CpuSet.parse(re.search(r"Cpus_allowed_list:\s*(\S+)", out)[1])
    check(not (allowed & mine), f"plain container allowed {allowed.format()}, overlapping {mine.format()}")
    check("taskset=0" not in out, f"`taskset -c {cpu} true` succeeded in the plain container: {out!r}")
    for path in libpod_cgroups():
        if path.name == f"libpod-{a}":
            continue
        overlap = cpus_of(path) & mine
        check(not overlap, f"{path} has CPUs {overlap.format()} of {a[:12]} in cpuset.cpus.effective")
    check(not (g.shared_pool() & mine), f"the shared pool {g.shared_pool().format()} has {mine.format()}")
    shared = g.launch("plain-shared", "--shared")
    shared.wait_exec()
    allowed_shared, _ = proc_allowed(shared.proc.pid)
    check(not (allowed_shared & mine), f"numa-run --shared allowed {allowed_shared.format()}")
    return (f"{ctr_name(a)} cpus {mine.format()}; other container {theirs.format()}; plain container "
            f"{allowed.format()} (taskset -c {cpu}: refused); shared pool {g.shared_pool().format()}")


def s_release(g: PodmanGuest) -> str:
    """When the container's process exits, its booking is released within a second."""
    cid = g.start({"numa-agent.io/cpus": "2"})
    cpus = CpuSet.parse(g.admitted(cid)["cpus"])
    pid = g.pid(cid)
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    gone = wait_for(lambda: g.listed(ctr_name(cid)) is None, timeout=30, interval=0.02)
    took = time.monotonic() - started
    check(gone, f"{ctr_name(cid)} still listed 30 s after its process was killed")
    check(took <= RELEASE_LIMIT, f"{ctr_name(cid)} released {took:.2f} s after its process exited "
                                 f"(limit {RELEASE_LIMIT:g} s)")
    check(wait_for(lambda: cpus.issubset(g.shared_pool()), timeout=RELEASE_LIMIT, interval=0.02),
          f"CPUs {cpus.format()} not back in the shared pool {g.shared_pool().format()}")
    # `podman restart`: the hook runs again for the same id; a fresh booking, enforced again.
    again = g.start({"numa-agent.io/cpus": "1"}, ("sleep", "600"))
    first_pid = g.pid(again)
    done = g.podman("restart", "-t", "0", again)
    check(done.returncode == 0, f"podman restart: {last_lines(done.stderr, 3)}")
    check(wait_for(lambda: g.pid(again) != first_pid, timeout=PODMAN_TIMEOUT, interval=0.2),
          "podman restart did not start a new process")
    record = g.admitted(again)
    check(proc_allowed(g.pid(again))[0] == CpuSet.parse(record["cpus"]),
          f"after podman restart the container is allowed {proc_allowed(g.pid(again))[0].format()}, "
          f"booked {record['cpus']}")
    return (f"{ctr_name(cid)} released {took:.2f} s after its process exited; {cpus.format()} back in the pool; "
            f"restarted container booked again ({record['cpus']})")


def _refused(g: PodmanGuest, annotations: dict[str, str], *, parent: str | None = NUMA_PARENT,
             hooks: Path | None = None, in_containers_conf: bool = False) -> tuple[str, str]:
    """`podman run` of a container the hook refuses: (what podman printed, what the hook said).
    crun sends a hook's stderr to /dev/null unless run.oci.hooks.stderr names a file: on the
    command line, or for every container in containers.conf (`in_containers_conf`)."""
    said = g.work / f"hook-{len(list(g.work.glob('hook-*.err')))}.err"
    asked, env = {**annotations, "run.oci.hooks.stderr": str(said)}, None
    if in_containers_conf:
        conf = g.work / "containers.conf"
        conf.write_text(f'[containers]\nannotations = ["run.oci.hooks.stderr={said}"]\n')
        asked, env = dict(annotations), {"CONTAINERS_CONF": str(conf)}
    before = {w["name"] for w in g.workloads()}
    done = g.podman(*g.run_argv(asked, ("true",), parent=parent, detach=False), hooks=hooks, env=env)
    check(done.returncode != 0, f"podman run {annotations} succeeded: {last_lines(done.stdout, 3)}")
    check("error executing hook" in done.stderr, f"podman printed {last_lines(done.stderr, 3)!r}")
    check({w["name"] for w in g.workloads()} == before, "a refused container left a workload listed")
    hook_said = said.read_text() if said.exists() else ""
    return done.stderr.strip(), hook_said.strip()


def s_refusal(g: PodmanGuest) -> str:
    """A single-numa-node refusal, a parent without free CPUs, a bad annotation and an unreachable agent
    each fail `podman run`; the hook says why."""
    engine, said = _refused(g, {"numa-agent.io/cpus": "5", "numa-agent.io/policy": "single-numa-node"})
    check(re.search(r"numa-agent: container [0-9a-f]{12} refused: .*TopologyAffinityError", said),
          f"single-numa-node refusal: the hook said {said!r}")
    check("refused ctr-" in g.agent.log(), "the agent's log has no refusal line")
    _, parent_said = _refused(g, {"numa-agent.io/cpus": "1"}, parent=None)
    check("refused" in parent_said and PLAIN_PARENT in parent_said,
          f"refusal in a parent kept on the housekeeping CPUs does not name {PLAIN_PARENT}: {parent_said!r}")
    _, bad = _refused(g, {"numa-agent.io/memory": "12X"}, in_containers_conf=True)
    check("annotation numa-agent.io/memory='12X'" in bad and "(syntax: SIZE" in bad, f"bad annotation: {bad!r}")
    out = os.environ.get("NUMA_AGENT_VM_OUT")
    if out:  # what docs/containers.md shows of a refusal
        Path(out, "podman-refusal.txt").write_text(f"$ podman run ...\n{engine}\n\n{said}\n\n{parent_said}\n")
    absent = g.work / "hooks-absent"
    g.render_hooks(absent, str(g.work / "absent.sock"), env=["NUMA_AGENT_RETRY_SECONDS=1"])
    _, unreachable = _refused(g, {"numa-agent.io/cpus": "1"}, hooks=absent)
    check("cannot reach the agent" in unreachable and "fail closed" in unreachable, f"unreachable: {unreachable!r}")
    return f"podman printed: {last_lines(engine, 1)} | the hook said: {said.splitlines()[0]}"


def s_concurrent(g: PodmanGuest) -> str:
    """Twenty annotated containers started at once: no CPU booked twice; those that did not fit refused."""
    allocatable = len(g.shared_pool() - CpuSet.parse(HOUSEKEEPING))  # nothing booked yet
    with ThreadPoolExecutor(CONCURRENT) as pool:
        runs = list(pool.map(lambda i: g.podman(*g.run_argv({"numa-agent.io/cpus": "1"}, ("sleep", "600")),
                                                timeout=600), range(CONCURRENT)))
    started = [r.stdout.strip().splitlines()[-1] for r in runs if r.returncode == 0]
    g.containers += started
    refused = [r for r in runs if r.returncode != 0]
    check(all("error executing hook" in r.stderr for r in refused),
          f"a container failed otherwise: {[last_lines(r.stderr, 2) for r in refused if 'hook' not in r.stderr]}")
    booked: dict[str, CpuSet] = {}
    for cid in started:
        record = g.admitted(cid)
        booked[cid] = CpuSet.parse(record["cpus"])
        check(cpus_of(cgroup_dir(g.cgroup(cid)), "cpuset.cpus") == booked[cid], f"{cid[:12]}'s cgroup differs")
    union = CpuSet.union_of(booked.values())
    check(sum(len(c) for c in booked.values()) == len(union), f"a CPU booked twice: {booked}")
    check(len(started) == min(CONCURRENT, allocatable),
          f"{len(started)} started, {allocatable} CPUs were free for them")
    return f"{len(started)} admitted on {union.format()} (each its own CPU), {len(refused)} refused"


def s_restart(g: PodmanGuest) -> str:
    """The agent killed with SIGKILL while a container runs: the container keeps its CPUs; the restarted
    agent lists it and releases it when it exits."""
    cid = g.start({"numa-agent.io/cpus": "2"})
    cpus = CpuSet.parse(g.admitted(cid)["cpus"])
    pid = g.pid(cid)
    g.agent.kill()
    check(proc_allowed(pid)[0] == cpus, "the container lost its CPUs when the agent died")
    g.start_agent()
    status = g.status_cli()
    record = next((w for w in status["workloads"] if w["name"] == ctr_name(cid)), None)
    check(record is not None, f"the restarted agent does not report {ctr_name(cid)}: "
                              f"{[w['name'] for w in status['workloads']]}")
    check(CpuSet.parse(record["cpus"]) == cpus and record.get("engine_cgroup") == g.cgroup(cid),
          f"restarted agent reports {record}")
    check(proc_allowed(pid)[0] == cpus, "the container's CPUs changed across the agent's restart")
    other = g.start({"numa-agent.io/cpus": "2"})
    theirs = CpuSet.parse(g.admitted(other)["cpus"])
    check(not (cpus & theirs), f"after the restart a new container got {theirs.format()}, overlapping")
    os.kill(pid, signal.SIGKILL)
    check(wait_for(lambda: g.listed(ctr_name(cid)) is None, timeout=30, interval=0.05),
          f"{ctr_name(cid)} not released after its process exited (agent restarted)")
    return f"{ctr_name(cid)} kept {cpus.format()} across kill -9; reported and released by the new agent"


RUNNERS = {
    "podman-aligned": s_aligned,
    "podman-excluded": s_excluded,
    "podman-release": s_release,
    "podman-refusal": s_refusal,
    "podman-concurrent": s_concurrent,
    "podman-restart": s_restart,
}


def main(argv: list[str] | None = None) -> int:
    return guest_main(argv, RUNNERS, make_guest, prog="python -m tests.vm_e2e.podman_scenarios")


if __name__ == "__main__":
    sys.exit(main())
