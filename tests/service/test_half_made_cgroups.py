"""Start-up gets past any half-made cgroup (issue 36, defect 8).

The agent dies at each point of making, writing or removing a workload's
cgroup (a `Crash` raised from inside the cgroup driver or the simulated tree:
nothing below it rolls back, as nothing would after a kill), or a tree is left
as such a death leaves it; a new agent on the same state directory and tree
then starts, restores what the checkpoint says, removes what was half made for
nobody, and admits again. Every workload that was whole comes back untouched."""

from __future__ import annotations

import os

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement import simulated_cgroupfs
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.record import RECORD_XATTR
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root
from numa_agent.service.requests import AdmitRequest
from tests.service.test_agent_service import make_machine
from tests.service.test_checkpoint_failures import on_disk
from tests.support.simulated_service import cg_file, start

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
ROOT = Caller(pid=os.getpid(), uid=0, gid=0)


class Crash(BaseException):
    """The agent dies here: not an error anything handles."""


@pytest.fixture
def env(tmp_path, sleepers):
    machine = make_machine()
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    service, _ = start(machine, tmp_path / "state", cg_root)
    kept = service.admit(AdmitRequest(name="kept", cpus=2), sleepers())  # whole, populated
    yield machine, tmp_path / "state", cg_root, service, kept
    service.enforcer.close()


def crash_at(monkeypatch, owner, name, after=0, before=False, when=lambda *a: True):
    """Make `owner.name` kill the agent: before its call, or after its
    `after`+1-th call that `when` accepts."""
    real = getattr(owner, name)
    calls = []

    def dying(*args, **kwargs):
        hit = when(*args)
        if hit and before:
            raise Crash(name)
        out = real(*args, **kwargs)
        if hit:
            calls.append(args)
            if len(calls) > after:
                raise Crash(name)
        return out
    monkeypatch.setattr(owner, name, dying)


def restart_and_check(machine, state_dir, cg_root, kept, sleepers, gone=("wl-web",)):
    """A new agent starts on the tree; `kept` is restored as it was; each of
    `gone` is removed; `web` can be admitted again (its cgroup whole)."""
    service, report = start(machine, state_dir, cg_root)
    names = [w.name for w in service.state.workloads]
    assert names == ["kept"], (names, report)
    assert cg_file(cg_root, "wl-kept", "cpuset.cpus") == kept["cpus"]
    for rel in gone:
        assert not (cg_root / rel).exists(), rel
    admitted = service.admit(AdmitRequest(name="web", cpus=2), sleepers())
    assert cg_file(cg_root, "wl-web", "cpuset.cpus") == admitted["cpus"]
    assert [w["name"] for w in on_disk(state_dir)["workloads"]] == ["kept", "web"]
    service.enforcer.close()


def _dir_named(name):
    return lambda path, *rest: os.path.basename(os.fspath(path)) == name


def _file_of(cgroup, file):
    return lambda path, *rest: path.parent.name == cgroup and path.name == file


# ---- the agent dies while making `web` (the checkpoint already holds it) -------------------
CREATE_POINTS = {
    # simulated tree: the directory made, none of its files
    "mkdir, no file": ("tree", "mkdir", dict(before=False, when=_dir_named("wl-web")), "after_os_mkdir"),
    # simulated tree: its core files, none of the controllers'
    "core files only": ("tree", "_write_controller_files", dict(before=True, when=_dir_named("wl-web")), None),
    "made, nothing written": ("driver", "create", dict(when=lambda rel, *a: rel == "wl-web"), None),
    "memory.max only": ("driver", "write_memory_max", dict(when=lambda rel, *a: rel == "wl-web"), None),
    "cpuset.mems, not cpus": ("tree", "write", dict(when=_file_of("wl-web", "cpuset.mems")), None),
    "cpuset.cpus, no record": ("tree", "write", dict(when=_file_of("wl-web", "cpuset.cpus")), None),
    "record, no process": ("driver", "write_xattr", dict(when=lambda rel, *a: rel == "wl-web"), None),
    "pool shrunk, nothing made": ("driver", "create", dict(before=True, when=lambda rel, *a: rel == "wl-web"),
                                  None),
}


