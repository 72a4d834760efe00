"""Names an engine derives cannot be taken first by another user (issue 36): a Slurm
task's name carries its job's user, a container's only the OCI hook (root) takes."""

from __future__ import annotations

import os

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.slurm import SlurmTask
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.service.refusals import InConflict, NotPermitted
from numa_agent.service.requests import AdmitRequest
from tests.service.test_agent_service import make_machine
from tests.support.simulated_service import start

ALICE = Caller(pid=os.getpid(), uid=1000, gid=1000)
MALLORY = Caller(pid=os.getpid(), uid=1001, gid=1001)
ROOT = Caller(pid=os.getpid(), uid=0, gid=0)


@pytest.fixture
def service(tmp_path):
    machine = make_machine()
    root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    return start(machine, tmp_path / "state", root)[0]


def test_another_user_cannot_take_a_slurm_tasks_name_first(service):
    name = SlurmTask("12", "0", "0").workload_name(ALICE.uid)  # what numa-run derives for Alice's job
    for squat in (name, name.removesuffix(f"-u{ALICE.uid}")):  # also the form before the uid
        with pytest.raises(NotPermitted, match="Slurm task's name"):
            service.admit(AdmitRequest(name=squat, shared=True), MALLORY)
    assert service.state.workloads == ()  # the shared booking (no quota) was not made
    assert service.admit(AdmitRequest(name=name, cpus=1), ALICE)["name"] == name


def test_the_same_user_reuses_its_own_names_as_before(service):
    name = SlurmTask("12", "0", "0").workload_name(ALICE.uid)
    service.admit(AdmitRequest(name=name, shared=True), ALICE)
    with pytest.raises(InConflict, match="already exists"):  # one booking a name, as before
        service.admit(AdmitRequest(name=name, shared=True), ALICE)
    service.release(name, ALICE)
    service.admit(AdmitRequest(name=name, shared=True), ALICE)
    # Mallory's own Slurm task of job 13, and free-form names, are hers as before.
    mine = SlurmTask("13", "0", "0").workload_name(MALLORY.uid)
    assert service.admit(AdmitRequest(name=mine, shared=True), MALLORY)["name"] == mine
    assert service.admit(AdmitRequest(name="slurm-web", shared=True), MALLORY)["name"] == "slurm-web"


def test_a_containers_name_is_for_the_oci_hook_only(service):
    with pytest.raises(NotPermitted, match="container's name"):
        service.admit(AdmitRequest(name="ctr-0123456789ab", shared=True), MALLORY)
    assert service.admit(AdmitRequest(name="ctr-0123456789ab", shared=True), ROOT)["name"] == "ctr-0123456789ab"
    assert service.admit(AdmitRequest(name="ctr-web", shared=True), MALLORY)["name"] == "ctr-web"


def test_a_sandboxs_pod_is_for_the_oci_hook_only(service):
    from numa_agent.service.requests import PodBudget
    with pytest.raises(NotPermitted, match="sandbox's pod"):
        service.admit(AdmitRequest(name="first", cpus=1, pod="sbx-0123456789ab-db",
                                   pod_budget=PodBudget(cpus=2)), MALLORY)
    assert service.state.pods == ()
