"""A release that cannot be checkpointed (read-only or full state
filesystem): the real EventLoop and AgentService with a fake enforcer and a
store whose writes fail while told so. Time is a fake clock the test moves;
the loop is stepped without waiting, so what is counted is attempts per
stretch of (fake) time, never wall-clock durations."""

from __future__ import annotations

import logging
import os
import selectors

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.daemon.runtime import RETRY_CAP, RETRY_FIRST, EventLoop, _sync_fds, _workload_at
from numa_agent.enforcement.plan import CgroupSpec
from numa_agent.service.agent_service import AgentService
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore, CheckpointWriteError
from numa_agent.state.model import AgentState, Workload
from numa_agent.views.metrics import build_registry
from tests.service.test_agent_service import make_machine

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ReadOnlyStore(CheckpointStore):
    """A real store whose writes fail with EROFS while `read_only` is set."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.read_only = False
        self.attempts = 0

    def commit(self, state, *, snapshot=False):
        self.attempts += 1
        if self.read_only:
            raise CheckpointWriteError(f"saving checkpoint {self.path} failed: EROFS (Read-only file system); "
                                       "the previous checkpoint is unchanged")
        return super().commit(state, snapshot=snapshot)


class FakeEnforcer:
    """One descriptor per workload, readable once its process 'exited'.
    `stuck`: it stays readable (a pidfd, affinity mode); else reading the
    event consumes it (inotify, cgroup mode)."""

    mode = "fake"
    reason = None

    def __init__(self, stuck: bool) -> None:
        self.stuck = stuck
        self.pipes: dict[str, tuple[int, int]] = {}
        self.exited: set[str] = set()

    def apply(self, old, new, move=None, changed=None):
        for rel in new:
            if rel.startswith("wl-") and rel not in self.pipes:
                self.pipes[rel] = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for rel in set(self.pipes) - set(new):
            for fd in self.pipes.pop(rel):
                os.close(fd)

    def prune(self, layout):
        return []

    def path_of(self, rel):
        return None

    def populated(self, rel):
        return rel in self.pipes and rel not in self.exited

    def exit(self, rel):
        self.exited.add(rel)
        os.write(self.pipes[rel][1], b"x")

    def fds(self):
        return sorted(r for r, _ in self.pipes.values())

    def released(self, ready):
        out = []
        for rel, (r, _) in sorted(self.pipes.items()):
            if r in ready:
                if not self.stuck:
                    os.read(r, 100)
                out.append(rel)
        return out

    def close(self):
        for pipe in self.pipes.values():
            for fd in pipe:
                os.close(fd)


@pytest.fixture(params=["affinity (stuck pidfd)", "cgroup (event consumed)"])
def rig(request, tmp_path):
    clock = Clock()
    enforcer = FakeEnforcer(stuck=request.param.startswith("affinity"))
    store = ReadOnlyStore(tmp_path / "state")
    service = AgentService(make_machine(), store, enforcer, clock=clock)
    service.install(AgentState(policy_fingerprint=service.machine.policy.fingerprint()))
    for name in ("a", "b"):
        service.admit(AdmitRequest(name=name, cpus=2), ME)
    loop = EventLoop(service, clock=clock)
    loop.open()
    yield clock, enforcer, store, service, loop
    loop.close()
    enforcer.close()


def run_for(loop: EventLoop, clock: Clock, seconds: float, tick: float = 0.01) -> None:
    """`seconds` of fake time in steps of `tick`, never waiting."""
    for _ in range(round(seconds / tick)):
        clock.now += tick
        assert loop.step(max_wait=0)


def retries_within(seconds: float) -> int:
    """How many retries the backoff allows in `seconds` after the first failure."""
    count, at, wait = 0, RETRY_FIRST, RETRY_FIRST
    while at <= seconds:
        count += 1
        wait = min(wait * 2, RETRY_CAP)
        at += wait
    return count


def test_a_failing_release_backs_off_logs_once_and_recovers(rig, caplog):
    clock, enforcer, store, service, loop = rig
    store.read_only = True
    enforcer.exit("wl-a")
    before = store.attempts
    with caplog.at_level(logging.DEBUG):
        caplog.clear()
        run_for(loop, clock, 30.0)  # 3000 loop steps
    attempts = store.attempts - before
    assert 1 <= attempts <= 1 + retries_within(30.0)  # not one per step
    assert service.state.workload("a") is not None and loop.pending == {"wl-a": "a"}
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in loud if r.name == "numa_agent.service"]) == 1  # failing: once
    assert len([r for r in loud if r.name == "numa_agent.runtime"]) == 1

    health = service.health()
    assert health["status"] == "degraded"
    assert str(store.directory) in health["degraded_reason"] and "EROFS" in health["degraded_reason"]
    assert health["checkpoint"]["healthy"] is False and health["checkpoint"]["pending_releases"] == 1
    metrics = scrape(service)
    assert metrics["numa_agent_checkpoint_healthy"] == 0.0
    assert metrics["numa_agent_pending_releases"] == 1.0
    assert metrics["numa_agent_checkpoint_failures_total"] == service.counters.checkpoint_failures_total > 0

    store.read_only = False
    with caplog.at_level(logging.INFO):
        caplog.clear()
        run_for(loop, clock, RETRY_CAP + 0.1)
    assert service.state.workload("a") is None and loop.pending == {}
    assert service.state.workload("b") is not None
    assert service.health()["status"] == "ok" and service.health()["checkpoint"]["healthy"] is True
    assert scrape(service)["numa_agent_checkpoint_healthy"] == 1.0
    assert scrape(service)["numa_agent_pending_releases"] == 0.0
    recovered = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in recovered if r.name == "numa_agent.service"]) == 1  # recovered: one line
    assert len([r for r in recovered if r.name == "numa_agent.runtime"]) == 1


def test_other_exits_during_the_outage_are_released_too(rig):
    clock, enforcer, store, service, loop = rig
    store.read_only = True
    enforcer.exit("wl-a")
    run_for(loop, clock, 2.0)
    enforcer.exit("wl-b")
    run_for(loop, clock, 2.0)
    assert set(loop.pending) <= {"wl-a", "wl-b"} and "wl-a" in loop.pending
    store.read_only = False
    run_for(loop, clock, 2 * RETRY_CAP)
    assert service.state.workloads == () and loop.pending == {}


def test_a_workload_released_by_its_owner_meanwhile_is_no_longer_pending(rig):
    clock, enforcer, store, service, loop = rig
    store.read_only = True
    enforcer.exit("wl-a")
    run_for(loop, clock, 1.0)
    store.read_only = False
    service.release("a", ME)
    run_for(loop, clock, RETRY_CAP + 0.1)
    assert loop.pending == {} and service.state.workload("a") is None


def scrape(service) -> dict[str, float]:
    out = {}
    for family in build_registry(service.metrics_snapshot, version="t").collect():
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


# ---- O(change) per event ------------------------------------------------------------------
class CountingSelector(selectors.PollSelector):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def register(self, fileobj, events, data=None):
        self.calls += 1
        return super().register(fileobj, events, data)

    def unregister(self, fileobj):
        self.calls += 1
        return super().unregister(fileobj)


def test_sync_touches_only_descriptors_that_came_or_went():
    pipes = [os.pipe() for _ in range(200)]
    sel = CountingSelector()
    try:
        registered = _sync_fds(sel, set(), [r for r, _ in pipes])
        sel.calls = 0
        registered = _sync_fds(sel, registered, [r for r, _ in pipes[1:]] + [pipes[0][1]])
        assert sel.calls == 2
        registered = _sync_fds(sel, registered, [r for r, _ in pipes[1:]] + [pipes[0][1]])
        assert sel.calls == 2
    finally:
        sel.close()
        for pipe in pipes:
            for fd in pipe:
                os.close(fd)


def test_a_descriptor_number_closed_and_reused_at_once_is_watched_as_the_new_file():
    old_r, old_w = os.pipe()
    sel = selectors.PollSelector()
    try:
        registered = _sync_fds(sel, set(), [old_r])
        os.close(old_r)
        new_r, new_w = os.pipe()  # the lowest free number: the one just closed
        assert new_r == old_r
        registered = _sync_fds(sel, registered, [new_r])  # same number: nothing re-registered
        os.write(new_w, b"x")
        assert [key.fd for key, _ in sel.select(0)] == [new_r]
        os.close(new_r)
        os.close(new_w)
    finally:
        sel.close()
        os.close(old_w)


def test_a_workload_is_found_from_its_path_without_a_map_of_all():
    state = AgentState()
    for w in (Workload(name="db", owner_uid=0), Workload(name="wl-x", owner_uid=0),
              Workload(name="web", owner_uid=0, shared=True), Workload(name="m", owner_uid=0, pod="p"),
              Workload(name="ctr", owner_uid=0, cgroup="/libpod_parent/libpod-1")):
        state = state.with_workload(w)
    # An engine's cgroup says no name: the layout's entry for it does.
    layout = {"/libpod_parent/libpod-1": CgroupSpec("/libpod_parent/libpod-1", CpuSet(), (0,), workload="ctr"),
              "/libpod_parent/libpod-2": CgroupSpec("/libpod_parent/libpod-2", CpuSet(), (0,), workload="db")}
    assert _workload_at(state, "/libpod_parent/libpod-1", layout).name == "ctr"
    assert _workload_at(state, "/libpod_parent/libpod-2", layout) is None  # db is not enforced there
    assert _workload_at(state, "/libpod_parent/libpod-3", layout) is None
    assert _workload_at(state, "wl-db", layout).name == "db"
    assert _workload_at(state, "wl-wl-x", layout).name == "wl-x"
    assert _workload_at(state, "shared/web", layout).name == "web"
    assert _workload_at(state, "pod-p/m", layout).name == "m"
    assert _workload_at(state, "wl-web", layout) is None  # web is shared: not its path
    assert _workload_at(state, "shared/db", layout) is None and _workload_at(state, "pod-q/m", layout) is None
    assert _workload_at(state, "nobody", layout) is None and _workload_at(state, "wl-zz", layout) is None


def test_a_pending_workload_that_is_populated_again_is_not_released(rig):
    clock, enforcer, store, service, loop = rig
    store.read_only = True
    enforcer.exit("wl-a")
    run_for(loop, clock, 1.0)
    assert "wl-a" in loop.pending
    enforcer.populated = lambda rel: True  # a process moved into its cgroup meanwhile
    store.read_only = False
    run_for(loop, clock, RETRY_CAP + 0.1)
    assert "wl-a" not in loop.pending
    if enforcer.stuck:  # its pidfd still says it exited: released once it is asked again
        assert service.state.workload("a") is None
    else:
        assert service.state.workload("a") is not None
