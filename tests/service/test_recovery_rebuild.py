"""Rebuilding the state from the cgroup tree when the checkpoint is lost or
corrupt: from each cgroup's booking record, or (cgroups made by an older agent)
from its cpuset and limits. Nothing is double-booked and no limit is loosened."""

from __future__ import annotations

import json

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.record import RECORD_XATTR, decode_record, encode_record
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root
from numa_agent.service.refusals import NoCapacity
from numa_agent.service.requests import AdmitRequest, PodBudget
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.model import replace
from tests.support.simulated_service import cg_file, start
from tests.support.synthetic import make_topology

GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")
MIB = 1 << 20
LIMIT = 576 * MIB  # 603979776, as in the QEMU guest


def make_machine(memory_per_node=961 * MIB, **kw):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=memory_per_node, hugepages_2m_per_node=16,
                         devices=(GPU, GPU))
    return build_machine(topo, PolicyConfig(topology_policy="best-effort",
                                            devices={"gpu": {"vendor": "0x10de"}}, **kw))


@pytest.fixture
def env(tmp_path):
    machine = make_machine()
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    return machine, tmp_path / "state", cg_root




def lose_checkpoint(state_dir, how):
    """No good generation left: the tree is the only source (.prev is gone too)."""
    (state_dir / "checkpoint.json.prev").unlink(missing_ok=True)
    path = state_dir / "checkpoint.json"
    if how == "lost":
        path.unlink()
    else:
        doc = json.loads(path.read_text())
        doc["data"]["tampered"] = True  # checksum no longer matches
        path.write_text(json.dumps(doc))


def drop_records(root):
    """As if the cgroups had been made by an agent that wrote no records."""
    fake = SimulatedCgroupfs(root)
    for directory in fake._all_cgroups()[1:]:
        fake.removexattr(directory, RECORD_XATTR)


def write_record(root, rel, value):
    SimulatedCgroupfs(root).setxattr(root / rel, RECORD_XATTR, encode_record(value))


# ---- from the record ---------------------------------------------------------------------
@pytest.mark.parametrize("how", ["lost", "corrupt"])
def test_record_restores_the_full_booking(env, sleepers, how):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    owner = sleepers(uid=1000)
    service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=LIMIT, membind=[0],
                               hugepages={"2048": 4}, devices={"gpu": 1}), owner)
    before = service.state.workload("web")
    lose_checkpoint(state_dir, how)
    service2, report = start(machine, state_dir, root)
    assert report.adopted == ("web",)
    w = service2.state.workload("web")
    assert w == replace(before, command=())  # booking, owner, pid, identity, request
    assert w.owner_uid == 1000 and w.booking.memory == before.booking.memory
    assert w.booking.devices == before.booking.devices
    assert cg_file(root, "wl-web", "memory.max") == str(LIMIT)
    assert cg_file(root, "wl-web", "hugetlb.2MB.max") == str(8 * MIB)


