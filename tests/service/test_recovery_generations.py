"""restore() uses the previous checkpoint generation when the current one is
truncated, bit-flipped, emptied or deleted, moves the damaged one aside and
says which generation it used."""

from __future__ import annotations

import logging
import os

import pytest

from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.service.test_agent_service import env  # noqa: F401  (a fixture)
from tests.state.test_checkpoint_generations import DAMAGE
from tests.support.simulated_service import start


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_restore_uses_the_previous_generation(env, sleepers, how, caplog):  # noqa: F811
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.store.compact_every = 0  # every commit a snapshot: one generation per change
    a = service.admit(AdmitRequest(name="a", cpus=2), sleepers())["cpus"]
    service.admit(AdmitRequest(name="b", cpus=2), sleepers())
    service.release("b", None)
    # current: [a]; previous: [a, b] (b's cgroup is gone: released at restore)
    DAMAGE[how](state_dir / "checkpoint.json")
    with caplog.at_level(logging.ERROR, logger="numa_agent.recovery"):
        service2, report = start(machine, state_dir, root)
    assert report.generation == "checkpoint.json.prev"
    assert report.adopted == () and report.released == ("b",)
    w = service2.state.workload("a")
    assert w is not None and w.booking.cpus.format() == a and "adopted" not in w.request
    assert "using the previous generation" in caplog.text
    if how == "deleted":
        assert report.quarantined is None and "is missing" in caplog.text
    else:
        assert report.quarantined and os.path.basename(report.quarantined).startswith(
            "checkpoint.json.corrupt-")
        assert "rebuilding from the cgroup tree" not in caplog.text
    # what was installed is the new current generation; the previous one is kept
    assert [x["name"] for x in CheckpointStore(state_dir).load()["workloads"]] == ["a"]
    assert (state_dir / "checkpoint.json.prev").exists()


def test_restore_reports_the_current_generation_when_it_is_good(env):  # noqa: F811
    machine, state_dir, root = env
    start(machine, state_dir, root)
    _, report = start(machine, state_dir, root)
    assert report.generation == "checkpoint.json" and report.quarantined is None


def test_a_previous_generation_that_does_not_decode_is_moved_aside_too(env, caplog):  # noqa: F811
    machine, state_dir, root = env
    store = CheckpointStore(state_dir)
    store.save({"schema": 99})
    store.save({"schema": 99})
    (state_dir / "checkpoint.json").write_text("")
    enforcer = CgroupEnforcer(CgroupV2(root, SimulatedCgroupfs(root)))
    enforcer.setup()
    state, report = restore(machine, store, enforcer)
    assert state.workloads == () and report.generation is None
    assert not (state_dir / "checkpoint.json").exists()
    assert not (state_dir / "checkpoint.json.prev").exists()
    names = sorted(p.name for p in state_dir.iterdir())
    assert any(n.startswith("checkpoint.json.corrupt-") for n in names)
    assert any(n.startswith("checkpoint.json.prev.corrupt-") for n in names)
    AgentService(machine, store, enforcer).install(state)
