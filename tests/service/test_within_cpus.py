"""`within_cpus`: the caller narrows where its CPUs may be booked (numa-run passes the CPUs
Slurm's task/affinity bound a task to); inside an engine's grant or the agent's own pool,
never outside either."""

import os

import pytest

from numa_agent.api.errors import BadRequest
from numa_agent.api.validation import parse_admit_request
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.service.refusals import NoCapacity
from numa_agent.service.requests import AdmitRequest
from tests.service.test_engine_cgroup import Machine, engine_cpus, root_caller

TASK = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0"


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    yield m
    m.close()


def test_in_place_books_inside_both_the_grant_and_within_cpus(machine):
    proc = machine.container(TASK, parent_cpus="4-11")
    me = Caller(pid=proc.pid, uid=os.getuid(), gid=os.getgid())
    view = machine.service.admit(AdmitRequest(name="slurm-7-0-0", cpus=2, in_place=True, within_cpus="2-7"), me)
    cpus = CpuSet.parse(view["cpus"])
    assert len(cpus) == 2 and cpus.issubset(CpuSet.parse("4-7"))
    assert engine_cpus(machine, TASK) == cpus


def test_in_the_agents_own_tree_within_cpus_narrows_the_pool(machine):
    view = machine.service.admit(AdmitRequest(name="w", cpus=2, within_cpus="12-15"), root_caller())
    assert CpuSet.parse(view["cpus"]).issubset(CpuSet.parse("12-15"))


def test_too_few_cpus_within_is_refused_naming_them(machine):
    with pytest.raises(NoCapacity, match=r"inside within_cpus 14-15"):
        machine.service.admit(AdmitRequest(name="w", cpus=4, within_cpus="14-15"), root_caller())
    assert machine.service.state.workloads == ()


@pytest.mark.parametrize("body, message", [
    (b'{"cpus": 1, "within_cpus": "x"}', "not a CPU list"),
    (b'{"cpus": 1, "within_cpus": ""}', "names no CPU"),
])
def test_bad_within_cpus_are_refused_at_the_api(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_admit_request(body)


def test_within_cpus_is_normalised():
    assert parse_admit_request(b'{"cpus": 1, "within_cpus": "5,3-4"}').within_cpus == "3-5"
