"""The containerd scenarios (shape `containerd`), run INSIDE the guest by scripts/vm-e2e:

    .venv/bin/python -m tests.vm_e2e.containerd_scenarios --shape containerd

containerd 1.7.24 (Debian trixie's, unpacked by scripts/fetch-containerd under
.cache/vm/containerd with bookworm's runc) runs with NRI enabled, its root on a tmpfs, the
overlayfs snapshotter, cgroupfs, and one image imported from a tar built here from the
static busybox (also the pause image). The agent is the standard one with `[nri] enabled`:
it registers as an NRI plugin and answers the runtime's CreateContainer with the
container's CPUs and memory nodes, which the runtime writes into the container's cgroup.
The scenarios drive CRI as the kubelet does (tests/vm_e2e/cri/client.py) and read each
outcome from inside the container (`/proc/self/status` through ExecSync), from the
kernel's topology in sysfs and from `numa-agent status --json`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from numa_agent.core.cpuset import CpuSet
from tests.support.agent_process import wait_for
from tests.vm_e2e.cri.client import Cri, Pod, rpc_error
from tests.vm_e2e.scenarios import (
    AGENT_CONFIG,
    CGROUP_MOUNT,
    Guest,
    Kernel,
    ScenarioFailed,
    bring_loopback_up,
    check,
    guest_main,
    last_lines,
    parse_allowed,
)

REPO = Path(__file__).resolve().parents[2]
CONTAINERD_DIR = Path(os.environ.get("NUMA_AGENT_VM_CACHE", REPO / ".cache" / "vm")) / "containerd"
CONTAINERD_ROOT = Path("/var/lib/containerd")  # a tmpfs: an overlay upper cannot sit on the guest's overlay root
CONTAINERD_STATE = Path("/run/containerd")
CONTAINERD_SOCKET = CONTAINERD_STATE / "containerd.sock"
NRI_SOCKET = "/var/run/nri/nri.sock"
IMAGE = "localhost/numa-busybox:test"
# containerd's log line when a plugin has connected (logfmt quotes the message: `msg="plugin
# \"10-numa-agent\" connected"`).
PLUGIN_CONNECTED = re.compile(r'plugin \\?"[\w.-]+\\?" connected')
BUSYBOX_TOOLS = ("sh", "cat", "grep", "sleep", "true", "echo")
# A container's command: trap TERM (as PID 1 it would ignore it, and StopContainer would wait
# out its grace period), then sleep.
HOLD = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
READ_ALLOWED = ["grep", "-E", "^(Cpus|Mems)_allowed_list", "/proc/self/status"]
HOUSEKEEPING = "0-1"
MEMORY = 64 << 20
RUNTIME_READY_TIMEOUT = 180.0  # containerd took 9-18 s to answer CRI in this guest
PLUGIN_TIMEOUT = 120.0  # the agent's NRI adapter connecting and registering
# The runtime gives each plugin call 2 s by default, and the plugin 5 s to register; under
# emulation everything is ~30 times slower, so both are raised here (and only here).
PLUGIN_REQUEST_TIMEOUT = "20s"
PLUGIN_REGISTRATION_TIMEOUT = "60s"
CONTAINERD_AGENT_CONFIG = AGENT_CONFIG + f"""
[agent]
on_policy_change = "reconcile"

[cpu_manager]
policy = "static"
reserved_cpus = "{HOUSEKEEPING}"

[nri]
enabled = true
socket = "{NRI_SOCKET}"
"""
SINGLE_NUMA_CONFIG = CONTAINERD_AGENT_CONFIG + """
[topology_manager]
policy = "single-numa-node"
"""


def containerd_config(runc: Path) -> str:
    """containerd's configuration: CRI on cgroupfs with runc, NRI enabled, no CNI needed."""
    return f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{CONTAINERD_STATE}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{NRI_SOCKET}"
  plugin_request_timeout = "{PLUGIN_REQUEST_TIMEOUT}"
  plugin_registration_timeout = "{PLUGIN_REGISTRATION_TIMEOUT}"
