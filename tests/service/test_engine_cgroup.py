"""Workloads enforced on an engine's own cgroup (a container's, a Slurm task's):
the agent writes that cgroup's cpuset and limits, books inside what its parent
grants, never moves its processes, releases when it empties, and survives a
restart. On the simulated hierarchy, whose top holds the agent's root and the
engine's cgroups side by side, as /sys/fs/cgroup does."""

import os
import subprocess

import pytest

from numa_agent.api.errors import BadRequest
from numa_agent.api.validation import parse_admit_request
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.service.refusals import InvalidInput, NoCapacity, NotPermitted
from numa_agent.service.requests import AdmitRequest
from tests.support.agent_process import wait_for
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

CONTAINER = "/libpod_parent/libpod-0123456789ab"


class Machine:
    """An agent on a simulated 2-node machine, and an engine beside it."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2)
        write_sysfs(topo, tmp_path / "machine")
        self.cfg = AgentConfig(sysfs_root=str(tmp_path / "machine"), state_dir=str(tmp_path / "state"),
                               socket=str(tmp_path / "agent.sock"), metrics_address=None, hotplug=False)
        self.procs: list[subprocess.Popen] = []
        self.agent = Agent(self.cfg).start()

    @property
    def service(self):
        return self.agent.service

    @property
    def top(self) -> CgroupV2:
        """The simulated hierarchy's top, through the agent's own emulator."""
        cg = self.service.enforcer.cgroup
        return CgroupV2(cg.mount, cg.files)

    def container(self, cgroup=CONTAINER, parent_cpus: str | None = None) -> subprocess.Popen:
        """What an engine does: its parent, the container's cgroup, a process in it."""
        top, parts = self.top, cgroup.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if not top.exists(rel):
                top.create(rel)
                if depth < len(parts):
                    top.enable_controllers(rel, ["cpuset", "memory"])
        if parent_cpus is not None:
            top.write_cpuset("/".join(parts[:-1]), CpuSet.parse(parent_cpus), [0, 1])
        proc = subprocess.Popen(["sleep", "60"])
        self.procs.append(proc)
        top.move_pid("/".join(parts), proc.pid)
        return proc

    def restart(self):
        self.agent.stop()
        self.agent = Agent(self.cfg).start()

    def close(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.agent.stop()


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


def root_caller(pid=None) -> Caller:
    return Caller(pid=pid or os.getpid(), uid=0, gid=0)


def engine_cpus(m: Machine, cgroup=CONTAINER) -> CpuSet:
    return m.top.read_effective(cgroup.strip("/"))[0]


def test_a_container_gets_its_cpus_on_its_own_cgroup_and_stays_there(machine):
    proc = machine.container()
    view = machine.service.admit(AdmitRequest(name="ctr-0123456789ab", cpus=4, cgroup=CONTAINER),
                                 root_caller())
    cpus = CpuSet.parse(view["cpus"])
    assert len(cpus) == 4 and engine_cpus(machine) == cpus
    assert machine.top.cgroup_of(proc.pid) == CONTAINER  # not moved into the agent's tree
    assert machine.top.cgroup_of(os.getpid()) != CONTAINER  # nor the hook (the caller) moved in
    pool = CpuSet.parse(machine.service.status()["shared_pool"])
    assert not pool & cpus
    listed = machine.service.list_workloads()[0]
    assert listed["engine_cgroup"] == CONTAINER


def test_only_root_names_a_cgroup(machine):
    machine.container()
    with pytest.raises(NotPermitted, match="only root"):
        machine.service.admit(AdmitRequest(name="c", cpus=2, cgroup=CONTAINER),
                              Caller(pid=os.getpid(), uid=1000, gid=1000))
    assert machine.service.state.workloads == ()


def test_the_booking_lies_inside_what_the_parent_grants(machine):
    machine.container(parent_cpus="8-11")
    view = machine.service.admit(AdmitRequest(name="c", cpus=2, cgroup=CONTAINER), root_caller())
    assert CpuSet.parse(view["cpus"]).issubset(CpuSet.parse("8-11"))


def test_a_parent_kept_off_the_agents_cpus_is_named_in_the_refusal(machine):
    reserved = CpuSet.parse(machine.service.status()["reserved_cpus"] or "0")
    machine.container(parent_cpus=reserved.format())
    with pytest.raises(NoCapacity, match="cgroup /libpod_parent"):
        machine.service.admit(AdmitRequest(name="c", cpus=2, cgroup=CONTAINER), root_caller())
    assert machine.service.state.workloads == ()


def test_exit_releases_and_a_gone_cgroup_is_not_made_again(machine):
    proc = machine.container()
    machine.service.admit(AdmitRequest(name="c", cpus=2, cgroup=CONTAINER), root_caller())
    proc.kill()
    proc.wait()
    machine.service.enforcer.cgroup.files.process_exited(proc.pid)
    assert wait_for(lambda: machine.service.state.workload("c") is None)
    machine.top.remove(CONTAINER.strip("/"))
    with pytest.raises(InvalidInput, match="does not exist"):
        machine.service.admit(AdmitRequest(name="c2", cpus=2, cgroup=CONTAINER), root_caller())
    assert not machine.top.exists(CONTAINER.strip("/"))


def test_a_release_hands_the_cgroup_back_with_its_process(machine):
    proc = machine.container()
    machine.service.admit(AdmitRequest(name="c", cpus=2, memory_bytes=64 << 20, cgroup=CONTAINER),
                          root_caller())
    assert machine.top.read_memory_max(CONTAINER.strip("/")) == 64 << 20
    machine.service.release("c", root_caller())
    rel = CONTAINER.strip("/")
    assert machine.top.cgroup_of(proc.pid) == CONTAINER
    assert engine_cpus(machine) == machine.top.read_effective("libpod_parent")[0]
    assert machine.top.read_memory_max(rel) == 64 << 20  # a limit is never loosened


def test_the_engines_own_tighter_limit_stays(machine):
    machine.container()
    rel = CONTAINER.strip("/")
    machine.top.write_memory_max(rel, 16 << 20)  # podman run --memory 16m
    machine.service.admit(AdmitRequest(name="c", cpus=2, memory_bytes=64 << 20, cgroup=CONTAINER),
                          root_caller())
    assert machine.top.read_memory_max(rel) == 16 << 20
    machine.service.release("c", root_caller())
    machine.service.admit(AdmitRequest(name="d", cpus=2, memory_bytes=8 << 20, cgroup=CONTAINER),
                          root_caller())
    assert machine.top.read_memory_max(rel) == 8 << 20


def test_in_place_takes_the_callers_own_cgroup_if_it_owns_everything_there(machine):
    proc = machine.container("/system.slice/slurmstepd.scope/job_7/step_0/task_0")
    me = Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid())
    view = machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True), me)
    assert machine.service.state.workload("slurm-7-0-0").cgroup == "/system.slice/slurmstepd.scope/job_7/step_0/task_0"
    assert engine_cpus(machine, "/system.slice/slurmstepd.scope/job_7/step_0/task_0") == CpuSet.parse(view["cpus"])
    other = machine.container("/system.slice/slurmstepd.scope/job_8/step_0/task_0")
    with pytest.raises(NotPermitted, match="holds pid"):
        machine.service.admit(AdmitRequest(name=f"slurm-8-0-0-u{os.getuid() + 1}", cpus=2, in_place=True),
                              Caller(pid=other.pid, uid=os.getuid() + 1, gid=0))