@pytest.mark.parametrize("point", sorted(CREATE_POINTS))
def test_dying_while_a_cgroup_is_made_does_not_block_the_next_start(env, monkeypatch, sleepers, point):
    machine, state_dir, cg_root, service, kept = env
    where, name, how, special = CREATE_POINTS[point]
    if special == "after_os_mkdir":
        real_mkdir = os.mkdir

        def mkdir_then_die(path, mode=0o777, **kw):
            real_mkdir(path, mode, **kw)
            if os.path.basename(os.fspath(path)) == "wl-web":
                raise Crash("mkdir")
        monkeypatch.setattr(simulated_cgroupfs.os, "mkdir", mkdir_then_die)
    else:
        owner = service.enforcer.cgroup.files if where == "tree" else service.enforcer.cgroup
        crash_at(monkeypatch, owner, name, **how)
    with pytest.raises(Crash):
        service.admit(AdmitRequest(name="web", cpus=2), sleepers())
    monkeypatch.undo()
    assert "web" in [w["name"] for w in on_disk(state_dir)["workloads"]]
    restart_and_check(machine, state_dir, cg_root, kept, sleepers)


# ---- the agent dies while removing `web` (the checkpoint no longer holds it) -----------------
def test_dying_between_emptying_and_removing_a_released_cgroup(env, monkeypatch, sleepers):
    machine, state_dir, cg_root, service, kept = env
    service.admit(AdmitRequest(name="web", cpus=2), sleepers())
    crash_at(monkeypatch, service.enforcer.cgroup, "remove", before=True, when=lambda rel, *a: rel == "wl-web")
    with pytest.raises(Crash):
        service.release("web", ROOT)
    monkeypatch.undo()
    restart_and_check(machine, state_dir, cg_root, kept, sleepers)


def test_dying_in_the_middle_of_a_simulated_rmdir(env, monkeypatch, sleepers):
    """The simulated tree removes a cgroup's files one by one before its directory."""
    machine, state_dir, cg_root, service, kept = env
    service.admit(AdmitRequest(name="web", cpus=2), ME)  # nobody in it: released by rmdir at once
    real_unlink = simulated_cgroupfs.Path.unlink
    unlinked = []

    def unlink_then_die(self, *a, **kw):
        real_unlink(self, *a, **kw)
        if self.parent.name == "wl-web":
            unlinked.append(self.name)
            if "cgroup.procs" in unlinked:
                raise Crash("unlink")
    monkeypatch.setattr(simulated_cgroupfs.Path, "unlink", unlink_then_die)
    with pytest.raises(Crash):
        service.release("web", ROOT)
    monkeypatch.undo()
    assert (cg_root / "wl-web").is_dir() and not (cg_root / "wl-web" / "cgroup.procs").exists()
    restart_and_check(machine, state_dir, cg_root, kept, sleepers)


def test_the_agents_start_refreshes_a_tree_with_a_cgroup_its_rmdir_left_half(env, sleepers):
    """The agent's start refreshes the simulated root (make_simulated_cgroup_root) before
    anything reads the tree. The rmdir removes a cgroup's files in directory order: a
    death after cpuset.cpus went and before cpuset.cpus.effective did must not stop the
    start there ("No such file or directory: .../cpuset.cpus")."""
    machine, state_dir, cg_root, service, kept = env
    service.enforcer.close()
    CgroupV2(cg_root, SimulatedCgroupfs(cg_root)).create("wl-web")
    (cg_root / "wl-web" / "cpuset.cpus").unlink()  # as that death leaves it
    assert (cg_root / "wl-web" / "cpuset.cpus.effective").is_file()
    make_simulated_cgroup_root(cg_root, machine.usable_cpus, [0, 1])  # as startup's _simulated_cgroup
    restart_and_check(machine, state_dir, cg_root, kept, sleepers)


# ---- trees left so, that the checkpoint does not know ------------------------------------------
def _empty_dir(cg_root, machine, rel):
    (cg_root / rel).mkdir()


def _made_nothing_written(cg_root, machine, rel):
    CgroupV2(cg_root, SimulatedCgroupfs(cg_root)).create(rel)


def _mems_only(cg_root, machine, rel):
    cg = CgroupV2(cg_root, SimulatedCgroupfs(cg_root))
    cg.create(rel)
    cg.files.write(cg.path(rel) / "cpuset.mems", "0")


def _cpus_no_record(cg_root, machine, rel):
    cg = CgroupV2(cg_root, SimulatedCgroupfs(cg_root))
    cg.create(rel)
    cg.write_cpuset(rel, CpuSet.parse("14-15"), [1])


def _record_no_process(cg_root, machine, rel):
    _cpus_no_record(cg_root, machine, rel)
    cg = CgroupV2(cg_root, SimulatedCgroupfs(cg_root))
    cg.write_xattr(rel, RECORD_XATTR, b'{"name": "x"}')


UNKNOWN = {"empty directory": _empty_dir, "made, nothing written": _made_nothing_written,
           "cpuset.mems only": _mems_only, "cpuset, no record": _cpus_no_record,
           "record, no process": _record_no_process}