"""


def image_archive(busybox: Path, tag: str = IMAGE, command: list[str] = HOLD) -> bytes:
    """A one-layer image in docker-archive form (what `docker save` writes and `ctr images import`
    reads): the static busybox and its applet links, `command` as its Cmd."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for directory in ("bin", "dev", "proc", "sys", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for tool in BUSYBOX_TOOLS:
            info = tarfile.TarInfo(f"bin/{tool}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(info)
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": command, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "tests/vm_e2e/containerd_scenarios.py: static busybox"}],
    }, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in ((f"{diff_id}/layer.tar", layer_bytes), (config_name, config),
                           ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


class Containerd:
    """containerd as a child process, its log in the work directory."""

    def __init__(self, work: Path, unpacked: Path = CONTAINERD_DIR) -> None:
        self.bindir = unpacked / "usr" / "bin"
        self.runc = unpacked / "usr" / "sbin" / "runc"
        self.config = work / "containerd.toml"
        self.log_path = work / "containerd.log"
        self.proc: subprocess.Popen | None = None
        self.env = {**os.environ, "PATH": f"{self.bindir}:{unpacked / 'usr' / 'sbin'}:{os.environ.get('PATH', '')}"}

    def prepare(self) -> None:
        for binary in (self.bindir / "containerd", self.bindir / "containerd-shim-runc-v2", self.bindir / "ctr",
                       self.runc):
            check(binary.exists(), f"{binary} is missing: run scripts/fetch-containerd on the host first")
        CONTAINERD_ROOT.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0711", "tmpfs", str(CONTAINERD_ROOT)],
                              capture_output=True, text=True, timeout=60)
        check(done.returncode == 0, f"mounting a tmpfs on {CONTAINERD_ROOT}: {last_lines(done.stderr, 2)}")
        self.config.write_text(containerd_config(self.runc))

    def start(self) -> float:
        """Start it and wait until CRI answers; returns the seconds that took."""
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(self.bindir / "containerd"), "--config", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env)

        def answers() -> bool:
            check(self.proc is not None and self.proc.poll() is None,
                  f"containerd exited {self.proc.returncode if self.proc else '?'}: {last_lines(self.log(), 6)}")
            cri = Cri(str(CONTAINERD_SOCKET), timeout=10)
            try:
                cri.version()
                return True
            except grpc.RpcError:
                return False
            finally:
                cri.close()
        check(wait_for(answers, timeout=RUNTIME_READY_TIMEOUT, interval=0.5),
              f"containerd did not answer CRI within {RUNTIME_READY_TIMEOUT:g} s: {last_lines(self.log(), 6)}")
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL: the runtime crashes; its shims and containers live on."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bindir / "ctr"), "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, env=self.env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def plugin_connections(self) -> int:
        """How often a plugin connected: containerd logs `plugin "NN-name" connected` each time."""
        return len(PLUGIN_CONNECTED.findall(self.log()))


@dataclass
class Started:
    pod: Pod
    sandbox: str
    container: str


def _uid() -> str:
    return str(uuid.uuid4())


