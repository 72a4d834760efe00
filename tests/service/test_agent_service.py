"""AgentService on a temporary cgroup tree and state directory: the commit
protocol, failure paths (nothing lost, nothing leaked), restart recovery and
concurrency."""

import json
import os
import threading

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.errors import CgroupNoSpaceError
from numa_agent.enforcement.record import RECORD_XATTR, decode_record
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root
from numa_agent.service.caller import system_user_name
from numa_agent.service.recovery import PolicyChanged
from numa_agent.service.refusals import (
    InConflict,
    InvalidInput,
    NoCapacity,
    NotPermitted,
    TopologyRefused,
    Unavailable,
    UnknownWorkload,
)
from numa_agent.service.requests import AdmitRequest, PodBudget
from numa_agent.state.checkpoint import CheckpointStore, CheckpointWriteError
from numa_agent.state.model import replace
from tests.support.simulated_service import cg_file, start
from tests.support.synthetic import make_topology

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
ROOT = Caller(pid=os.getpid(), uid=0, gid=0)
GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")


def make_machine(policy="best-effort", **kw):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=8 << 30, devices=(GPU,))
    return build_machine(topo, PolicyConfig(topology_policy=policy,
                                            devices={"gpu": {"vendor": "0x10de"}}, **kw))


@pytest.fixture
def env(tmp_path):
    machine = make_machine()
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    return machine, tmp_path / "state", cg_root




def test_admission_writes_cgroups_and_checkpoint_and_pool_shrinks(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    out = service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=1 << 30), ME)
    cpus = CpuSet.parse(out["cpus"])
    assert len(cpus) == 2 and out["exclusive"] and out["enforcement"] == "simulated"
    assert CpuSet.parse(cg_file(root, "wl-web", "cpuset.cpus")) == cpus
    assert cg_file(root, "wl-web", "memory.max") == str(1 << 30)
    assert cg_file(root, "wl-web", "cpuset.mems") == ",".join(map(str, out["mems"]))
    pool = CpuSet.parse(cg_file(root, "shared", "cpuset.cpus"))
    assert pool.isdisjoint(cpus) and pool | cpus == machine.usable_cpus
    assert str(os.getpid()) in cg_file(root, "wl-web", "cgroup.procs").split()
    saved = CheckpointStore(state_dir).load()
    assert [w["name"] for w in saved["workloads"]] == ["web"]
    # release gives everything back and removes the cgroup
    service.release("web", ME)
    assert not (root / "wl-web").exists()
    assert CpuSet.parse(cg_file(root, "shared", "cpuset.cpus")) == machine.usable_cpus
    assert CheckpointStore(state_dir).load()["workloads"] == []


def record_of(root, rel):
    data = SimulatedCgroupfs(root).getxattr(root / rel, RECORD_XATTR)
    return None if data is None else decode_record(data)


def test_admission_writes_the_booking_record_into_the_cgroup(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=1 << 30, devices={"gpu": 1},
                               command=["db", "--password=hunter2"]), ME)
    w = service.state.workload("web")
    assert w.booking.memory and w.booking.devices
    assert record_of(root, "wl-web") == replace(w, command=())
    service.admit(AdmitRequest(name="m", pod="p", cpus=1, pod_budget=PodBudget(cpus=2)), ME)
    assert record_of(root, "pod-p") == replace(service.state.pod("p"), members=())
    assert record_of(root, "pod-p/m") == replace(service.state.workload("m"), command=())
    assert record_of(root, "shared") is None and record_of(root, "agent") is None


