"""An admission does not pay for what only a person reads: the free resources before
it and every provider's hints join the explanation of a refusal, of a dry run or
`explain` (decide(..., explain=True)), and nothing else; the decision is the same."""

import pytest

from numa_agent.admission import topology_manager
from numa_agent.admission.admit import Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

DETAILS = ("free", "providers")


def machine(policy="best-effort"):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    return build_machine(topo, PolicyConfig(topology_policy=policy))


def req(name, cpus, **kw):
    return Request(name=name, owner_uid=1000, pid=4242, resources=Resources(cpus=cpus), **kw)


@pytest.fixture
def summaries_made(monkeypatch):
    """How many times the merge's hint summaries were made."""
    made = []
    real = topology_manager._summarize
    monkeypatch.setattr(topology_manager, "_summarize", lambda *a: made.append(a) or real(*a))
    return made


def test_an_admission_makes_no_summary_and_shows_no_details(summaries_made):
    d = decide(machine(), AgentState(), req("a", 2))
    assert not set(DETAILS) & set(d.explanation)
    assert summaries_made == []
    assert d.explanation["merged"] == {"mask": [0], "preferred": True}  # what it decided, still


def test_explain_adds_the_details_to_the_same_decision(summaries_made):
    m, state = machine(), AgentState()
    plain = decide(m, state, req("a", 2))
    explained = decide(m, state, req("a", 2), explain=True)
    assert explained.workload == plain.workload and explained.state == plain.state
    assert [p["provider"] for p in explained.explanation["providers"]] == ["cpu"]
    assert explained.explanation["free"]["0"]["cpus"] == 7  # one CPU of node 0 reserved
    assert {k: v for k, v in explained.explanation.items() if k not in DETAILS} == plain.explanation


@pytest.mark.parametrize("policy, cpus, code", [
    ("single-numa-node", 10, "topology_affinity_error"),  # refused by the merge
    ("best-effort", 16, "insufficient_cpus"),             # refused by the CPU allocation
])
def test_a_refusal_always_carries_the_details(policy, cpus, code):
    with pytest.raises(Refusal) as err:
        decide(machine(policy), AgentState(), req("big", cpus))
    assert err.value.code == code
    explanation = err.value.explanation
    assert explanation["providers"][0]["provider"] == "cpu"
    assert explanation["free"]["1"]["cpus"] == 8 and explanation["admit"] is False


def test_a_pod_budget_is_explained_only_when_asked():
    m = machine()
    first = req("p-a", 2, pod="p", pod_budget=Resources(cpus=4))
    assert not set(DETAILS) & set(decide(m, AgentState(), first).explanation)
    assert set(DETAILS) <= set(decide(m, AgentState(), first, explain=True).explanation)