def test_memory_booked_from_the_record_is_not_handed_out_again(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", memory_bytes=LIMIT, membind=[0]), sleepers())
    lose_checkpoint(state_dir, "lost")
    service2, _ = start(machine, state_dir, root)
    with pytest.raises(NoCapacity):
        service2.admit(AdmitRequest(name="b", memory_bytes=LIMIT, membind=[0], policy="single-numa-node"),
                       sleepers())
    node0 = service2.status()["nodes"][0]["memory_bytes"]
    assert node0["allocated"] == LIMIT


def test_record_keeps_the_pod_and_its_members(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    budget = PodBudget(cpus=4, memory_bytes=LIMIT, devices={"gpu": 1})
    service.admit(AdmitRequest(name="main", pod="p", cpus=2, memory_bytes=256 * MIB, devices={"gpu": 1},
                               pod_budget=budget), sleepers(uid=1000))
    service.admit(AdmitRequest(name="side", pod="p"), sleepers(uid=1000))
    pod, main = service.state.pod("p"), service.state.workload("main")
    lose_checkpoint(state_dir, "corrupt")
    service2, report = start(machine, state_dir, root)
    assert sorted(report.adopted) == ["main", "pod p", "side"]
    assert service2.state.pod("p") == pod
    assert service2.state.workload("main") == replace(main, command=())
    assert service2.state.workload("side").pod == "p" and service2.state.workload("side").shared
    assert cg_file(root, "pod-p", "memory.max") == str(LIMIT)
    assert cg_file(root, "pod-p/main", "memory.max") == str(256 * MIB)
    assert service2.status()["nodes"][pod.booking.mems[0]]["memory_bytes"]["allocated"] == LIMIT


def test_what_others_hold_is_never_booked_twice(env, sleepers, caplog):
    """A record claiming CPUs, memory or a device the restored state already
    holds (a copied cgroup, a stale record) gets only what is left."""
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", cpus=2, memory_bytes=LIMIT, membind=[0], devices={"gpu": 1}),
                  sleepers())
    a = service.state.workload("a")
    # Another cgroup with a's cpuset and a record that claims a's booking.
    (root / "wl-b").mkdir()
    fake = SimulatedCgroupfs(root)
    fake._write_core_files(root / "wl-b", ("cpuset", "memory", "hugetlb"))
    fake._write_controller_files(root / "wl-b", ("cpuset", "memory", "hugetlb"))
    fake.write(root / "wl-b" / "cpuset.mems", "0")
    fake.write(root / "wl-b" / "cpuset.cpus", a.booking.cpus.format())
    b_proc = sleepers()
    fake.write(root / "wl-b" / "cgroup.procs", str(b_proc.pid))
    write_record(root, "wl-b", replace(a, name="b", pid=b_proc.pid, pid_identity=None))
    service2, report = start(machine, state_dir, root)  # the checkpoint knows a, not b
    assert report.adopted == ("b",)
    b = service2.state.workload("b")
    assert b.booking.cpus == CpuSet() and b.shared
    free = machine.memory.allocatable(0, "memory") - LIMIT
    assert b.booking.memory == {0: {"memory": free}}  # what is left on node 0, not a's share again
    assert b.booking.devices == ()
    assert service2.state.workload("a") == a
    assert "already booked" in caplog.text
    node0 = service2.status()["nodes"][0]["memory_bytes"]
    assert node0["allocated"] == machine.memory.allocatable(0, "memory") and node0["free"] == 0


def test_a_record_that_disagrees_with_its_cgroup_is_not_trusted(env, sleepers, caplog):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=LIMIT, membind=[0]), sleepers())
    w = service.state.workload("web")
    other = CpuSet([c + 1 for c in w.booking.cpus])
    write_record(root, "wl-web", replace(w, booking=replace(w.booking, cpus=other), owner_uid=4242))
    lose_checkpoint(state_dir, "lost")
    service2, _ = start(machine, state_dir, root)
    got = service2.state.workload("web")
    assert got.booking.cpus == w.booking.cpus and got.owner_uid != 4242
    assert "booking record" in caplog.text and "ignored" in caplog.text
    assert cg_file(root, "wl-web", "memory.max") == str(LIMIT)  # from the cgroup, then


def test_a_corrupt_record_falls_back_to_the_cgroup(env, sleepers, caplog):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=LIMIT, membind=[0]), sleepers())
    SimulatedCgroupfs(root).setxattr(root / "wl-web", RECORD_XATTR, b'{"schema":1,"workload":')
    lose_checkpoint(state_dir, "lost")
    service2, report = start(machine, state_dir, root)
    assert report.adopted == ("web",)
    assert "unreadable" in caplog.text
    assert cg_file(root, "wl-web", "memory.max") == str(LIMIT)
    # ...and the restart wrote a fresh record
    assert decode_record(SimulatedCgroupfs(root).getxattr(root / "wl-web", RECORD_XATTR)).name == "web"


