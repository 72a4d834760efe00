"""The simulated cgroup tree: a write costs what it changes, empty requests
inherit as on the kernel, and exits are noticed through pidfds."""

from __future__ import annotations

import os
import random
import select
import subprocess

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.enforcement import simulated_cgroupfs
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root


def eff(root, rel=""):
    return (root / rel / "cpuset.cpus.effective").read_text().strip()


def events(root, rel=""):
    return (root / rel / "cgroup.events").read_text().split("\n")[0]


@pytest.fixture
def listed(monkeypatch):
    """Which directories the fake lists (its only way to walk the tree)."""
    seen: list = []
    for name in ("_child_dirs", "_iter_child_dirs", "_subtree"):
        real = getattr(simulated_cgroupfs, name, None)
        if real is None:
            continue

        def spy(directory, _real=real):
            seen.append(directory)
            return _real(directory)

        monkeypatch.setattr(simulated_cgroupfs, name, spy)
    return seen


@pytest.fixture
def wide(cg, fake_root):
    """Ten workload cgroups of one CPU, and a pool whose children inherit."""
    for i in range(10):
        cg.create(f"wl-{i}")
        cg.write_cpuset(f"wl-{i}", CpuSet([i]), [0])
    cg.create("shared")
    cg.enable_controllers("shared", ["cpuset"])
    cg.write_cpuset("shared", CpuSet.parse("10-15"), [0, 1])
    cg.create("shared/a")
    cg.enable_controllers("shared/a", ["cpuset"])
    cg.create("shared/a/deep")
    cg.create("shared/b")
    cg.write_cpuset("shared/b", CpuSet.parse("14-15"), [1])
    return fake_root


def test_a_cpuset_write_looks_only_below_the_written_cgroup(cg, wide, listed):
    cg.write_cpuset("wl-3", CpuSet([9]), [0])  # taken from nobody: the fake does not judge
    assert eff(wide, "wl-3") == "9"
    assert set(listed) <= {wide / "wl-3"}


def test_a_move_looks_only_at_the_two_cgroups_and_their_ancestors(cg, wide, sleepers, listed):
    proc = sleepers()
    cg.move_pid("wl-1", proc.pid)
    listed.clear()
    cg.move_pid("shared/a/deep", proc.pid)
    assert cg.procs("wl-1") == [] and cg.procs("shared/a/deep") == [proc.pid]
    assert events(wide, "wl-1") == "populated 0" and events(wide, "shared") == "populated 1"
    assert set(listed) <= {wide / "wl-1", wide / "shared/a/deep", wide / "shared/a",
                           wide / "shared", wide}


def test_an_empty_request_inherits_and_follows_the_parent(cg, wide, listed):
    # shared/a asks for nothing: it has the pool's CPUs, and so has its child.
    assert eff(wide, "shared/a") == eff(wide, "shared/a/deep") == "10-15"
    assert eff(wide, "shared/b") == "14-15"
    listed.clear()
    cg.write_cpuset("shared", CpuSet.parse("11-15"), [0, 1])
    assert eff(wide, "shared") == eff(wide, "shared/a") == eff(wide, "shared/a/deep") == "11-15"
    # b's own request is unchanged within the new pool: nothing below it is looked at.
    assert eff(wide, "shared/b") == "14-15"
    assert set(listed) <= {wide / "shared", wide / "shared/a", wide / "shared/a/deep"}
    # A request disjoint from what the parent has falls back to all of it.
    cg.write_cpuset("shared", CpuSet.parse("10-12"), [0])
    assert eff(wide, "shared/b") == "10-12"
    assert (wide / "shared/b/cpuset.mems.effective").read_text().strip() == "0"


def test_a_child_made_later_gets_the_parents_effective(cg, wide):
    cg.create("shared/c")
    assert eff(wide, "shared/c") == "10-15"


def _snapshot(root):
    out = {}
    for directory in sorted(p for p in root.rglob("*") if p.is_dir()) + [root]:
        for name in ("cpuset.cpus.effective", "cpuset.mems.effective", "cgroup.events"):
            file = directory / name
            if file.is_file():
                out[f"{directory.relative_to(root)}/{name}"] = file.read_text()
    return out


