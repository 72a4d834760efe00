"""AgentState's indexed lookups and sorted updates behave exactly like the
plain scans and re-sorts they replace, on sorted and unsorted states alike."""

from __future__ import annotations

import random

import pytest

from numa_agent.state.model import AgentState, Pod, Workload, replace


def scan(values, name):
    return next((v for v in values if v.name == name), None)


def resorted(values, value):
    return tuple(sorted([*(x for x in values if x.name != value.name), value], key=lambda x: x.name))


@pytest.mark.parametrize("seed", range(6))
def test_updates_and_lookups_match_the_reference(seed):
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(25)]
    start = [Workload(name=rng.choice(names), owner_uid=i) for i in range(10)]
    # Unsorted, with a duplicate name or two: built directly, as a rebuild may.
    state = AgentState(workloads=tuple(start), pods=(Pod(name="b", owner_uid=0), Pod(name="a", owner_uid=0)))
    ref_w, ref_p = list(state.workloads), list(state.pods)
    for step in range(120):
        op, name = rng.random(), rng.choice(names)
        if op < 0.45:
            w = Workload(name=name, owner_uid=step, pod=rng.choice([None, "a", "b"]))
            state, ref_w = state.with_workload(w), list(resorted(ref_w, w))
        elif op < 0.75:
            state, ref_w = state.without_workload(name), [x for x in ref_w if x.name != name]
        elif op < 0.9:
            p = Pod(name=rng.choice("abc"), owner_uid=step)
            state, ref_p = state.with_pod(p), list(resorted(ref_p, p))
        else:
            pod = rng.choice("abc")
            state, ref_p = state.without_pod(pod), [x for x in ref_p if x.name != pod]
        assert list(state.workloads) == ref_w and list(state.pods) == ref_p
        for probe in names[:8]:
            assert state.workload(probe) is scan(ref_w, probe)
        for pod in "abc":
            assert state.pod(pod) is scan(ref_p, pod)
            assert state.members_of(pod) == tuple(w for w in ref_w if w.pod == pod)


def test_replace_starts_without_the_index_and_finds_the_same():
    state = AgentState().with_workload(Workload(name="a", owner_uid=0))
    other = replace(state, workloads=(*state.workloads, Workload(name="b", owner_uid=1)))
    assert other.workload("b").owner_uid == 1 and state.workload("b") is None
    assert other.changes_since(state) is None


def test_json_is_unchanged_by_the_index():
    state = AgentState(policy_fingerprint="f").with_workload(Workload(name="b", owner_uid=0)) \
        .with_workload(Workload(name="a", owner_uid=0))
    state.workload("a")
    assert AgentState.from_json(state.to_json()).to_json() == state.to_json()
    assert [w["name"] for w in state.to_json()["workloads"]] == ["a", "b"]
    assert set(state.to_json()) == {"schema", "workloads", "pods", "policy_fingerprint"}
