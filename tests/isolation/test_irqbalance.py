"""irqbalance told to keep off isolated CPUs through its socket, and given its own set back."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon.runtime import RETRY_FIRST, WATCH_INTERVAL, EventLoop
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.isolation.keeper import IsolationKeeper
from numa_agent.isolation.knobs import ProcSysKnobs, SimulatedKnobs
from numa_agent.isolation.plan import IRQBALANCE, Holding, Knob, Target, plan
from numa_agent.service.refusals import NoCapacity
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.model import AgentState
from tests.isolation.test_keeper import step, workload
from tests.support.agent_process import wait_for
from tests.support.fake_irqbalance import FakeIrqbalance
from tests.support.isolation_tree import machine, snapshot
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology


@pytest.fixture
def run_dir():
    # A short path: a unix socket's name is limited to 107 bytes, tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="irqb"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tree(tmp_path):
    return machine(tmp_path)


def keeper_for(tree: Path, run: Path) -> IsolationKeeper:
    return IsolationKeeper(ProcSysKnobs(tree / "proc", tree / "sys", irqbalance_run=run))


def test_the_banned_set_is_its_original_and_every_cpu_isolating_irqs():
    knobs = [Knob(IRQBALANCE, "irqs")]
    holders = {"a": Holding(CpuSet.parse("4-5"), frozenset({"irqs"})),
               "b": Holding(CpuSet.parse("6"), frozenset({"irqs", "idle"})),
               "c": Holding(CpuSet.parse("7"), frozenset({"idle"}))}
    p = plan(holders, knobs, {}, {IRQBALANCE: "0"})
    assert p.target(IRQBALANCE) == Target(IRQBALANCE, "0,4-6", ("a", "b")) and p.originals == {IRQBALANCE: "0"}
    # The last holder gone: its original, recorded once, whatever it reads now.
    assert plan({}, knobs, p.originals, {IRQBALANCE: "0,4-6"}).target(IRQBALANCE) == Target(IRQBALANCE, "0")
    assert plan({"c": holders["c"]}, knobs, {}, {IRQBALANCE: "0"}).target(IRQBALANCE) is None


def test_irqbalance_follows_the_workload_and_returns_to_its_own_set(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    keeper = keeper_for(tree, run_dir)
    state = AgentState().with_workload(workload("a", "4-5", "irqs"))
    prepared = keeper.prepare(state)
    # Write-ahead: the original is recorded (to be checkpointed) before anything is sent.
    assert prepared.isolation.originals[IRQBALANCE] == "" and fake.requests == ["setup"]
    held = keeper.enforce(prepared)
    assert fake.banned == CpuSet.parse("4-5") and held.isolation.originals[IRQBALANCE] == ""
    assert keeper.report(held.workload("a")).done == ("irqs",)
    both = step(keeper, held.with_workload(workload("b", "6", "irqs")))
    assert fake.banned == CpuSet.parse("4-6")
    one = step(keeper, both.without_workload("a"))
    assert fake.banned == CpuSet.parse("6")
    released = step(keeper, one.without_workload("b"))
    assert fake.from_ui is None and fake.requests[-1] == "settings cpus NULL"  # its environment's set again
    assert not released.isolation
    fake.stop()


def test_a_banned_set_from_its_environment_is_kept_and_sent_back(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242, env_banned="0")
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    assert fake.banned == CpuSet.parse("0,4-5") and state.isolation.originals[IRQBALANCE] == "0"
    step(keeper, state.without_workload("a"))
    assert fake.banned == CpuSet.parse("0") and fake.requests[-1] == "settings cpus 0"
    fake.stop()


def test_a_restarted_irqbalance_is_told_again_and_restored(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    assert not keeper.lost(state)
    fake.stop()
    again = FakeIrqbalance(tree / "proc", run_dir, 4343)  # a new pid: it forgot the set
    assert keeper.lost(state)
    state = step(keeper, state)
    assert again.banned == CpuSet.parse("4-5") and not keeper.lost(state)
    assert state.isolation.originals[IRQBALANCE] == ""  # the original stays the first one recorded
    step(keeper, state.without_workload("a"))
    assert again.from_ui is None
    again.stop()


def test_irqbalance_that_refuses_us_is_said_and_strict_fails(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242, allowed_uid=os.getuid() + 1)
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    report = keeper.report(state.workload("a"))
    assert report.done == ("irqs",)  # the interrupts were moved
    [line] = [n for n in report.failed() if n.startswith(IRQBALANCE)]
    assert "did not answer" in line and IRQBALANCE not in state.isolation.originals
    assert "did not answer" in keeper.status(state)["irqbalance"]
    assert fake.requests == []
    fake.stop()


def test_irqbalance_without_its_socket_is_said(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    fake.stop(remove_comm=False)  # running, but its socket is gone
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    [line] = [n for n in keeper.report(state.workload("a")).failed() if n.startswith(IRQBALANCE)]
    assert f"{run_dir}/irqbalance4242.sock" in line


def test_without_irqbalance_there_is_nothing_to_do_or_say(tree, run_dir):
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    assert IRQBALANCE not in state.isolation.originals and keeper.report(state.workload("a")).not_done == ()
    assert "irqbalance" not in keeper.status(state)


def test_irqbalance_gone_before_the_restore_leaves_nothing_to_restore(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    fake.stop()
    released = step(keeper, state.without_workload("a"))
    assert not released.isolation and not keeper.restore_failures()


def test_a_snapshot_never_talks_to_this_machines_irqbalance(tree, run_dir):
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    keeper = IsolationKeeper(SimulatedKnobs(tree / "proc", tree / "sys"))
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    assert IRQBALANCE not in state.isolation.originals and fake.requests == []
    fake.stop()


@pytest.fixture
def service_env(tmp_path, run_dir):

    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    m = build_machine(topo, PolicyConfig())
    tree = machine(tmp_path / "machine", cpus=16)
    return m, tmp_path / "state", make_simulated_cgroup_root(tmp_path / "cg", m.usable_cpus, [0, 1]), tree, run_dir


def test_the_service_tells_a_restarted_irqbalance_again_on_its_retry(service_env):

    m, state_dir, root, tree, run = service_env
    me = Caller(pid=os.getpid(), uid=0, gid=0)  # only root (or a configured group) may ask for --isolate
    fake = FakeIrqbalance(tree / "proc", run, 4242)
    service, _ = start(m, state_dir, root, isolation=keeper_for(tree, run))
    out = service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"]), me)
    cpus = CpuSet.parse(out["cpus"])
    assert fake.banned == cpus and not out["isolation"]["not_done"]
    assert CheckpointStore(state_dir).load()["isolation"]["originals"][IRQBALANCE] == ""
    now = [1000.0]
    loop = EventLoop(service, clock=lambda: now[0])
    loop.open()
    # The loop wakes to look (nothing else may wake it); nothing is pending.
    assert loop._timeout(None) == WATCH_INTERVAL and not service.isolation_pending()
    fake.stop()
    again = FakeIrqbalance(tree / "proc", run, 4343)
    assert service.isolation_pending()
    for _ in range(3):  # the retry timer's first step
        assert loop.step(max_wait=0)
        now[0] += RETRY_FIRST
    assert again.banned == cpus and not service.isolation_pending()
    service.release("a", None)
    assert again.from_ui is None and "isolation" not in CheckpointStore(state_dir).load()
    loop.close()
    again.stop()


def test_strict_refuses_when_irqbalance_cannot_be_told(service_env):

    m, state_dir, root, tree, run = service_env
    fake = FakeIrqbalance(tree / "proc", run, 4242, allowed_uid=os.getuid() + 1)
    before = snapshot(tree / "proc" / "irq")
    service, _ = start(m, state_dir, root, isolation=keeper_for(tree, run))
    me = Caller(pid=os.getpid(), uid=0, gid=0)  # only root (or a configured group) may ask for --isolate
    with pytest.raises(NoCapacity) as info:
        service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"], isolate_strict=True), me)
    assert any(IRQBALANCE in line for line in info.value.details["isolation"])
    assert snapshot(tree / "proc" / "irq") == before and not service.state.workloads
    out = service.admit(AdmitRequest(name="b", cpus=2, isolate=["irqs"]), me)  # admitted, and said
    assert any("did not answer" in line for line in out["isolation"]["not_done"])
    fake.stop()


def test_the_running_loop_tells_a_restarted_irqbalance_again_unasked(service_env):
    """The loop thread waits on its descriptors; an admission made meanwhile does
    not wake it, so it must already be waking to look."""
    m, state_dir, root, tree, run = service_env
    fake = FakeIrqbalance(tree / "proc", run, 4242)
    service, _ = start(m, state_dir, root, isolation=keeper_for(tree, run))
    loop = EventLoop(service).start()
    try:
        out = service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"]),
                            Caller(pid=os.getpid(), uid=0, gid=0))
        fake.stop()
        again = FakeIrqbalance(tree / "proc", run, 4343)
        assert wait_for(lambda: again.banned == CpuSet.parse(out["cpus"]), timeout=30, interval=0.05)
    finally:
        loop.stop()
    again.stop()


def test_a_simulated_machine_has_no_daemon_to_watch(service_env):
    m, state_dir, root, tree, _ = service_env
    service, _ = start(m, state_dir, root, isolation=IsolationKeeper(SimulatedKnobs(tree / "proc", tree / "sys")))
    assert not service.isolation_watched()


def test_a_plan_lists_proc_once_to_find_irqbalance(tree, run_dir, monkeypatch):
    # knobs(), read() and write() each ask for the daemon: the pid found is confirmed by its
    # comm, and /proc is listed again only once that process is no longer irqbalance.
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    keeper = keeper_for(tree, run_dir)
    listed: list[Path] = []
    real_iterdir = Path.iterdir

    def counting(self):
        if self == tree / "proc":
            listed.append(self)
        return real_iterdir(self)
    monkeypatch.setattr(Path, "iterdir", counting)
    step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    assert fake.banned == CpuSet.parse("4-5") and len(listed) == 1
    fake.stop()
    again = FakeIrqbalance(tree / "proc", run_dir, 4343)  # restarted: the old pid is gone
    assert keeper.files.irqbalance.pid() == 4343 and len(listed) == 2
    again.stop()


def test_another_users_process_named_irqbalance_is_not_taken_for_it(tree, run_dir):
    """Anyone can run a program called irqbalance (its comm is the file's
    name): found first, it would stand for the daemon, which the agent then
    never tells (a restarted irqbalance with a higher pid keeps interrupts on
    isolated CPUs) and, with no socket to answer, fails --isolate-strict."""
    impostor = tree / "proc" / "100"
    impostor.mkdir(parents=True)
    (impostor / "comm").write_text("irqbalance\n")
    (impostor / "status").write_text("Name:\tirqbalance\nUid:\t54321\t54321\t54321\t54321\n"
                                     "Gid:\t54321\t54321\t54321\t54321\n")
    fake = FakeIrqbalance(tree / "proc", run_dir, 4242)
    keeper = keeper_for(tree, run_dir)
    state = step(keeper, AgentState().with_workload(workload("a", "4-5", "irqs")))
    assert fake.banned == CpuSet.parse("4-5")
    assert not [n for n in keeper.report(state.workload("a")).failed() if n.startswith(IRQBALANCE)]
    fake.stop()