@pytest.mark.parametrize("rel", ["wl-x", "shared/x", "pod-p"])
@pytest.mark.parametrize("left", sorted(UNKNOWN))
def test_an_empty_half_made_cgroup_nobody_booked_is_removed(env, sleepers, left, rel):
    machine, state_dir, cg_root, service, kept = env
    UNKNOWN[left](cg_root, machine, rel)
    restart_and_check(machine, state_dir, cg_root, kept, sleepers, gone=("wl-web", rel))


def test_a_half_made_cgroup_with_a_process_follows_the_orphan_rules(env, sleepers):
    """Populated, no record, nothing written: adopted from its files, as any
    cgroup of an older agent is (here: shared, it asks for no CPUs of its own)."""
    machine, state_dir, cg_root, service, kept = env
    _made_nothing_written(cg_root, machine, "wl-x")
    cg = CgroupV2(cg_root, SimulatedCgroupfs(cg_root))
    cg.move_pid("wl-x", sleepers().pid)
    service2, report = start(machine, state_dir, cg_root)
    assert "x" in report.adopted
    x = service2.state.workload("x")
    assert not set(x.booking.cpus) & set(service2.state.workload("kept").booking.cpus)
    service2.enforcer.close()


def test_a_booked_workload_whose_cgroup_lost_its_files_is_made_whole(env, sleepers):
    """Known to the checkpoint and populated, its cgroup's files gone in the
    simulated tree (a crash inside the simulated mkdir): the tree completes
    it as the kernel's atomic mkdir would have, and start-up re-applies it."""
    machine, state_dir, cg_root, service, kept = env
    for name in ("cpuset.cpus", "cpuset.mems", "memory.max"):
        (cg_root / "wl-kept" / name).unlink()
    service2, report = start(machine, state_dir, cg_root)
    assert [w.name for w in service2.state.workloads] == ["kept"], report
    assert cg_file(cg_root, "wl-kept", "cpuset.cpus") == kept["cpus"]
    service2.enforcer.close()


def test_dying_before_a_released_cgroup_with_a_process_is_emptied(env, monkeypatch, sleepers):
    """Released by an operator while its process runs: the agent dies before
    moving that process out (an rmdir now would be EBUSY). The revocation in
    the checkpoint keeps it from being adopted again; start-up hands the
    process to the shared pool and removes the cgroup."""
    machine, state_dir, cg_root, service, kept = env
    web = sleepers()
    service.admit(AdmitRequest(name="web", cpus=2), web)
    crash_at(monkeypatch, service.enforcer.cgroup, "move_pid", before=True)
    with pytest.raises(Crash):
        service.release("web", ROOT)
    monkeypatch.undo()
    assert web.pid in CgroupV2(cg_root, SimulatedCgroupfs(cg_root)).procs("wl-web")
    restart_and_check(machine, state_dir, cg_root, kept, sleepers)
    assert CgroupV2(cg_root, SimulatedCgroupfs(cg_root)).cgroup_of(web.pid).endswith("/shared/_released")


def test_dying_after_a_workload_became_a_partition_before_its_process_moved_in(tmp_path, monkeypatch, sleepers):
    """With partitions, an exclusive workload's cgroup takes its CPUs from the
    pool as soon as it is a partition. Dying before the process moved in
    leaves it empty and known to the checkpoint: released at the next start,
    its CPUs must come back to the pool before the pool is written and read
    back, or every start fails its check of the pool's effective CPUs."""
    machine = make_machine()
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    CgroupV2(cg_root, SimulatedCgroupfs(cg_root)).set_partition("", "root")  # the administrator's decision
    service, _ = start(machine, tmp_path / "state", cg_root, partitions="isolated")
    kept = service.admit(AdmitRequest(name="kept", cpus=2), sleepers())
    crash_at(monkeypatch, service.enforcer.cgroup, "set_partition", when=lambda rel, *a: rel == "wl-web")
    with pytest.raises(Crash):
        service.admit(AdmitRequest(name="web", cpus=2), sleepers())
    monkeypatch.undo()
    service.enforcer.close()
    assert cg_file(cg_root, "wl-web", "cpuset.cpus.partition") == "isolated"
    service2, report = start(machine, tmp_path / "state", cg_root, partitions="isolated")
    assert [w.name for w in service2.state.workloads] == ["kept"] and report.released == ("web",)
    assert not (cg_root / "wl-web").exists()
    assert cg_file(cg_root, "wl-kept", "cpuset.cpus.partition") == "isolated"
    pool = CpuSet.parse(cg_file(cg_root, "shared", "cpuset.cpus.effective"))
    assert pool.isdisjoint(CpuSet.parse(kept["cpus"])) and len(pool) == len(machine.usable_cpus) - 2
    service2.enforcer.close()
