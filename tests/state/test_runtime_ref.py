"""A workload its runtime enforces (NRI) records the container in the
checkpoint: a checkpoint without the key loads (None), one with it comes
back equal, and the JSON carries it as an object of stable keys."""

from __future__ import annotations

import json

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.model import AgentState, Booking, RuntimeRef, Workload

REF = RuntimeRef(runtime="nri", container_id="c0ffee", sandbox_id="5andb0x", namespace="prod",
                 pod="web-0", pod_uid="9d1c-uid", container="app")


def test_a_workload_without_the_key_has_no_runtime():
    state = AgentState.from_json({"schema": 1, "workloads": [{"name": "a", "owner_uid": 0}], "pods": []})
    w = state.workload("a")
    assert w is not None and w.runtime is None
    assert "runtime" not in state.to_json()["workloads"][0]  # older readers see nothing new


def test_a_runtime_workload_round_trips_through_the_checkpoint(tmp_path):
    w = Workload(name="ctr-c0ffee", owner_uid=0, booking=Booking(cpus=CpuSet.parse("2-3"), mems=(0,)),
                 runtime=REF)
    state = AgentState(workloads=(w,))
    store = CheckpointStore(tmp_path)
    store.save(state.to_json())
    saved = json.loads(store.path.read_text())["data"]["workloads"][0]
    assert saved["runtime"] == {"runtime": "nri", "container_id": "c0ffee", "sandbox_id": "5andb0x",
                                "namespace": "prod", "pod": "web-0", "pod_uid": "9d1c-uid",
                                "container": "app"}
    payload = store.load()
    assert payload is not None
    again = AgentState.from_json(payload).workload("ctr-c0ffee")
    assert again == w and again.runtime == REF


def test_a_runtime_other_than_nri_is_refused_on_load():
    bad = {"schema": 1, "pods": [], "workloads": [
        {"name": "a", "owner_uid": 0, "runtime": {"runtime": "docker", "container_id": "x", "sandbox_id": "y"}}]}
    with pytest.raises(ValueError, match="runtime"):
        AgentState.from_json(bad)