def test_dry_run_books_nothing(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    before = CheckpointStore(state_dir).load()
    out = service.admit(AdmitRequest(name="probe", cpus=4), ME, dry_run=True)
    assert out["dry_run"] and len(CpuSet.parse(out["cpus"])) == 4
    assert service.state.workloads == ()
    assert not (root / "wl-probe").exists()
    assert CheckpointStore(state_dir).load() == before


def test_refusal_explains_and_changes_nothing(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    with pytest.raises(TopologyRefused) as err:
        service.admit(AdmitRequest(name="big", cpus=10, policy="single-numa-node"), ME)
    assert err.value.details["reason_code"] == "topology_affinity_error"
    assert "TopologyAffinityError" in err.value.message
    assert err.value.details["providers"][0]["provider"] == "cpu"
    assert service.state.workloads == ()
    assert service.counters.errors == {"topology_affinity_error": 1}
    with pytest.raises(InvalidInput, match="unknown device resource"):
        service.admit(AdmitRequest(name="x", devices={"fpga": 1}), ME)
    with pytest.raises(InvalidInput, match="must be 1-63 characters"):
        service.admit(AdmitRequest(name="../etc"), ME)


def test_a_refusal_after_the_merge_does_not_say_admit(env):
    """best-effort lets the merge through and the memory manager refuses:
    the error's details say admit false, and the verdict is the topology's."""
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    with pytest.raises(NoCapacity) as err:
        service.admit(AdmitRequest(name="huge", cpus=1, memory_bytes=100 << 30), ME)
    details = err.value.details
    assert details["reason_code"] == "insufficient_memory" and details["admit"] is False
    assert details["topology"]["policy"] == "best-effort" and details["topology"]["verdict"] == "not-aligned"
    assert "memory: requested 100 GiB, more than the machine can ever hold" in details["reason"]
    assert details["requested"]["memory_bytes"] == 100 << 30
    assert details["free"]["0"]["memory_bytes"] == machine.memory.allocatable(0, "memory")
    assert json.dumps(details).count('"admit"') == 1  # one outcome, nothing else named so


def test_names_owners_and_release_permissions(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="mine", cpus=1), ME)
    with pytest.raises(InConflict, match="already exists"):
        service.admit(AdmitRequest(name="mine", cpus=1), ME)
    with pytest.raises(NotPermitted, match="belongs to uid 1000"):
        service.release("mine", Caller(pid=1, uid=1001, gid=1001))
    with pytest.raises(UnknownWorkload):
        service.release("nobody", ME)
    service.release("mine", ROOT)  # root may release anything
    generated = service.admit(AdmitRequest(command=["/usr/bin/My Server"], shared=True), ME)["name"]
    assert generated == f"my-server-{os.getpid()}"


def test_checkpoint_failure_books_nothing(env, monkeypatch):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    before = CheckpointStore(state_dir).load()

    def broken(state, snapshot=False):
        raise CheckpointWriteError("saving checkpoint failed: No space left on device")

    monkeypatch.setattr(service.store, "commit", broken)
    with pytest.raises(Unavailable, match="nothing was booked"):
        service.admit(AdmitRequest(name="web", cpus=2), ME)
    assert service.state.workloads == ()
    assert not (root / "wl-web").exists()
    assert service.counters.checkpoint_failures_total == 1
    assert CheckpointStore(state_dir).load() == before


def test_enforcement_failure_rolls_back_kernel_and_checkpoint(env, monkeypatch):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="first", cpus=2), ME)
    pool_before = cg_file(root, "shared", "cpuset.cpus")
    real = service.enforcer.cgroup.move_pid

    def failing_move(rel, pid):
        raise CgroupNoSpaceError(f"write {pid} to {rel}/cgroup.procs: ENOSPC", path=rel)

    monkeypatch.setattr(service.enforcer.cgroup, "move_pid", failing_move)
    with pytest.raises(Unavailable, match="enforcement failed, nothing was booked"):
        service.admit(AdmitRequest(name="second", cpus=2), ME)
    monkeypatch.setattr(service.enforcer.cgroup, "move_pid", real)
    assert [w.name for w in service.state.workloads] == ["first"]
    assert not (root / "wl-second").exists()
    assert cg_file(root, "shared", "cpuset.cpus") == pool_before
    assert [w["name"] for w in CheckpointStore(state_dir).load()["workloads"]] == ["first"]


