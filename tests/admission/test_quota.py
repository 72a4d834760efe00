"""Quotas (admission/quota.py): which [quotas] entry limits an owner, what an
owner holds (derived from the state, followed through changes), and the rule
refusing a decision that takes an owner over its limit."""

import pytest

from numa_agent.admission.admit import Refusal, Request, Resources, decide, release
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.quota import (
    Limit,
    Limits,
    Owner,
    Quotas,
    check_quota,
    limits_for,
    owner_usage,
    quota_view,
)
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")
GIB = 1 << 30

ALICE = Owner(1000, "alice", ("alice", "hpc"))
BOB = Owner(1001, "bob", ("bob",))
ROOT = Owner(0, "root", ("hpc", "root"))

QUOTAS = Quotas(default=Limits(cpus=2, memory_bytes=4 * GIB),
                users={"alice": Limits(cpus=4)},
                groups={"hpc": Limits(cpus=6, memory_bytes=8 * GIB, devices={"gpu": 1})})


def machine():
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30,
                         hugepages_2m_per_node=64, devices=(GPU, GPU))
    return build_machine(topo, PolicyConfig(reserved_cpu_count=0, devices={"gpu": {"vendor": "0x10de"}}))


def req(name, owner=ALICE, **kw):
    res = {k: kw.pop(k) for k in ("cpus", "memory_bytes", "hugepages", "devices") if k in kw}
    return Request(name=name, owner_uid=owner.uid, pid=4242, resources=Resources(**res), **kw)


def admit(m, state, quotas, owner, request):
    """decide, then the quota rule, as the service runs them."""
    d = decide(m, state, request)
    check_quota(quotas, owner, state, d.state, d.explanation)
    return d.state


def test_the_most_specific_entry_wins_resource_by_resource():
    limits = limits_for(QUOTAS, ALICE)
    # users.alice names cpus; her group hpc names memory and gpu; default is beaten on all
    assert limits == {"cpus": Limit(4, "users.alice"), "memory_bytes": Limit(8 * GIB, "groups.hpc"),
                      "gpu": Limit(1, "groups.hpc")}
    assert limits_for(QUOTAS, BOB) == {"cpus": Limit(2, "default"), "memory_bytes": Limit(4 * GIB, "default")}


def test_a_user_in_two_groups_gets_the_most_generous_limit_of_each_resource():
    quotas = Quotas(groups={"a": Limits(cpus=8, memory_bytes=GIB), "b": Limits(cpus=4, memory_bytes=2 * GIB),
                            "c": Limits(cpus=8)})
    owner = Owner(1000, "alice", ("c", "b", "a"))
    # cpus: a and c tie at 8, the first by name (a) is named; memory: b's is larger
    assert limits_for(quotas, owner) == {"cpus": Limit(8, "groups.a"), "memory_bytes": Limit(2 * GIB, "groups.b")}
    # a group without an entry changes nothing
    assert limits_for(quotas, Owner(1000, "alice", ("b", "z"))) == {
        "cpus": Limit(4, "groups.b"), "memory_bytes": Limit(2 * GIB, "groups.b")}


def test_root_is_limited_only_by_users_root():
    assert limits_for(QUOTAS, ROOT) == {}  # neither default nor its group hpc
    named = Quotas(default=Limits(cpus=1), users={"root": Limits(cpus=3)})
    assert limits_for(named, ROOT) == {"cpus": Limit(3, "users.root")}


def test_a_uid_without_a_user_name_gets_only_default():
    nameless = Owner(4242)
    quotas = Quotas(default=Limits(cpus=1), users={"4242": Limits(cpus=9)}, groups={"hpc": Limits(cpus=9)})
    assert limits_for(quotas, nameless) == {"cpus": Limit(1, "default")}


def test_exactly_at_the_limit_is_admitted_and_one_more_refused():
    m = machine()
    quotas = Quotas(users={"alice": Limits(cpus=4)})
    state = admit(m, AgentState(), quotas, ALICE, req("a", cpus=2))
    state = admit(m, state, quotas, ALICE, req("b", cpus=2))  # 4 of 4
    assert owner_usage(state)[1000]["cpus"] == 4
    with pytest.raises(Refusal) as err:
        admit(m, state, quotas, ALICE, req("c", cpus=1))
    assert err.value.code == "quota_exceeded"
    assert err.value.message == "quota users.alice: cpus limit 4; alice holds 4 and the request asks 1 more"
    assert err.value.explanation["quota"] == {"entry": "users.alice", "resource": "cpus", "limit": 4,
                                              "held": 4, "asked": 1}
    # another owner is not limited by alice's holdings
    admit(m, state, quotas, BOB, req("d", owner=BOB, cpus=4))


