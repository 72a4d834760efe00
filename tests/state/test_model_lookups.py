"""AgentState's indexed lookups and sorted updates behave exactly like the
plain scans and re-sorts they replace, on sorted and unsorted states alike."""

from __future__ import annotations

import random

import msgspec
import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import STATE_SCHEMA, AgentState, Booking, Pod, RuntimeRef, Workload, replace
from tests.support.state_updates import random_update


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


RUNTIME = RuntimeRef(runtime="nri", container_id="c", sandbox_id="s", namespace="ns", pod="p", container="c")


def reference_json(state):
    """The payload as one conversion of the whole state (what to_json did before it kept
    each workload's part)."""
    out = msgspec.to_builtins(state, enc_hook=lambda v: v.format(), str_keys=True)
    out["workloads"] = list(out["workloads"])
    for w in out["workloads"]:
        for key in ("pid_identity", "cgroup", "runtime", "pinned_in"):  # written only when there is one
            if w.get(key) is None:
                w.pop(key, None)
        if not w.get("cpus_added"):
            w.pop("cpus_added", None)  # written only when a resize added CPUs
    if not out["isolation"]["originals"]:
        del out["isolation"]  # written only when the agent holds an isolation knob
    if not out["revoked"]:
        del out["revoked"]  # written only when a released workload's process runs
    return {"schema": STATE_SCHEMA, **out}


def test_the_payload_equals_one_conversion_of_the_whole_state_along_any_updates():
    rng = random.Random(7)
    state = AgentState(policy_fingerprint="f")
    for step in range(150):
        name = f"w{rng.randint(0, 20)}"
        if rng.random() < 0.6:
            state = state.with_workload(Workload(name=name, owner_uid=step, booking=Booking(cpus=CpuSet([step % 8])),
                                                 pid_identity=rng.choice([None, "b:1"]), request={"n": step},
                                                 cgroup=rng.choice([None, "/engine/ctr"]),
                                                 runtime=rng.choice([None, RUNTIME])))
        else:
            state = state.without_workload(name)
        if step % 3 == 0:
            payload = state.to_json()
            assert payload == reference_json(state)
            assert list(payload) == ["schema", "workloads", "pods", "policy_fingerprint"]
            assert msgspec.json.encode(payload) == msgspec.json.encode(reference_json(state))
    # Released workloads are not kept in the shared cache for ever.
    assert set(state._json_cache) <= {w.name for w in state.workloads}


@pytest.mark.parametrize("seed", range(8))
def test_exclusive_cpus_handed_on_along_updates_equal_a_count_from_scratch(seed):
    # Overlapping bookings too (a state that is not consistent): the count stays exact.
    rng = random.Random(seed)
    state = AgentState()
    for step in range(150):
        assert state.exclusive_cpus() == CpuSet.union_of(b.cpus for b in state.top_level_bookings())
        state = random_update(state, rng, step,
                              lambda: Booking(cpus=CpuSet(rng.sample(range(16), rng.randrange(0, 3)))))
    assert "_cpu_holders" in state.__dict__  # handed on, not counted afresh each time


@pytest.mark.parametrize("seed", range(8))
def test_exclusive_cpus_are_handed_on_themselves_not_rebuilt_from_every_holder(seed):
    # A 1024-CPU machine holds hundreds of exclusive CPUs: a derived state
    # takes its set from its ancestor's and the change, overlaps included.
    rng = random.Random(seed)
    state = AgentState()
    state.exclusive_cpus()
    for step in range(150):
        state = random_update(state, rng, step,
                              lambda: Booking(cpus=CpuSet(rng.sample(range(16), rng.randrange(0, 3)))))
        if "_cpu_holders" in state.__dict__:
            assert "_exclusive_cpus" in state.__dict__
        assert state.exclusive_cpus() == CpuSet.union_of(b.cpus for b in state.top_level_bookings())


def devices_from_scratch(state):
    out: dict[str, set[str]] = {}
    for b in state.top_level_bookings():
        for resource, addr in b.devices:
            out.setdefault(resource, set()).add(addr)
    return {r: frozenset(a) for r, a in sorted(out.items())}


@pytest.mark.parametrize("seed", range(8))
def test_devices_in_use_handed_on_along_updates_equal_a_count_from_scratch(seed):
    # Two bookings holding one device (a state that is not consistent) too:
    # releasing one of them leaves the device in use.
    rng = random.Random(seed)
    addresses = [("gpu", f"0000:3b:00.{i}") for i in range(4)] + [("nic", "0000:5e:00.0")]
    state = AgentState()
    for step in range(150):
        assert state.devices_in_use() == devices_from_scratch(state)
        state = random_update(state, rng, step,
                              lambda: Booking(devices=tuple(sorted(rng.sample(addresses, rng.randrange(0, 3))))))
    assert "_device_holders" in state.__dict__  # handed on, not counted afresh each time


@pytest.mark.parametrize("seed", range(8))
def test_devices_in_use_are_handed_on_themselves_not_rebuilt_from_every_holder(seed):
    rng = random.Random(seed)
    addresses = [("gpu", f"0000:3b:00.{i}") for i in range(4)] + [("nic", "0000:5e:00.0")]
    state = AgentState()
    state.devices_in_use()
    for step in range(150):
        state = random_update(state, rng, step,
                              lambda: Booking(devices=tuple(sorted(rng.sample(addresses, rng.randrange(0, 3))))))
        if "_device_holders" in state.__dict__:
            assert "_devices_in_use" in state.__dict__
        assert state.devices_in_use() == devices_from_scratch(state)
        assert list(state.devices_in_use()) == sorted(state.devices_in_use())
