"""Quotas in the service: a request over its owner's [quotas] limit is a 403
naming the quota, the accounting survives a restart, a lowered limit evicts
nothing, and status and metrics show each owner's use and limits."""

import os

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.quota import Limits, Owner, Quotas
from numa_agent.api.refusals import api_error
from numa_agent.core.caller import Caller
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.service.refusals import OverQuota
from numa_agent.service.requests import AdmitRequest
from tests.support.metrics_service import scrape
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology

ROOT = Caller(pid=os.getpid(), uid=0, gid=0)
OWNERS = {1000: Owner(1000, "alice", ("alice", "hpc")), 1001: Owner(1001, "bob", ("bob",)),
          0: Owner(0, "root", ("root",))}


def owner(uid):
    return OWNERS.get(uid, Owner(uid))


@pytest.fixture
def env(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig(reserved_cpu_count=0))
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])

    def run(quotas):
        return start(machine, tmp_path / "state", cg_root,
                     service_options={"quotas": quotas, "owner": owner})[0]

    return run


def alice(sleepers):
    return sleepers(uid=1000)


def test_a_request_over_its_quota_is_a_403_naming_the_quota(env, sleepers):
    service = env(Quotas(default=Limits(cpus=1), groups={"hpc": Limits(cpus=4)}))
    service.admit(AdmitRequest(name="a", cpus=2), alice(sleepers))
    service.admit(AdmitRequest(name="b", cpus=2), alice(sleepers))  # exactly at the limit
    for dry_run in (True, False):
        with pytest.raises(OverQuota) as err:
            service.admit(AdmitRequest(name="c", cpus=1), alice(sleepers), dry_run=dry_run)
        answered = api_error(err.value)  # as the API answers it
        assert answered.status == 403 and answered.code == "quota_exceeded"
        reason = "quota groups.hpc: cpus limit 4; alice holds 4 and the request asks 1 more"
        assert err.value.message == reason
        details = err.value.details
        assert details["reason"] == reason and details["reason_code"] == "quota_exceeded"
        assert details["quota"] == {"entry": "groups.hpc", "resource": "cpus", "limit": 4, "held": 4, "asked": 1}
    assert service.state.workload("c") is None
    assert service.counters.snapshot()["admission_errors_total"] == {"quota_exceeded": 2}
    # root is not limited by default or by a group
    service.admit(AdmitRequest(name="r", cpus=4), ROOT)


def test_a_restart_keeps_the_accounting(env, sleepers):
    quotas = Quotas(users={"alice": Limits(cpus=2)})
    env(quotas).admit(AdmitRequest(name="a", cpus=2), alice(sleepers))
    restarted = env(quotas)
    with pytest.raises(OverQuota, match="quota users.alice: cpus limit 2; alice holds 2"):
        restarted.admit(AdmitRequest(name="b", cpus=1), alice(sleepers))


def test_a_quota_lowered_under_what_is_held_evicts_nothing_and_refuses_more(env, sleepers):
    env(Quotas()).admit(AdmitRequest(name="a", cpus=4, memory_bytes=1 << 30), alice(sleepers))
    lowered = env(Quotas(default=Limits(cpus=2)))
    assert lowered.state.workload("a") is not None
    [use] = lowered.status()["quotas"]
    assert use["cpus"] == {"used": 4, "limit": 2, "entry": "default"}
    lowered.admit(AdmitRequest(name="shared", memory_bytes=1 << 30), alice(sleepers))  # adds no CPU
    with pytest.raises(OverQuota, match="quota default: cpus limit 2; alice holds 4 and the request asks 1"):
        lowered.admit(AdmitRequest(name="b", cpus=1), alice(sleepers))


def test_status_shows_each_owners_use_and_limits(env, sleepers):
    service = env(Quotas(default=Limits(cpus=8, memory_bytes=4 << 30)))
    service.admit(AdmitRequest(name="a", cpus=2, memory_bytes=1 << 30), alice(sleepers))
    service.admit(AdmitRequest(name="r", cpus=1), ROOT)
    assert service.status()["quotas"] == [
        {"owner_uid": 0, "owner": "root", "cpus": {"used": 1, "limit": None, "entry": None},
         "memory_bytes": {"used": 0, "limit": None, "entry": None}, "devices": {}},
        {"owner_uid": 1000, "owner": "alice", "cpus": {"used": 2, "limit": 8, "entry": "default"},
         "memory_bytes": {"used": 1 << 30, "limit": 4 << 30, "entry": "default"}, "devices": {}}]


def test_metrics_only_for_owners_with_a_quota(env, sleepers):
    service = env(Quotas(users={"alice": Limits(cpus=8)}))
    service.admit(AdmitRequest(name="a", cpus=2, memory_bytes=1 << 30), alice(sleepers))
    service.admit(AdmitRequest(name="r", cpus=1), ROOT)
    quota = {key: value for key, value in scrape(service).items() if key[0].startswith("numa_agent_quota_")}
    assert quota == {
        ("numa_agent_quota_used", (("owner", "alice"), ("resource", "cpus"))): 2.0,
        ("numa_agent_quota_limit", (("owner", "alice"), ("resource", "cpus"))): 8.0}


def test_the_user_database_gives_an_owners_name_and_groups():
    from numa_agent.service.caller import system_owner, unknown_quota_names

    root = system_owner(0)
    assert root.uid == 0 and root.name == "root" and "root" in root.groups
    unknown = 2**31 - 7  # no passwd entry: no name, no group, so only `default` applies
    assert system_owner(unknown) == Owner(unknown)
    assert unknown_quota_names(Quotas(users={"root": Limits(), "no-such-user-q25": Limits()},
                                      groups={"root": Limits(), "no-such-group-q25": Limits()})) == [
        "quotas.users.no-such-user-q25: no user named 'no-such-user-q25' in the user database",
        "quotas.groups.no-such-group-q25: no group named 'no-such-group-q25' in the user database"]


def test_a_pod_counts_its_budget_once_against_its_first_members_owner(env, sleepers):
    from numa_agent.service.requests import PodBudget

    service = env(Quotas(groups={"hpc": Limits(cpus=4)}))
    service.admit(AdmitRequest(name="main", pod="p", cpus=2, pod_budget=PodBudget(cpus=4)), alice(sleepers))
    service.admit(AdmitRequest(name="side", pod="p", cpus=2), alice(sleepers))  # inside the budget
    with pytest.raises(OverQuota) as err:
        service.admit(AdmitRequest(name="solo", cpus=1), alice(sleepers))
    assert err.value.details["quota"] == {"entry": "groups.hpc", "resource": "cpus", "limit": 4, "held": 4,
                                          "asked": 1}
    with pytest.raises(OverQuota):
        service.admit(AdmitRequest(name="big", pod="q", cpus=1, pod_budget=PodBudget(cpus=5)), alice(sleepers))
    assert service.state.workload("big") is None and service.state.pod("q") is None
