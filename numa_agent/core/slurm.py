"""Slurm, as plain functions: the node line Slurm must be given, and what numa-run makes
of a Slurm task's environment and cgroup. Nothing here reads a file.

Slurm names CPUs by its own *abstract* ids (slurm.conf `CpuSpecList`, `scontrol show job
-d`): socket by socket, core by core within a socket, thread by thread within a core, as
slurmd's hwloc orders them (by their first CPU). The kernel numbers threads otherwise on
most x86 machines (CPU 0's sibling is CPU 16, not 1), so the agent's reserved CPUs are
converted, never copied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import owner_suffix
from numa_agent.core.pci import device_file
from numa_agent.core.topology import PciDevice, Topology

MIB = 1 << 20


class SlurmShapeError(ValueError):
    """The machine has no shape Slurm's NodeName line can describe (uneven cores)."""


@dataclass(frozen=True)
class SlurmNode:
    """What slurm.conf's NodeName line says of a machine, and Slurm's CPU numbering."""

    sockets: int
    cores_per_socket: int
    threads_per_core: int
    abstract: Mapping[int, int]  # kernel CPU id -> Slurm abstract CPU id

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    def abstract_ids(self, cpus: CpuSet) -> CpuSet:
        """Slurm's ids of these kernel CPUs (KeyError for one it does not count)."""
        return CpuSet(self.abstract[c] for c in cpus)

    def kernel_ids(self, abstract: CpuSet) -> CpuSet:
        back = {a: k for k, a in self.abstract.items()}
        return CpuSet(back[a] for a in abstract)

    def core_ids(self, cpus: CpuSet) -> CpuSet:
        """Slurm's logical core indexes (gres.conf `Cores=`) of the cores these kernel CPUs
        are on: the abstract CPU id's core, as hwloc's `Core L#` counts them (core 0 the
        first core of the first socket)."""
        return CpuSet(self.abstract[c] // self.threads_per_core for c in cpus)


def slurm_node(topology: Topology) -> SlurmNode:
    """Sockets, cores and threads of the online CPUs, and their abstract ids.
    SlurmShapeError when sockets differ in cores or cores in threads: Slurm's line has
    one number for each (slurmd would number such a machine inconsistently)."""
    online = topology.online_cpus
    by_socket: dict[int, list[CpuSet]] = {}
    for core in topology.cores:  # every online sibling group, by first CPU
        package = topology.cpu(core.min()).package
        by_socket.setdefault(-1 if package is None else package, []).append(core)
    if not online or not by_socket:
        raise SlurmShapeError("no online CPU")
    sockets = sorted(by_socket.values(), key=lambda cores: cores[0].min())
    cores_per_socket = {len(cores) for cores in sockets}
    threads_per_core = {len(core) for cores in sockets for core in cores}
    if len(cores_per_socket) > 1 or len(threads_per_core) > 1:
        raise SlurmShapeError(
            f"the online CPUs are not evenly shaped ({_span(cores_per_socket)} cores per socket, "
            f"{_span(threads_per_core)} threads per core): a NodeName line has one number for each")
    cores, threads = cores_per_socket.pop(), threads_per_core.pop()
    abstract = {}
    for s, socket_cores in enumerate(sockets):
        for c, core in enumerate(socket_cores):
            for t, cpu in enumerate(core.ids()):
                abstract[cpu] = (s * cores + c) * threads + t
    return SlurmNode(len(sockets), cores, threads, abstract)


def _span(values: set[int]) -> str:
    return f"{min(values)}-{max(values)}" if len(values) > 1 else str(min(values))


def node_line(name: str, topology: Topology, reserved_cpus: CpuSet, reserved_memory_bytes: int = 0,
              gres: Iterable[GresLine] = ()) -> str:
    """slurm.conf's NodeName line for this machine, with the agent's reserved CPUs as
    `CpuSpecList` (abstract ids; Slurm widens them to whole cores), its reserved memory
    as `MemSpecLimit` and, given gres.conf's lines, their counts as `Gres=`. RealMemory is
    the nodes' MemTotal in whole MiB, rounded down: slurmd drains a node configured with
    more than it finds."""
    node = slurm_node(topology)
    real_mib = sum(n.memory_total_bytes for n in topology.numa_nodes) // MIB
    fields = [f"NodeName={name}", f"CPUs={node.cpus}", "Boards=1", f"SocketsPerBoard={node.sockets}",
              f"CoresPerSocket={node.cores_per_socket}", f"ThreadsPerCore={node.threads_per_core}",
              f"RealMemory={real_mib}"]
    if reserved_cpus:
        fields.append(f"CpuSpecList={node.abstract_ids(reserved_cpus).format()}")
    if reserved_memory_bytes > 0:
        fields.append(f"MemSpecLimit={-(-reserved_memory_bytes // MIB)}")  # rounded up: never less
    gres = tuple(gres)
    if gres:
        fields.append(gres_field(gres))
    return " ".join(fields)


# ---------------------------------------------------------------- gres.conf
_GRES_NAME = re.compile(r"[a-z0-9][-a-z0-9_]*")


@dataclass(frozen=True)
class GresLine:
    """One line of gres.conf: a device file, or a count of devices without one, and the
    Slurm cores near them (empty: the device's NUMA node is unknown, so no Cores=)."""

    name: str
    file: str | None
    count: int
    cores: CpuSet

    def text(self, node_name: str) -> str:
        what = f"File={self.file}" if self.file else f"Count={self.count}"
        cores = f" Cores={self.cores.format()}" if self.cores else ""
        return f"NodeName={node_name} Name={self.name} {what}{cores}"


def gres_name(resource: str) -> str:
    """The GRES name of a [devices] resource: its name without the domain
    (`nvidia.com/gpu` -> `gpu`). SlurmShapeError for one Slurm's names cannot carry."""
    name = resource.rpartition("/")[2]
    if not _GRES_NAME.fullmatch(name):
        raise SlurmShapeError(f"device resource {resource!r}: {name!r} is no GRES name Slurm takes "
                              "(lowercase letters, digits, '-', '_'); rename it in [devices]")
    return name


def gres_lines(topology: Topology, resources: Iterable[tuple[str, Iterable[PciDevice]]]) -> list[GresLine]:
    """gres.conf's lines for the configured device resources (name, its devices), by
    resource then address: one `File=` line for each device with a device file
    (core.pci.device_file), `Cores=` the Slurm cores of its NUMA node; a resource whose
    devices have none is one `Count=` line, near the cores of all their nodes (none when
    one's node is unknown or they cover the machine). SlurmShapeError when Slurm could not
    take them: a resource whose devices have a file and some not (gres.conf gives File on
    all of a name's lines or none), a GPU without one (gres/gpu needs File), two resources
    of one GRES name."""
    node = slurm_node(topology)
    online = topology.online_cpus
    lines: list[GresLine] = []
    owner: dict[str, str] = {}
    for resource, devices in sorted(resources, key=lambda r: r[0]):
        devices = sorted(devices, key=lambda d: d.address)
        if not devices:
            continue
        name = gres_name(resource)
        if name in owner:
            raise SlurmShapeError(f"device resources {owner[name]!r} and {resource!r} would both be GRES "
                                  f"{name!r}; rename one in [devices]")
        owner[name] = resource
        files = {d.address: device_file(d) for d in devices}
        without = [a for a, f in files.items() if f is None]
        if without and (len(without) < len(devices) or name == "gpu"):
            why = ("gres.conf gives File= on all of a GRES's lines or on none" if len(without) < len(devices)
                   else "Slurm's gres/gpu needs File= for each")
            raise SlurmShapeError(f"device resource {resource!r}: {', '.join(without)} has no device file "
                                  f"(/dev/nvidiaN, /dev/nvmeN, /dev/dri/renderDN) and {why}")
        near = [node.core_ids(topology.node(d.numa_node).cpus & online) if d.numa_node in topology.node_ids
                else None for d in devices]
        if not without:
            lines += [GresLine(name, files[d.address], 1, cores or CpuSet()) for d, cores in zip(devices, near, strict=True)]
            continue
        # slurmd takes one line of a GRES without File= ("duplicate records" is fatal): the
        # count, near the cores of all of them, or any core when one's node is unknown.
        union = CpuSet() if None in near else CpuSet.union_of(c for c in near if c is not None)
        every = CpuSet(range(node.cpus // node.threads_per_core))
        lines.append(GresLine(name, None, len(devices), CpuSet() if union == every else union))
    return lines


def gres_field(lines: Iterable[GresLine]) -> str:
    """The NodeName line's `Gres=gpu:4,nic:2`: each GRES name's count, in order."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line.name] = counts.get(line.name, 0) + line.count
    return "Gres=" + ",".join(f"{name}:{n}" for name, n in counts.items())


def gres_types(lines: Iterable[GresLine]) -> str:
    """slurm.conf's `GresTypes=` naming them."""
    return "GresTypes=" + ",".join(dict.fromkeys(line.name for line in lines))


def widened_to_cores(topology: Topology, cpus: CpuSet) -> CpuSet:
    """`cpus` with every other online thread of their cores: what Slurm keeps for a
    CpuSpecList naming them."""
    return CpuSet.union_of(core for core in topology.cores if core & cpus) | cpus


def spec_note(topology: Topology, reserved_cpus: CpuSet) -> str | None:
    """What to say when the agent reserves part of a core: Slurm will keep the whole core
    from its jobs while the agent hands its other threads out (to anybody, Slurm's tasks
    included)."""
    whole = widened_to_cores(topology, reserved_cpus)
    if whole == reserved_cpus:
        return None
    return (f"Slurm keeps whole cores: CpuSpecList reserves the kernel's CPUs {whole.format()}, the agent "
            f"only {reserved_cpus.format()} (it hands out {(whole - reserved_cpus).format()}); reserve whole "
            f"cores in the agent too (cpu_manager.reserved_cpus = \"{whole.format()}\") so both keep the same")


# ---------------------------------------------------------------- a Slurm task
# slurm.h's special step ids, as SLURM_STEP_ID may carry them; the cgroup says them in words.
SPECIAL_STEPS = {"4294967290": "interactive", "4294967291": "batch", "4294967292": "extern",
                 "4294967293": "pending"}
_STEP_CGROUP = re.compile(r"/job_(\d+)/step_([a-z0-9]+)(/|$)")
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class SlurmTask:
    job: str
    step: str  # "0", "1"... or "batch", "extern", "interactive"
    procid: str

    def workload_name(self, uid: int) -> str:
        """`slurm-<job>-<step>-<procid>-u<uid>`: what `release --slurm-job` finds by its
        prefix. The uid (the job's user, whom the task runs as) makes it that user's: no
        other user can take the name first (core.names.engine_name_refusal), though
        Slurm's job ids are sequential and so the rest of it can be guessed."""
        return f"{job_prefix(self.job)}{self.step}-{self.procid}{owner_suffix(uid)}"

    @property
    def label(self) -> str:
        return f"Slurm step {self.job}.{self.step} task {self.procid}"


def job_prefix(job: str) -> str:
    """The name prefix of every workload of a Slurm job."""
    return f"slurm-{job}-"


def is_job_id(text: str) -> bool:
    return _NUMBER.fullmatch(text) is not None


def step_of_cgroup(cgroup: str, job: str) -> str | None:
    """The step a cgroup path (as /proc/PID/cgroup's `0::` line gives it) belongs to, when
    it lies inside Slurm's cgroup of that job: `.../job_12/step_0/user/task_1` -> "0"."""
    match = _STEP_CGROUP.search(cgroup)
    return match.group(2) if match and match.group(1) == job else None


def slurm_task(env: Mapping[str, str], cgroup: str = "") -> SlurmTask | None:
    """The Slurm task this process is, from srun's/slurmstepd's environment (None outside
    Slurm). The step is the cgroup's when Slurm tracks the task in one (it names batch and
    extern steps in words), else SLURM_STEP_ID's."""
    job = env.get("SLURM_JOB_ID", "").strip()
    if not is_job_id(job):
        return None
    step = step_of_cgroup(cgroup, job)
    if step is None:
        raw = (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "").strip()
        step = SPECIAL_STEPS.get(raw, raw) if _NUMBER.fullmatch(raw) else "batch"
    procid = (env.get("SLURM_PROCID") or "0").strip()
    return SlurmTask(job, step, procid if _NUMBER.fullmatch(procid) else "0")


SHARED_TASK_CGROUP = "task_special"  # Slurm 22.05's cgroup of a step's tasks on a node without per-task ones
_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def tasks_on_node(env: Mapping[str, str]) -> int | None:
    """How many tasks of this step run on this node: SLURM_STEP_TASKS_PER_NODE (`2(x3),1`:
    three nodes with 2, one with 1) at index SLURM_NODEID. None when Slurm does not say."""
    spec = (env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "").strip()
    node = (env.get("SLURM_NODEID") or "0").strip()
    if not spec or not _NUMBER.fullmatch(node):
        return None
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS_PER_NODE.fullmatch(item.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    index = int(node)
    return counts[index] if index < len(counts) else None


def shares_cgroup(cgroup: str, tasks_here: int | None) -> bool:
    """Slurm keeps this task in one cgroup with the step's other tasks on this node
    (22.05's `.../user/task_special`, under task/cgroup whatever JobAcctGatherType says,
    and without jobacct_gather/cgroup otherwise): a booking written on that cgroup would
    be every task's, so each task is pinned inside it instead. A lone task there
    (SLURM_STEP_TASKS_PER_NODE says 1) is booked on the cgroup itself."""
    return cgroup.rsplit("/", 1)[-1] == SHARED_TASK_CGROUP and (tasks_here is None or tasks_here > 1)


def shared_cgroup_refusal(task: SlurmTask, cgroup: str, tasks_here: int | None, cpus: int) -> str | None:
    """Why numa-run cannot book this task, which shares Slurm's cgroup with the step's
    other tasks (`shares_cgroup`): a task pinned there books whole CPUs of its own, and
    one asking for none (the shared pool) cannot be pinned apart from the others."""
    if not shares_cgroup(cgroup, tasks_here) or cpus > 0:
        return None
    tasks = f"{tasks_here} tasks" if tasks_here else "tasks"
    return (f"{task.label}: Slurm keeps this step's {tasks} on this node in one cgroup ({cgroup}); each is "
            "pinned inside it on CPUs of its own: ask for them with --cpus N (or run one task per node)")


@dataclass(frozen=True)
class Confinement:
    """Which case applies to a numa-run inside Slurm."""

    task: SlurmTask
    in_place: bool  # Slurm tracks the task in a cgroup: book on it, do not leave it
    cpus: CpuSet  # what Slurm lets the task use (the cgroup's effective CPUs, or its affinity)
    mems: CpuSet  # memory nodes, likewise (empty: not known)
    confined: bool  # Slurm narrowed the CPUs below the machine's online CPUs
    granted: CpuSet  # what the agent books within: the cgroup's effective CPUs in place, else all
    cgroup: str = ""  # the task's cgroup, as /proc/self/cgroup names it
    cgroup_confined: bool = False  # Slurm's cgroup holds fewer than every online CPU (task/cgroup)

    @property
    def bound_narrower(self) -> bool:
        """task/affinity bound the task to fewer CPUs than the agent would book within."""
        return self.cpus != self.granted

    def line(self, booked_cpus: str = "", booked_mems: str = "") -> str:
        """numa-run's one line saying which case applied."""
        booked = f" (CPUs {booked_cpus}, memory node{_plural(booked_mems)} {booked_mems})" if booked_cpus else ""
        if not self.confined:
            how = "in its cgroup" if self.in_place else "without a cgroup of the step"
            return (f"{self.task.label}: Slurm did not confine the step (CPUs {self.cpus.format()}): "
                    f"booked from the agent's pool{booked}, {how}")
        where = f"CPUs {self.cpus.format()}"
        if self.mems:
            where += f", memory node{_plural(self.mems.format())} {self.mems.format()}"
        return f"{self.task.label}: confined by Slurm to {where}; booked inside them{booked}"


def task_refusal(case: Confinement, cpus: int, physcpubind: CpuSet | None = None) -> str | None:
    """Why numa-run refuses a task Slurm confined before asking the agent: it asks for
    more CPUs than Slurm gave it (--cpus), or names CPUs outside them (-C). The agent
    would refuse both as well; this says it in Slurm's terms, in one line."""
    if not case.confined:
        return None
    gave = f"Slurm gave this task CPUs {case.cpus.format() or 'none'} ({len(case.cpus)})"
    if physcpubind is not None and not physcpubind.issubset(case.cpus):
        return f"{gave}, -C {physcpubind.format()} asked"
    if cpus > len(case.cpus):
        return f"{gave}, --cpus {cpus} asked"
    return None


def _plural(nodes: str) -> str:
    return "s" if ("," in nodes or "-" in nodes) else ""


def confinement(task: SlurmTask, cgroup: str, *, online: CpuSet, cgroup_cpus: CpuSet | None,
                cgroup_mems: CpuSet | None, affinity: CpuSet) -> Confinement:
    """The case of a numa-run inside Slurm: in place when the task's cgroup is in Slurm's
    job/step tree (task/cgroup, or proctrack/cgroup alone), confined when what the task may
    use (the cgroup's effective CPUs, narrowed by task/affinity's binding) is less than every
    online CPU."""
    in_place = step_of_cgroup(cgroup, task.job) is not None
    granted = cgroup_cpus if in_place and cgroup_cpus else online
    cpus = granted & affinity if affinity else granted
    mems = (cgroup_mems or CpuSet()) if in_place else CpuSet()
    return Confinement(task, in_place, cpus, mems, confined=bool(online - cpus), granted=granted,
                       cgroup=cgroup, cgroup_confined=in_place and bool(online - granted))