class ContainerdGuest(Guest):
    """The standard agent with NRI enabled (reserved CPUs = housekeeping), containerd, an image."""

    def __init__(self, shape: str, work: Path, kernel: Kernel) -> None:
        super().__init__(shape, work, kernel)
        (work / "agent" / "config.toml").write_text(CONTAINERD_AGENT_CONFIG)  # the file AgentProcess names
        self.containerd = Containerd(work)
        self.cri = Cri(str(CONTAINERD_SOCKET))
        self.sandboxes: list[str] = []
        self.logs = work / "pod-logs"
        self.timings: dict[str, float] = {}

    # -- set-up
    def set_up(self) -> None:
        self.containerd.prepare()
        self.timings["containerd ready"] = self.containerd.start()
        started = time.monotonic()
        tar = self.work / "image.tar"
        tar.write_bytes(image_archive(Path("/bin/busybox")))
        done = self.containerd.ctr("images", "import", "--snapshotter", "overlayfs", str(tar))
        check(done.returncode == 0, f"ctr images import: {last_lines(done.stderr or done.stdout, 4)}")
        self.timings["image import"] = time.monotonic() - started
        self.logs.mkdir(exist_ok=True)

    def start_agent(self) -> None:
        """Start the agent, then wait until containerd says its plugin connected."""
        before = self.containerd.plugin_connections()
        super().start_agent()
        self.wait_plugin(before, "the agent started")

    def wait_plugin(self, before: int, when: str) -> None:
        started = time.monotonic()
        connected = wait_for(lambda: self.containerd.plugin_connections() > before, timeout=PLUGIN_TIMEOUT,
                             interval=0.2)
        check(connected, f"{when}: the agent's NRI plugin did not connect to containerd within {PLUGIN_TIMEOUT:g} s; "
                         f"containerd: {last_lines(self.containerd.log(), 3)}; agent: {last_lines(self.agent.log(), 4)}")
        self.timings[f"plugin connected ({when})"] = time.monotonic() - started

    def ensure_agent(self) -> None:
        if not self.containerd.running():
            before = self.containerd.plugin_connections()
            self.containerd.start()
            if self.agent.proc is not None and self.agent.proc.poll() is None and self.variant is None:
                self.wait_plugin(before, "containerd started again")
        super().ensure_agent()

    # -- pods, as the kubelet runs them
    def run(self, name: str, cpus: int = 0, memory: int = 0) -> Started:
        """A pod of one container, running; returns its ids."""
        pod = Pod(name=name, uid=_uid(), cpus=cpus, memory=memory)
        try:
            sandbox = self.cri.run_pod(pod, str(self.logs))
        except grpc.RpcError as exc:
            raise ScenarioFailed(f"RunPodSandbox {name}: {rpc_error(exc)}") from None
        self.sandboxes.append(sandbox)
        try:
            container = self.cri.create_container(sandbox, pod, IMAGE, HOLD, str(self.logs))
            self.cri.start_container(container)
        except grpc.RpcError as exc:
            raise ScenarioFailed(f"pod {name}: CreateContainer/StartContainer: {rpc_error(exc)}") from None
        return Started(pod, sandbox, container)

    def inside(self, started: Started) -> tuple[CpuSet, CpuSet]:
        """(Cpus_allowed_list, Mems_allowed_list) as a process in the container reads them."""
        try:
            done = self.cri.exec_sync(started.container, READ_ALLOWED)
        except grpc.RpcError as exc:
            raise ScenarioFailed(f"ExecSync in {started.pod.name}: {rpc_error(exc)}") from None
        check(done.exit_code == 0, f"ExecSync in {started.pod.name} exited {done.exit_code}: {done.stderr.strip()}")
        return parse_allowed(done.stdout)

    def cgroup_of(self, started: Started) -> Path:
        """The container's cgroup, from its first process's /proc/PID/cgroup."""
        pid = self.cri.container_pid(started.container)
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return CGROUP_MOUNT / line[3:].lstrip("/")
        raise ScenarioFailed(f"{started.pod.name}: no cgroup v2 line for pid {pid}")

    def records(self, started: Started, status: dict | None = None) -> list[dict]:
        """The agent's records of the container in `status` (GET /v1/status, which `numa-agent
        status --json` prints; asked here when not given): none or one."""
        status = status if status is not None else self.status()
        return [w for w in status["workloads"] if (w.get("runtime") or {}).get("container_id") == started.container]

    def record(self, started: Started) -> dict:
        found = wait_for(lambda: self.records(started), timeout=30, interval=0.5)
        check(found, f"{started.pod.name}: the agent does not list container {started.container[:12]}: "
                     f"{[w['name'] for w in self.workloads()]}")
        check(len(found) == 1, f"{started.pod.name}: the agent lists container {started.container[:12]} "
                               f"{len(found)} times: {found}")
        return found[0]

    def remove(self, started: Started) -> None:
        self.cri.stop_pod(started.sandbox)
        self.cri.remove_pod(started.sandbox)
        self.sandboxes.remove(started.sandbox)

    def cleanup(self) -> str:
        """Every pod the scenario ran stopped and removed (at once: each takes seconds here),
        then the agent must list nothing."""
        problems: list[str] = []

        def remove(sandbox: str) -> None:
            try:
                self.cri.stop_pod(sandbox)
                self.cri.remove_pod(sandbox)
            except grpc.RpcError as exc:
                problems.append(f"removing pod {sandbox[:12]}: {rpc_error(exc)}")
        if self.containerd.running() and self.sandboxes:
            with ThreadPoolExecutor(len(self.sandboxes)) as pool:
                list(pool.map(remove, self.sandboxes))
        self.sandboxes.clear()
        out = os.environ.get("NUMA_AGENT_VM_OUT")
        if out:
            Path(out, f"containerd-{self.shape}.log").write_text(self.containerd.log())
        return "; ".join([*problems, super().cleanup()]).strip("; ")