def test_in_place_outside_any_engine_cgroup_is_refused(machine):
    # The test process is not in the simulated hierarchy at all.
    with pytest.raises(InvalidInput, match="in_place"):
        machine.service.admit(AdmitRequest(name="x", cpus=2, in_place=True), root_caller())


def test_a_restarted_agent_keeps_the_booking_and_follows_the_cgroup(machine):
    proc = machine.container()
    cpus = CpuSet.parse(machine.service.admit(AdmitRequest(name="c", cpus=2, cgroup=CONTAINER),
                                              root_caller())["cpus"])
    machine.restart()
    w = machine.service.state.workload("c")
    assert w is not None and w.booking.cpus == cpus and w.cgroup == CONTAINER
    assert engine_cpus(machine) == cpus
    proc.kill()
    proc.wait()
    machine.service.enforcer.cgroup.files.process_exited(proc.pid)
    assert wait_for(lambda: machine.service.state.workload("c") is None)


def test_a_shared_container_follows_the_pool(machine):
    machine.container()
    machine.service.admit(AdmitRequest(name="s", memory_bytes=16 << 20, cgroup=CONTAINER), root_caller())
    before = engine_cpus(machine)
    other = machine.container("/libpod_parent/libpod-fedcba987654")
    taken = CpuSet.parse(machine.service.admit(
        AdmitRequest(name="x", cpus=2, cgroup="/libpod_parent/libpod-fedcba987654"), root_caller())["cpus"])
    assert other.poll() is None
    assert engine_cpus(machine) == before - taken


