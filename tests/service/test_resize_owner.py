"""A resize through the service: checked against the quota of the workload's
owner whoever asks, and a workload that cannot be resized answers
`not_resizable`, not another code."""

import os

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.quota import Limits, Owner, Quotas
from numa_agent.api.refusals import api_error
from numa_agent.core.caller import Caller
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.service import refusals
from numa_agent.service.requests import AdmitRequest
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology

ROOT = Caller(pid=os.getpid(), uid=0, gid=0)
OWNERS = {1000: Owner(1000, "alice", ("alice", "hpc")), 0: Owner(0, "root", ("root",))}


@pytest.fixture
def service(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig(reserved_cpu_count=0))
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    quotas = Quotas(users={"alice": Limits(cpus=4)})
    return start(machine, tmp_path / "state", cg_root,
                 service_options={"quotas": quotas, "owner": lambda uid: OWNERS.get(uid, Owner(uid))})[0]


def test_root_resizing_a_users_workload_is_held_to_that_users_quota(service, sleepers):
    service.admit(AdmitRequest(name="a", cpus=2), sleepers(uid=1000))
    with pytest.raises(refusals.OverQuota) as err:
        service.resize("a", ROOT, cpus=6)
    assert "alice holds 2 and the request asks 4 more" in err.value.message
    assert len(service.state.workload("a").booking.cpus) == 2
    assert len(service.resize("a", ROOT, cpus=4)["cpus"].split(",")) >= 1  # at the limit: admitted


def test_a_workload_that_named_its_cpus_is_not_resizable(service, sleepers):
    service.admit(AdmitRequest(name="pinned", physcpubind="2-3"), sleepers(uid=1000))
    with pytest.raises(refusals.ServiceRefusal) as err:
        service.resize("pinned", ROOT, cpus=4)
    answered = api_error(err.value)
    assert (answered.status, answered.code) == (409, "not_resizable")