def test_memory_counts_hugepages_and_is_told_in_binary_units():
    m = machine()
    quotas = Quotas(default=Limits(memory_bytes=GIB))
    state = admit(m, AgentState(), quotas, BOB, req("a", owner=BOB, memory_bytes=GIB - (64 << 20)))
    state = admit(m, state, quotas, BOB, req("b", owner=BOB, hugepages={2048: 32}))  # exactly 1 GiB
    with pytest.raises(Refusal, match=r"^quota default: memory limit 1 GiB; bob holds 1 GiB and the "
                                      r"request asks 2 MiB more$"):
        admit(m, state, quotas, BOB, req("c", owner=BOB, hugepages={2048: 1}))


def test_devices_are_counted_per_resource():
    m = machine()
    quotas = Quotas(groups={"hpc": Limits(devices={"gpu": 1})})
    state = admit(m, AgentState(), quotas, ALICE, req("a", devices={"gpu": 1}))
    with pytest.raises(Refusal, match="quota groups.hpc: gpu limit 1; alice holds 1"):
        admit(m, state, quotas, ALICE, req("b", devices={"gpu": 1}))


def test_a_pod_counts_its_budget_once_against_its_first_members_owner():
    m = machine()
    quotas = Quotas(default=Limits(cpus=4))
    budget = Resources(cpus=4, memory_bytes=GIB)
    state = admit(m, AgentState(), quotas, BOB, req("main", owner=BOB, pod="p", pod_budget=budget, cpus=2))
    state = admit(m, state, quotas, BOB, req("side", owner=BOB, pod="p", cpus=1))  # inside the budget
    state = admit(m, state, quotas, ROOT, req("helper", owner=ROOT, pod="p"))  # root joins bob's pod
    assert owner_usage(state) == {1001: {"cpus": 4, "memory_bytes": GIB}}
    with pytest.raises(Refusal, match="quota default: cpus limit 4; bob holds 4"):
        admit(m, state, quotas, BOB, req("more", owner=BOB, cpus=1))
    # the budget goes with the last member, and with it what bob holds
    for name in ("main", "side", "helper"):
        state = release(state, name)[0]
    assert owner_usage(state) == {}


def test_a_limit_below_what_is_held_refuses_only_what_adds_to_it():
    m = machine()
    state = admit(m, AgentState(), Quotas(), BOB, req("a", owner=BOB, cpus=4, memory_bytes=GIB))
    lowered = Quotas(default=Limits(cpus=2, memory_bytes=4 * GIB))
    # a shared workload adds no CPU: admitted; memory is within its limit
    state = admit(m, state, lowered, BOB, req("shared", owner=BOB, memory_bytes=GIB))
    with pytest.raises(Refusal, match="quota default: cpus limit 2; bob holds 4 and the request asks 1 more"):
        admit(m, state, lowered, BOB, req("b", owner=BOB, cpus=1))


def test_root_is_unlimited_unless_named():
    m = machine()
    quotas = Quotas(default=Limits(cpus=1), groups={"hpc": Limits(cpus=1)})
    state = admit(m, AgentState(), quotas, ROOT, req("a", owner=ROOT, cpus=8))
    named = Quotas(users={"root": Limits(cpus=8)})
    with pytest.raises(Refusal, match="quota users.root: cpus limit 8; root holds 8"):
        admit(m, state, named, ROOT, req("b", owner=ROOT, cpus=1))


def test_owner_usage_follows_admissions_and_releases_as_a_fresh_count_would():
    m = machine()
    state = AgentState()
    owner_usage(state)  # kept in the memo from here on, and followed
    owners = [ALICE, BOB, ROOT]
    for i in range(6):
        owner = owners[i % 3]
        state = decide(m, state, req(f"w{i}", owner=owner, cpus=1 + i % 2, memory_bytes=GIB // 4,
                                     devices={"gpu": 1} if i == 1 else {})).state
        if i == 3:
            state = release(state, "w0")[0]
    assert "owner_usage" in state.memo
    fresh = AgentState(workloads=state.workloads, pods=state.pods)
    assert owner_usage(state) == owner_usage(fresh) == {
        0: {"cpus": 3, "memory_bytes": GIB // 2},
        1000: {"cpus": 2, "memory_bytes": GIB // 4},
        1001: {"cpus": 3, "memory_bytes": GIB // 2, "gpu": 1}}


def test_the_view_of_an_owner_names_each_limit_and_its_entry():
    view = quota_view(QUOTAS, ALICE, {"cpus": 3, "memory_bytes": GIB})
    assert view == {"owner_uid": 1000, "owner": "alice",
                    "cpus": {"used": 3, "limit": 4, "entry": "users.alice"},
                    "memory_bytes": {"used": GIB, "limit": 8 * GIB, "entry": "groups.hpc"},
                    "devices": {"gpu": {"used": 0, "limit": 1, "entry": "groups.hpc"}}}
    assert quota_view(Quotas(), ROOT, {"cpus": 1})["cpus"] == {"used": 1, "limit": None, "entry": None}