@pytest.mark.parametrize("body, message", [
    (b'{"cpus": 1, "cgroup": "libpod"}', "not an engine's cgroup"),
    (b'{"cpus": 1, "cgroup": "/top"}', "not an engine's cgroup"),
    (b'{"cpus": 1, "cgroup": "/a/../b"}', "not an engine's cgroup"),
    (b'{"cpus": 1, "cgroup": "/a/b", "in_place": true}', "exclude each other"),
])
def test_bad_cgroup_fields_are_refused_at_the_api(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_admit_request(body)


def test_a_lost_checkpoint_is_rebuilt_from_the_record_on_the_engines_cgroup(machine):
    proc = machine.container()
    machine.container("/libpod_parent/libpod-fedcba987654")  # a plain container: no record
    cpus = CpuSet.parse(machine.service.admit(AdmitRequest(name="c", cpus=2, memory_bytes=32 << 20,
                                                           cgroup=CONTAINER), root_caller())["cpus"])
    machine.agent.stop()
    for f in (machine.tmp / "state").glob("checkpoint*"):
        f.unlink()
    machine.agent = Agent(machine.cfg).start()
    w = machine.service.state.workload("c")
    assert w is not None and w.cgroup == CONTAINER and w.booking.cpus == cpus
    assert w.booking.memory_total("memory") == 32 << 20
    assert w.pid == proc.pid
    assert [x.name for x in machine.service.state.workloads] == ["c"]
    # Booked again, not twice: a new admission cannot take those CPUs.
    other = machine.service.admit(AdmitRequest(name="n", cpus=2), root_caller(proc.pid))
    assert not CpuSet.parse(other["cpus"]) & cpus


def test_a_replayed_admission_takes_a_remade_cgroup_over_again(machine):
    """A container restarted before its exit was seen: same id (request id), a fresh cgroup."""
    request = AdmitRequest(name="c", cpus=2, cgroup=CONTAINER, request_id="ab" * 32)
    proc = machine.container()
    cpus = CpuSet.parse(machine.service.admit(request, root_caller())["cpus"])
    # The engine removes and makes the cgroup again faster than the agent notices.
    machine.service.enforcer.watcher.unwatch(CONTAINER)
    rel = CONTAINER.strip("/")
    proc.kill()
    proc.wait()
    machine.service.enforcer.cgroup.files.process_exited(proc.pid)
    machine.top.remove(rel)
    machine.container()
    assert engine_cpus(machine) != cpus  # a new cgroup: nothing written yet
    again = machine.service.admit(request, root_caller())
    assert again["replayed"] and CpuSet.parse(again["cpus"]) == cpus
    assert engine_cpus(machine) == cpus