# ---- without a record (an older agent made the cgroup) ------------------------------------
def test_without_a_record_memory_max_is_kept_and_booked(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", cpus=2, memory_bytes=LIMIT, membind=[0]), sleepers())
    drop_records(root)
    lose_checkpoint(state_dir, "lost")
    service2, report = start(machine, state_dir, root)
    assert report.adopted == ("a",)
    assert cg_file(root, "wl-a", "memory.max") == str(LIMIT)  # not rewritten to "max"
    a = service2.state.workload("a")
    assert a.booking.memory == {0: {"memory": LIMIT}} and a.request["memory_bytes"] == LIMIT
    with pytest.raises(NoCapacity):
        service2.admit(AdmitRequest(name="b", memory_bytes=LIMIT, membind=[0], policy="single-numa-node"),
                       sleepers())


def test_without_a_record_hugetlb_limits_are_kept_and_booked(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", cpus=2, hugepages={"2048": 10}, membind=[0]), sleepers())
    drop_records(root)
    lose_checkpoint(state_dir, "lost")
    service2, _ = start(machine, state_dir, root)
    assert cg_file(root, "wl-a", "hugetlb.2MB.max") == str(20 * MIB)
    assert service2.state.workload("a").booking.memory == {0: {"hugepages-2048kB": 20 * MIB}}
    with pytest.raises(NoCapacity):  # 16 pages per node: 10 are taken
        service2.admit(AdmitRequest(name="b", hugepages={"2048": 10}, membind=[0],
                                    policy="single-numa-node"), sleepers())


def test_without_a_record_memory_over_several_nodes_is_booked_as_one_group(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="big", memory_bytes=1200 * MIB, shared=True), sleepers())
    before = service.state.workload("big").booking
    assert len(before.mems) == 2
    drop_records(root)
    lose_checkpoint(state_dir, "lost")
    service2, _ = start(machine, state_dir, root)
    got = service2.state.workload("big").booking
    assert got.memory_group == (0, 1)
    assert sum(per["memory"] for per in got.memory.values()) == 1200 * MIB
    assert cg_file(root, "shared/big", "memory.max") == str(1200 * MIB)


def test_without_a_record_a_pod_keeps_its_limits(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="main", pod="p", cpus=2, memory_bytes=256 * MIB,
                               pod_budget=PodBudget(cpus=4, memory_bytes=LIMIT)), sleepers())
    drop_records(root)
    lose_checkpoint(state_dir, "lost")
    service2, _ = start(machine, state_dir, root)
    assert cg_file(root, "pod-p", "memory.max") == str(LIMIT)
    assert cg_file(root, "pod-p/main", "memory.max") == str(256 * MIB)
    assert service2.state.pod("p").booking.memory_total("memory") == LIMIT


def test_without_a_record_memory_others_hold_is_not_booked_twice(env, sleepers, caplog):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", memory_bytes=LIMIT, membind=[0], shared=True), sleepers())
    service.admit(AdmitRequest(name="b", memory_bytes=256 * MIB, membind=[0], shared=True), sleepers())
    drop_records(root)
    # The limit of b grew while the agent was down (or another tool set it).
    SimulatedCgroupfs(root).write(root / "shared" / "b" / "memory.max", str(LIMIT))
    checkpoint = CheckpointStore(state_dir)
    doc = checkpoint.load()
    doc["workloads"] = [w for w in doc["workloads"] if w["name"] == "a"]
    checkpoint.save(doc)  # the checkpoint knows a only
    service2, report = start(machine, state_dir, root)
    assert report.adopted == ("b",)
    free = service2.machine.memory.allocatable(0, "memory") - LIMIT
    assert service2.state.workload("b").booking.memory == {0: {"memory": free}}
    assert cg_file(root, "shared/b", "memory.max") == str(LIMIT)  # kept all the same
    assert "could not be booked" in caplog.text


def test_a_partly_booked_hugetlb_limit_is_kept_whole(env, sleepers, caplog):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", hugepages={"2048": 10}, membind=[0], shared=True), sleepers())
    service.admit(AdmitRequest(name="b", hugepages={"2048": 4}, membind=[0], shared=True), sleepers())
    drop_records(root)
    SimulatedCgroupfs(root).write(root / "shared" / "b" / "hugetlb.2MB.max", str(20 * MIB))
    checkpoint = CheckpointStore(state_dir)
    doc = checkpoint.load()
    doc["workloads"] = [w for w in doc["workloads"] if w["name"] == "a"]
    checkpoint.save(doc)
    service2, _ = start(machine, state_dir, root)
    assert service2.state.workload("b").booking.memory == {0: {"hugepages-2048kB": 12 * MIB}}  # 6 pages left
    assert cg_file(root, "shared/b", "hugetlb.2MB.max") == str(20 * MIB)  # not tightened to 12
    assert "may use 20 MiB of hugepages-2048kB on NUMA node(s) 0; 8 MiB of it could not be booked" \
        in caplog.text