def make_guest(shape: str, work: Path) -> ContainerdGuest:
    bring_loopback_up()
    guest = ContainerdGuest(shape, work, Kernel.read())
    guest.set_up()
    print(f"containerd guest: {', '.join(f'{k} {v:.1f} s' for k, v in guest.timings.items())}", flush=True)
    return guest


# ---------------------------------------------------------------- checks
def check_whole_core(g: ContainerdGuest, started: Started, cpus_wanted: int) -> tuple[CpuSet, CpuSet]:
    """The container reads `cpus_wanted` exclusive CPUs in whole cores and their node; the agent
    books the same and the container's cgroup holds them. Returns (cpus, mems)."""
    cpus, mems = g.inside(started)
    name = started.pod.name
    nodes = g.kernel.nodes_of(cpus)
    check(len(cpus) == cpus_wanted, f"{name} reads Cpus_allowed_list {cpus.format()}, wanted {cpus_wanted} CPUs")
    check(g.kernel.whole_cores(cpus), f"{name}'s CPUs {cpus.format()} are not whole cores "
                                      f"(siblings {[g.kernel.siblings[c].format() for c in cpus.ids()]})")
    check(len(nodes) == 1 and mems == CpuSet(nodes),
          f"{name}: CPUs {cpus.format()} on nodes {nodes}, Mems_allowed_list {mems.format()}")
    record = g.record(started)
    check(CpuSet.parse(record["cpus"]) == cpus and record.get("exclusive", True),
          f"{name}: the agent books {record['cpus']} (exclusive {record.get('exclusive')}), the container "
          f"reads {cpus.format()}")
    cgroup = g.cgroup_of(started)
    check(CpuSet.parse((cgroup / "cpuset.cpus").read_text().strip()) == cpus,
          f"{name}: {cgroup}/cpuset.cpus is {(cgroup / 'cpuset.cpus').read_text().strip()!r}")
    check(str(cgroup).startswith(str(CGROUP_MOUNT / started.pod.cgroup_parent.lstrip("/"))),
          f"{name}'s cgroup {cgroup} is not below its pod's parent {started.pod.cgroup_parent}")
    return cpus, mems


def check_shared(g: ContainerdGuest, started: Started, exclusive: CpuSet) -> CpuSet:
    """The BestEffort container runs on the agent's shared pool, none of `exclusive`."""
    def settled():
        cpus, _ = g.inside(started)
        return cpus if cpus == g.shared_pool() else None
    cpus = wait_for(settled, timeout=30, interval=1.0) or g.inside(started)[0]
    check(not (cpus & exclusive), f"{started.pod.name} (BestEffort) reads {cpus.format()}, which holds exclusive "
                                  f"CPUs {(cpus & exclusive).format()}")
    check(cpus == g.shared_pool(), f"{started.pod.name} (BestEffort) reads {cpus.format()}, the shared pool is "
                                   f"{g.shared_pool().format()}")
    return cpus


def booked_once(status: dict) -> dict[str, CpuSet]:
    """Every exclusive booking's CPUs by name; fails when a CPU is booked twice."""
    booked = {w["name"]: CpuSet.parse(w["cpus"]) for w in status["workloads"] if w.get("exclusive")}
    union = CpuSet.union_of(booked.values())
    check(sum(len(c) for c in booked.values()) == len(union), f"a CPU is booked twice: "
                                                              f"{ {n: c.format() for n, c in booked.items()} }")
    return booked


# ---------------------------------------------------------------- scenarios
def s_guaranteed(g: ContainerdGuest) -> str:
    """A Guaranteed 2-CPU container gets one whole core and that core's memory node."""
    a = g.run("guaranteed", cpus=2, memory=MEMORY)
    cpus, mems = check_whole_core(g, a, 2)
    records = g.records(a, g.status_cli())  # the operator's view
    check(len(records) == 1, f"numa-agent status --json lists the container {len(records)} times")
    record = records[0]
    runtime = record.get("runtime") or {}
    check(runtime.get("pod") == "guaranteed" and runtime.get("container") == "main"
          and runtime.get("pod_uid") == a.pod.uid and runtime.get("sandbox_id") == a.sandbox,
          f"the agent names the container {runtime}")
    return f"{record['name']}: {cpus.format()} (one core) on node {mems.format()}, read inside the container"