def test_restart_restores_and_never_double_books(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    a = CpuSet.parse(service.admit(AdmitRequest(name="a", cpus=2), sleepers())["cpus"])
    b = CpuSet.parse(service.admit(AdmitRequest(name="b", cpus=2), sleepers())["cpus"])
    # The agent dies; the workloads keep running (their cgroups stay populated).
    service2, report = start(machine, state_dir, root)
    assert report.released == () and {w.name for w in service2.state.workloads} == {"a", "b"}
    c = CpuSet.parse(service2.admit(AdmitRequest(name="c", cpus=2), ME)["cpus"])
    assert c.isdisjoint(a | b)


def test_restart_releases_workloads_whose_processes_are_gone(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="gone", cpus=2), ME)
    (root / "wl-gone" / "cgroup.procs").write_text("")  # its processes exited while we were down
    (root / "wl-gone" / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    service2, report = start(machine, state_dir, root)
    assert report.released == ("gone",)
    assert service2.state.workloads == ()
    assert not (root / "wl-gone").exists()


def test_corrupt_checkpoint_is_moved_aside_and_rebuilt_from_cgroups(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    a = CpuSet.parse(service.admit(AdmitRequest(name="a", cpus=2), sleepers())["cpus"])
    path = state_dir / "checkpoint.json"
    doc = json.loads(path.read_text())
    doc["data"]["tampered"] = True  # checksum no longer matches (a's admission may be in the journal)
    path.write_text(json.dumps(doc))
    service2, report = start(machine, state_dir, root)
    assert report.quarantined and os.path.exists(report.quarantined)
    assert report.adopted == ("a",)
    w = service2.state.workload("a")
    assert w.booking.cpus == a and not w.shared
    # the adopted CPUs are not handed out again
    b = CpuSet.parse(service2.admit(AdmitRequest(name="b", cpus=2), ME)["cpus"])
    assert b.isdisjoint(a)


def test_policy_change_against_checkpoint_is_refused_with_remedy(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="a", cpus=2), ME)
    other = make_machine(policy="single-numa-node")
    with pytest.raises(PolicyChanged, match='on_policy_change = "reconcile"'):
        start(other, state_dir, root)
    service2, report = start(other, state_dir, root, on_policy_change="reconcile")
    assert report.policy_reconciled and service2.state.workload("a") is not None


def test_concurrent_admissions_never_share_a_cpu(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    results, errors = [], []

    def client(i):
        try:
            results.append(CpuSet.parse(service.admit(AdmitRequest(name=f"c{i}", cpus=2), ME)["cpus"]))
        except NoCapacity as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 7  # 16 CPUs, 1 reserved: 7 whole cores
    assert len(errors) == 5
    seen = CpuSet()
    for cpus in results:
        assert cpus.isdisjoint(seen)
        seen = seen | cpus


def test_status_accounting_adds_up(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="g", cpus=2, devices={"gpu": 1}, memory_bytes=1 << 30), ME)
    status = service.status()
    node1 = next(n for n in status["nodes"] if n["id"] == 1)
    assert node1["devices"]["gpu"] == {"capacity": 1, "allocated": 1, "free": 0}
    for node in status["nodes"]:
        for key in ("cpus", "memory_bytes"):
            c = node[key]
            assert c["capacity"] == c["reserved"] + c["allocated"] + c["free"]
    assert status["workloads"][0]["devices"][0]["numa_node"] == 1
    # The options in effect, with this product's defaults (none set in the config here).
    assert status["policy"]["topology_options"] == {"prefer-closest-numa-nodes": "true",
                                                    "max-allowable-numa-nodes": "64",
                                                    "numa-allocation-strategy": "none"}
    snap = service.metrics_snapshot()
    assert snap["counters"]["admission_requests_total"]["admitted"] == 1


def test_refusal_log_record_carries_hints_and_decision(env, caplog):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    with caplog.at_level("INFO", logger="numa_agent.service"):
        with pytest.raises(NoCapacity):
            service.admit(AdmitRequest(name="big", cpus=10, policy="single-numa-node"), ME)
        service.admit(AdmitRequest(name="ok", cpus=2), ME)
    # The service's own warning: on a host out of inotify instances the enforcer warns too.
    refused = next(r for r in caplog.records if r.name == "numa_agent.service" and r.levelname == "WARNING")
    text = refused.getMessage()
    assert "refused big" in text and "TopologyAffinityError" in text
    assert "hints: cpu/cpu: {0,1} preferred" in text  # 10 CPUs need both nodes
    assert text.endswith("| merged: any")  # not preferred, under single-numa-node: as hints are written
    admitted = next(r for r in caplog.records if r.levelname == "INFO" and "admitted ok" in r.getMessage())
    # An admission's line skips the hints: summarising them costs every admission (the
    # dry run and the refusals show them).
    assert "hints:" not in admitted.getMessage()
    assert admitted.getMessage().endswith("| merged: {0} preferred")


def test_partitions_are_not_offered_below_a_non_partition_root(env, caplog):
    machine, state_dir, root = env
    with caplog.at_level("WARNING", logger="numa_agent.enforcement"):
        service, _ = start(machine, state_dir, root, partitions="isolated")
    assert service.enforcer.partitions == "off"
    assert "is not a partition root" in caplog.text
    service.admit(AdmitRequest(name="m", cpus=2), ME)
    assert cg_file(root, "wl-m", "cpuset.cpus.partition") == "member"


def test_exclusive_workloads_become_isolated_partitions_where_allowed(env):
    machine, state_dir, root = env
    CgroupV2(root, SimulatedCgroupfs(root)).set_partition("", "root")  # the administrator's decision
    service, _ = start(machine, state_dir, root, partitions="isolated")
    assert service.enforcer.partitions == "isolated"
    cpus = CpuSet.parse(service.admit(AdmitRequest(name="p", cpus=2), ME)["cpus"])
    assert cg_file(root, "wl-p", "cpuset.cpus.partition") == "isolated"
    # the partition's CPUs left the root's effective set; the pool never had them
    assert CpuSet.parse(cg_file(root, "", "cpuset.cpus.effective")).isdisjoint(cpus)
    assert CpuSet.parse(cg_file(root, "shared", "cpuset.cpus.effective")).isdisjoint(cpus)
    service.release("p", ME)
    assert not (root / "wl-p").exists()
    assert cpus.issubset(CpuSet.parse(cg_file(root, "shared", "cpuset.cpus.effective")))


class Crash(BaseException):
    """The agent dies (power loss, SIGKILL) in the middle of a step."""


def test_crash_after_checkpoint_before_cgroup_is_released_on_restart(env, sleepers, monkeypatch):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)

    def die(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(service.enforcer, "apply", die)
    with pytest.raises(Crash):
        service.admit(AdmitRequest(name="half", cpus=2), sleepers())
    assert [w["name"] for w in CheckpointStore(state_dir).load()["workloads"]] == ["half"]
    assert not (root / "wl-half").exists()
    service2, report = start(machine, state_dir, root)
    assert report.released == ("half",)
    assert service2.state.workloads == ()
    assert len(CpuSet.parse(cg_file(root, "shared", "cpuset.cpus"))) == 16


def test_missing_checkpoint_is_rebuilt_from_the_cgroup_tree(env, sleepers):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    a = CpuSet.parse(service.admit(AdmitRequest(name="a", cpus=2), sleepers())["cpus"])
    side = service.admit(AdmitRequest(name="side", shared=True), sleepers())
    (state_dir / "checkpoint.json").unlink()  # lost with the disk it was on,
    (state_dir / "checkpoint.json.prev").unlink(missing_ok=True)  # both generations of it
    service2, report = start(machine, state_dir, root)
    assert sorted(report.adopted) == ["a", "side"]
    assert service2.state.workload("a").booking.cpus == a
    assert service2.state.workload("side").shared
    assert CheckpointStore(state_dir).load()["workloads"]  # written again at once
    assert side["cpus"]


def test_owners_are_named_beside_their_uid(env):
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    asked = []
    service.user_name = lambda uid: asked.append(uid) or {1000: "alice"}.get(uid)
    service.admit(AdmitRequest(name="a", cpus=1, pod="p", pod_budget=PodBudget(cpus=2)), ME)
    service.admit(AdmitRequest(name="b", cpus=1, pod="p"), ME)
    service.admit(AdmitRequest(name="c", cpus=1), Caller(pid=os.getpid(), uid=1001, gid=1001))
    status = service.status()
    assert [(w["name"], w["owner_uid"], w["owner"]) for w in status["workloads"]] == [
        ("a", 1000, "alice"), ("b", 1000, "alice"), ("c", 1001, None)]
    assert [(p["owner_uid"], p["owner"]) for p in status["pods"]] == [(1000, "alice")]
    assert sorted(asked) == [1000, 1001]  # once per uid, not per workload
    assert [w["owner"] for w in service.list_workloads()] == ["alice", "alice", None]


def test_the_system_user_database_names_root_and_not_an_unused_uid():
    assert system_user_name(0) == "root"
    assert system_user_name(2**31 - 3) is None


def test_command_lines_are_shown_only_to_root_and_the_owner(env):
    """A command line can carry a password: another member of the socket group
    sees the workload and its CPUs, not what it runs."""
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    secret = ["db", "--password=hunter2"]
    service.admit(AdmitRequest(name="theirs", cpus=1, command=secret), ME)
    other = 1001
    for view in (service.status(other)["workloads"], service.list_workloads(other)):
        (w,) = view
        assert w["name"] == "theirs" and w["cpus"] and w["command"] is None
    assert service.list_workloads(ME.uid)[0]["command"] == secret
    assert service.status(0)["workloads"][0]["command"] == secret
    assert service.list_workloads()[0]["command"] == secret  # the agent's own views (metrics)


def test_topology_document_names_devices_from_the_pci_ids_given(env, tmp_path):
    from numa_agent.discovery.pci_ids import PciIdsFile
    from numa_agent.service.agent_service import AgentService

    ids = tmp_path / "pci.ids"
    ids.write_text("10de  NVIDIA Corporation\n\t20b0  GA100 [A100 SXM4 40GB]\n"
                   "C 03  Display controller\n\t02  3D controller\n")
    machine, state_dir, _ = env
    store = CheckpointStore(state_dir)
    (plain,) = AgentService(machine, store, None).topology()["pci_devices"]
    (named,) = AgentService(machine, store, None, pci_names=PciIdsFile([str(ids)])).topology()["pci_devices"]
    keys = ("kind", "class_name", "vendor_name", "device_name")
    assert [plain[k] for k in keys] == ["gpu", None, None, None]
    assert [named[k] for k in keys] == ["gpu", "3D controller", "NVIDIA Corporation", "GA100 [A100 SXM4 40GB]"]


def test_a_requests_numa_allocation_strategy_places_and_is_kept(env):
    """The API's numa_allocation_strategy reaches the merge and the workload's
    request; the next admission under the configured none goes back to node 0."""
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    first = service.admit(AdmitRequest(name="a", cpus=2), ME)
    spread = service.admit(AdmitRequest(name="b", cpus=2, numa_allocation_strategy="least-allocated"), ME)
    assert machine.nodes_of(CpuSet.parse(first["cpus"])) == (0,)
    assert machine.nodes_of(CpuSet.parse(spread["cpus"])) == (1,)
    saved = {w["name"]: w for w in CheckpointStore(state_dir).load()["workloads"]}
    assert saved["b"]["request"]["numa_allocation_strategy"] == "least-allocated"
    assert "numa_allocation_strategy" not in saved["a"]["request"]
