"""Enforcing on an engine's cgroup is a capability the affinity enforcer lacks:
the service asks for it (engines_of) and, without it, answers as it did when
the affinity enforcer stubbed the role: the same one-line 400s."""

from __future__ import annotations

import os

import pytest

from numa_agent.core.caller import Caller
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.service.refusals import InvalidInput
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.service.test_rebuild import machine_of


@pytest.fixture
def service(tmp_path):
    m = machine_of(cpus=2, reserved=1)
    store = CheckpointStore(tmp_path / "state")
    enforcer = AffinityEnforcer("no cgroup v2 here (test)")
    service = AgentService(m, store, enforcer)
    service.install(restore(m, store, enforcer)[0])  # adopts no engine's cgroup: it has none
    yield service
    enforcer.close()


def test_a_named_engine_cgroup_is_refused_in_affinity_mode(service):
    root = Caller(pid=os.getpid(), uid=0, gid=0)
    with pytest.raises(InvalidInput, match=r"^cgroup /kubepods/pod-a/c1: cannot enforce on the engine's cgroup "
                                             r"/kubepods/pod-a/c1: this agent pins with sched_setaffinity "
                                             r"\(no cgroup v2 here \(test\)\); that needs a cgroup v2 cpuset$"):
        service.admit(AdmitRequest(name="c1", cpus=1, cgroup="/kubepods/pod-a/c1"), root)


def test_in_place_is_refused_in_affinity_mode(service):
    me = Caller(pid=os.getpid(), uid=1000, gid=1000)
    with pytest.raises(InvalidInput, match=rf"^in_place: pid {os.getpid()} is in cgroup \(none\), "
                                             r"not below an engine's cgroup$"):
        service.admit(AdmitRequest(name="task", cpus=1, in_place=True), me)