def s_besteffort(g: ContainerdGuest) -> str:
    """A BestEffort container runs on the shared pool, without the Guaranteed container's CPUs."""
    a = g.run("exclusive", cpus=2, memory=MEMORY)
    mine, _ = check_whole_core(g, a, 2)
    b = g.run("besteffort")
    shared = check_shared(g, b, mine)
    return f"Guaranteed {mine.format()}; BestEffort reads {shared.format()} (the shared pool)"


def s_second(g: ContainerdGuest) -> str:
    """A second Guaranteed container gets another core; a BestEffort one follows the pool."""
    a = g.run("first", cpus=2, memory=MEMORY)
    first, _ = check_whole_core(g, a, 2)
    b = g.run("shared")
    check_shared(g, b, first)
    c = g.run("second", cpus=2, memory=MEMORY)
    second, _ = check_whole_core(g, c, 2)
    check(not (first & second), f"two Guaranteed containers share CPUs {(first & second).format()}")
    shared = check_shared(g, b, first | second)
    return f"{first.format()} and {second.format()}; the running BestEffort container now reads {shared.format()}"


def s_resize(g: ContainerdGuest) -> str:
    """UpdateContainerResources to 4 CPUs (the kubelet's in-place resize) grows the container in place."""
    a = g.run("resize", cpus=2, memory=MEMORY)
    before, _ = check_whole_core(g, a, 2)
    try:
        g.cri.update_resources(a.container, 4, MEMORY)
    except grpc.RpcError as exc:
        raise ScenarioFailed(f"UpdateContainerResources to 4 CPUs: {rpc_error(exc)}") from None
    after = wait_for(lambda: (lambda c: c if len(c) == 4 else None)(g.inside(a)[0]), timeout=30, interval=1.0)
    check(after, f"after UpdateContainerResources to 4 CPUs the container reads {g.inside(a)[0].format()}")
    check(before.issubset(after), f"resized from {before.format()} to {after.format()}: it lost CPUs")
    check(g.kernel.whole_cores(after), f"resized to {after.format()}, not whole cores")
    record = g.record(a)
    check(CpuSet.parse(record["cpus"]) == after, f"the agent books {record['cpus']}, the container reads "
                                                 f"{after.format()}")
    mems = g.inside(a)[1]
    return f"{before.format()} -> {after.format()} in place (memory nodes {mems.format()})"


def s_single_numa(g: ContainerdGuest) -> str:
    """Under single-numa-node a container that fits no node fails CreateContainer, naming the reason."""
    g.restart_agent("single-numa", config=SINGLE_NUMA_CONFIG)
    biggest = max(len(c) for c in g.kernel.node_cpus.values())
    pod = Pod(name="too-big", uid=_uid(), cpus=biggest + 2, memory=MEMORY)
    sandbox = g.cri.run_pod(pod, str(g.logs))
    g.sandboxes.append(sandbox)
    try:
        container = g.cri.create_container(sandbox, pod, IMAGE, HOLD, str(g.logs))
    except grpc.RpcError as exc:
        said = rpc_error(exc)
    else:
        raise ScenarioFailed(f"CreateContainer of {pod.cpus} CPUs under single-numa-node succeeded ({container[:12]})")
    check("TopologyAffinityError" in said, f"CreateContainer failed without naming TopologyAffinityError: {said}")
    listed = [w["name"] for w in g.workloads() if w.get("exclusive")]
    check(not listed, f"a refused container left bookings: {listed}")
    out = os.environ.get("NUMA_AGENT_VM_OUT")
    if out:  # what docs/kubernetes.md can show of a refusal
        Path(out, "containerd-refusal.txt").write_text(said + "\n")
    return f"{pod.cpus} CPUs refused: {said}"