@pytest.mark.parametrize("seed", range(6))
def test_every_write_leaves_the_tree_as_a_full_recompute_would(tmp_path, seed):
    """Random writes, partitions included; after each, recomputing the whole
    tree from the requests changes nothing."""
    rng = random.Random(seed)
    root = make_simulated_cgroup_root(tmp_path / "cg", CpuSet.parse("0-15"), [0, 1])
    fake = SimulatedCgroupfs(root)
    cg = CgroupV2(root, fake)
    cg.enable_controllers("", ["cpuset"])
    cg.set_partition("", "root")
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    made = [""]
    try:
        for step in range(60):
            rel = rng.choice(made)
            op = rng.choice(("mkdir", "mkdir", "cpus", "cpus", "mems", "excl", "part", "move", "rmdir"))
            path = cg.path(rel)
            try:
                if op == "mkdir" and rel.count("/") < 2:
                    child = f"{rel}/c{step}" if rel else f"c{step}"
                    if rel:
                        cg.enable_controllers(rel, ["cpuset"])
                    cg.create(child)
                    made.append(child)
                elif op == "cpus":
                    fake.write(path / "cpuset.cpus",
                               CpuSet(rng.sample(range(16), rng.randint(0, 5))).format())
                elif op == "mems":
                    fake.write(path / "cpuset.mems", rng.choice(("", "0", "1", "0-1")))
                elif op == "excl":
                    fake.write(path / "cpuset.cpus.exclusive",
                               CpuSet(rng.sample(range(16), rng.randint(0, 3))).format())
                elif op == "part" and rel:
                    fake.write(path / "cpuset.cpus.partition", rng.choice(("root", "isolated", "member")))
                elif op == "move":
                    fake.write(path / "cgroup.procs", str(rng.choice(procs).pid))
                elif op == "rmdir" and rel:
                    fake.rmdir(path)
                    made.remove(rel)
            except OSError:
                pass  # EBUSY, ENOSPC...: refused writes change nothing either
            incremental = _snapshot(root)
            fake.recompute()
            fake.refresh_populated()
            assert _snapshot(root) == incremental, f"step {step}: {op} on {rel!r}"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        fake.close()


# ---- exits ------------------------------------------------------------------------------
def wait_readable(fds, timeout=10.0):
    ready, _, _ = select.select(fds, [], [], timeout)
    return ready


def test_an_exit_is_seen_through_the_backends_descriptor(cg, fakefs, fake_root):
    cg.create("w")
    proc = subprocess.Popen(["sleep", "60"])
    cg.move_pid("w", proc.pid)
    assert cg.populated("w")
    proc.kill()  # not waited for: a zombie has exited all the same
    try:
        ready = wait_readable(fakefs.fds())
        assert ready, "the exit did not make the backend's descriptor readable"
        fakefs.ready(ready)
        assert (fake_root / "w" / "cgroup.procs").read_text() == ""
        assert events(fake_root, "w") == "populated 0"
        assert not wait_readable(fakefs.fds(), timeout=0)
    finally:
        proc.wait()