def s_release(g: ContainerdGuest) -> str:
    """Stopping and removing a container releases its CPUs; removing the pod leaves nothing booked."""
    a = g.run("release", cpus=2, memory=MEMORY)
    cpus, _ = check_whole_core(g, a, 2)
    try:
        g.cri.stop_container(a.container)
        g.cri.remove_container(a.container)
    except grpc.RpcError as exc:
        raise ScenarioFailed(f"StopContainer/RemoveContainer: {rpc_error(exc)}") from None
    check(wait_for(lambda: not g.records(a), timeout=30, interval=0.5),
          f"the agent still lists the removed container: {g.records(a)}")
    check(wait_for(lambda: cpus.issubset(g.shared_pool()), timeout=30, interval=0.5),
          f"CPUs {cpus.format()} not back in the shared pool {g.shared_pool().format()}")
    g.remove(a)
    left = [w for w in g.status_cli()["workloads"] if (w.get("runtime") or {}).get("sandbox_id") == a.sandbox]
    check(not left, f"the removed pod still holds {left}")
    return f"{cpus.format()} back in the shared pool {g.shared_pool().format()}"


def s_runtime_restart(g: ContainerdGuest) -> str:
    """containerd killed and started again: the plugin reconnects, the container keeps its CPUs and
    its booking, and a new container is pinned apart from it."""
    a = g.run("before", cpus=2, memory=MEMORY)
    cpus, _ = check_whole_core(g, a, 2)
    before = g.containerd.plugin_connections()
    g.containerd.kill()
    g.containerd.start()
    g.wait_plugin(before, "containerd restarted")
    check(g.inside(a)[0] == cpus, f"after containerd's restart the container reads {g.inside(a)[0].format()}")
    record = g.record(a)
    check(CpuSet.parse(record["cpus"]) == cpus, f"after containerd's restart the agent books {record['cpus']}")
    b = g.run("after", cpus=2, memory=MEMORY)
    theirs, _ = check_whole_core(g, b, 2)
    check(not (cpus & theirs), f"a container made after the restart got {theirs.format()}, overlapping")
    booked_once(g.status())
    took = g.timings.get("plugin connected (containerd restarted)", 0.0)
    return f"kept {cpus.format()}; plugin back {took:.1f} s after containerd; new container {theirs.format()}"


def s_agent_restart(g: ContainerdGuest) -> str:
    """The agent killed with -9 and started again: Synchronize rebuilds, nothing is booked twice."""
    a = g.run("kept-a", cpus=2, memory=MEMORY)
    b = g.run("kept-b", cpus=2, memory=MEMORY)
    first, _ = check_whole_core(g, a, 2)
    second, _ = check_whole_core(g, b, 2)
    before = booked_once(g.status())
    g.agent.kill()
    g.start_agent()  # waits for the plugin to connect again
    status = g.status_cli()
    after = booked_once(status)
    check(after == before, f"bookings after the restart {({n: c.format() for n, c in after.items()})} differ from "
                           f"before {({n: c.format() for n, c in before.items()})}")
    for started, cpus in ((a, first), (b, second)):
        check(len(g.records(started, status)) == 1, f"{started.pod.name} is listed "
                                                    f"{len(g.records(started, status))} times after the restart")
        check(g.inside(started)[0] == cpus, f"{started.pod.name} reads {g.inside(started)[0].format()} after the "
                                            f"restart, booked {cpus.format()}")
    c = g.run("new", cpus=2, memory=MEMORY)
    third, _ = check_whole_core(g, c, 2)
    check(not (third & (first | second)), f"a container made after the restart got {third.format()}, overlapping")
    booked_once(g.status())
    return f"{first.format()} and {second.format()} kept, each booked once; new container {third.format()}"


RUNNERS = {
    "containerd-guaranteed": s_guaranteed,
    "containerd-besteffort": s_besteffort,
    "containerd-second": s_second,
    "containerd-resize": s_resize,
    "containerd-single-numa": s_single_numa,
    "containerd-release": s_release,
    "containerd-runtime-restart": s_runtime_restart,
    "containerd-agent-restart": s_agent_restart,
}


def main(argv: list[str] | None = None) -> int:
    return guest_main(argv, RUNNERS, make_guest, prog="python -m tests.vm_e2e.containerd_scenarios")


if __name__ == "__main__":
    sys.exit(main())