def test_a_process_already_gone_when_moved_in_is_not_listed(cg, fake_root):
    cg.create("w")
    proc = subprocess.Popen(["true"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
    try:
        cg.move_pid("w", proc.pid)
        assert cg.procs("w") == [] and not cg.populated("w")
    finally:
        proc.wait()


def test_a_new_instance_drops_listed_processes_that_are_gone(cg, fake_root):
    cg.create("w")
    proc = subprocess.Popen(["sleep", "60"])
    cg.move_pid("w", proc.pid)
    proc.kill()
    proc.wait()
    later = SimulatedCgroupfs(fake_root)  # an agent restarted over the tree
    try:
        assert CgroupV2(fake_root, later).procs("w") == []
        assert events(fake_root, "w") == "populated 0"
    finally:
        later.close()


def test_the_enforcer_reports_an_exit_from_the_backend(fake_root):
    enforcer = CgroupEnforcer(CgroupV2(fake_root, SimulatedCgroupfs(fake_root)))
    try:
        enforcer.setup()
        cg = enforcer.cgroup
        cg.create("wl-x")
        cg.write_cpuset("wl-x", CpuSet([3]), [0])
        enforcer.watcher.watch("wl-x")
        proc = subprocess.Popen(["sleep", "60"])
        cg.move_pid("wl-x", proc.pid)
        assert enforcer.released(set(enforcer.fds())) == []  # a move in is no release
        proc.kill()
        released: list[str] = []
        for _ in range(5):
            released += enforcer.released(set(wait_readable(enforcer.fds())))
            if released:
                break
        proc.wait()
        assert released == ["wl-x"]
        assert enforcer.mode == "simulated"
    finally:
        enforcer.close()


# ---- inheriting children follow by link -------------------------------------------------
def _file_ops(monkeypatch):
    """Counts of the fake's reads and writes of interface files."""
    counts = {"get": 0, "put": 0}
    for name, key in (("_get", "get"), ("_put", "put")):
        real = getattr(simulated_cgroupfs, name)

        def spy(*args, _real=real, _key=key):
            counts[_key] += 1
            return _real(*args)

        monkeypatch.setattr(simulated_cgroupfs, name, spy)
    return counts


def _pool_write(root, followers, monkeypatch):
    """A pool with `followers` inheriting children and one bound child:
    write the pool's CPUs, return the file operations that took."""
    cg = CgroupV2(root, SimulatedCgroupfs(root))
    cg.enable_controllers("", ["cpuset"])
    cg.create("shared")
    cg.enable_controllers("shared", ["cpuset"])
    cg.write_cpuset("shared", CpuSet.parse("4-15"), [0, 1])
    for i in range(followers):
        cg.create(f"shared/s{i}")
        cg.write_cpuset_inherited(f"shared/s{i}", [0, 1])
    cg.create("shared/bound")
    cg.write_cpuset("shared/bound", CpuSet.parse("8-15"), [1])
    with monkeypatch.context() as patch:
        counts = _file_ops(patch)
        cg.write_cpuset("shared", CpuSet.parse("6-15"), [0, 1])
    assert all(eff(root, f"shared/s{i}") == "6-15" for i in range(followers))
    assert eff(root, "shared/bound") == "8-15"
    cg.write_cpuset("shared", CpuSet.parse("4-5"), [0])
    assert cg.read_effective(f"shared/s{followers - 1}") == (CpuSet.parse("4-5"), NumaMask([0]))
    assert eff(root, "shared/bound") == "4-5"  # disjoint: all of the parent's
    return counts


def test_a_pool_write_costs_the_same_whatever_number_of_children_inherit_it(tmp_path, monkeypatch):
    few, many = (_pool_write(make_simulated_cgroup_root(tmp_path / str(n), CpuSet.parse("0-15"), [0, 1]),
                             n, monkeypatch) for n in (4, 40))
    assert few == many


def test_a_child_that_asks_for_its_own_cpus_stops_following(cg, wide):
    cg.write_cpuset("shared/a", CpuSet.parse("10-15"), [0, 1])  # the very set it had
    cg.write_cpuset("shared", CpuSet.parse("12-15"), [0, 1])
    assert eff(wide, "shared/a") == eff(wide, "shared/a/deep") == "12-15"
    cg.write_cpuset("shared", CpuSet.parse("0-15"), [0, 1])
    assert eff(wide, "shared/a") == eff(wide, "shared/a/deep") == "10-15"
    cg._write(cg.path("shared/a") / "cpuset.cpus", "\n")  # inherits again
    assert eff(wide, "shared/a") == eff(wide, "shared/a/deep") == "0-15"
    cg.write_cpuset("shared", CpuSet.parse("1-2"), [0])
    assert eff(wide, "shared/a/deep") == "1-2"


def test_a_request_below_an_inheriting_cgroup_is_recomputed(cg, wide):
    # shared/a inherits (a link), but its child asks for CPUs of its own.
    cg.write_cpuset("shared/a/deep", CpuSet.parse("12-13"), [0])
    cg.write_cpuset("shared", CpuSet.parse("13-15"), [0, 1])
    assert eff(wide, "shared/a") == "13-15" and eff(wide, "shared/a/deep") == "13"
    cg.write_cpuset("", CpuSet.parse("0-12"), [0, 1])  # the root: shared's request is disjoint now
    assert eff(wide, "shared/a") == "0-12" and eff(wide, "shared/a/deep") == "12"
    cg.remove("shared/a/deep")
    cg.write_cpuset("", CpuSet.parse("0-15"), [0, 1])
    assert eff(wide, "shared/a") == "13-15"


def test_a_tree_of_plain_effective_files_is_taken_over_on_the_first_change(cg, wide):
    # As an older agent left it: each inheriting child's effective file a file of its own.
    for rel in ("shared/a", "shared/a/deep"):
        file = wide / rel / "cpuset.cpus.effective"
        text = file.read_text()
        file.unlink()
        file.write_text(text)
    later = SimulatedCgroupfs(wide)
    try:
        later.write(wide / "shared" / "cpuset.cpus", "11-13")
        assert eff(wide, "shared/a") == eff(wide, "shared/a/deep") == "11-13"
    finally:
        later.close()


def test_emptying_one_of_many_populated_siblings_lists_none_of_them(cg, fake_root, sleepers, listed):
    cg.create("shared")
    procs = []
    for i in range(6):
        cg.create(f"shared/s{i}")
        procs.append(sleepers())
        cg.move_pid(f"shared/s{i}", procs[-1].pid)
    cg.create("other")
    listed.clear()
    cg.move_pid("other", procs[0].pid)
    assert events(fake_root, "shared/s0") == "populated 0" and events(fake_root, "shared") == "populated 1"
    assert fake_root / "shared" not in listed
    for i in range(1, 6):
        cg.move_pid("other", procs[i].pid)
    assert events(fake_root, "shared") == "populated 0" and events(fake_root) == "populated 1"
