"""Checkpoints written by earlier versions of the agent still load, and
saving what they load writes the same data (same keys, same value formats)."""

from __future__ import annotations

import json

from numa_agent.core.cpuset import CpuSet
from numa_agent.state.checkpoint import CheckpointStore, canonical_json
from numa_agent.state.model import STATE_SCHEMA, AgentState, Booking, Pod, Workload

# Written by the agent as of schema 1 (admissions of a plain workload with a
# GPU, a pod with an exclusive and a shared member, a shared workload bound to
# node 0; one workload with a hugepage booking and a resource lost to hotplug).
CHECKPOINT_V1 = """\
{"version": 1, "checksum": "sha256:885b82f3729ce9900a628a9cd7a5d6359337210a0e44e1d6d47bf0ca9bb6287a",
 "data": {"schema": 1, "policy_fingerprint": "0863022000758b7a",
  "pods": [
   {"booking": {"cpus": "1-2,9-10", "devices": [], "memory": {"0": {"memory": 2147483648}},
                "memory_group": [0], "mems": [0], "numa_nodes": [0]},
    "created_unix": 1700000000.5, "members": ["db", "side"], "name": "p1", "owner_uid": 1000,
    "request": {"cpus": 4, "devices": {}, "hugepages": {}, "memory_bytes": 2147483648}}
  ],
  "workloads": [
   {"booking": {"cpus": "1,9", "devices": [], "memory": {}, "memory_group": [], "mems": [0], "numa_nodes": [0]},
    "command": ["db"], "cpunodebind": [], "created_unix": 1700000000.5, "lost": [], "name": "db",
    "owner_uid": 1000, "pid": 14826, "pod": "p1",
    "request": {"cpus": 2, "devices": {}, "hugepages": {}, "memory_bytes": 0,
                "pod_budget": {"cpus": 4, "devices": {}, "hugepages": {}, "memory_bytes": 2147483648}, "shared": false},
    "shared": false},
   {"booking": {"cpus": "", "devices": [], "memory": {}, "memory_group": [], "mems": [0], "numa_nodes": [0]},
    "command": ["x"], "cpunodebind": [0], "created_unix": 1700000000.5, "lost": [], "name": "sh",
    "owner_uid": 1000, "pid": 14826, "pod": null,
    "request": {"cpunodebind": [0], "cpus": 0, "devices": {}, "hugepages": {}, "memory_bytes": 0, "shared": true},
    "shared": true},
   {"booking": {"cpus": "", "devices": [], "memory": {}, "memory_group": [], "mems": [0], "numa_nodes": [0]},
    "command": ["side"], "cpunodebind": [], "created_unix": 1700000000.5, "lost": [], "name": "side",
    "owner_uid": 1000, "pid": 14826, "pod": "p1",
    "request": {"cpus": 0, "devices": {}, "hugepages": {}, "memory_bytes": 0, "shared": true},
    "shared": true},
   {"booking": {"cpus": "4,12", "devices": [["gpu", "0000:01:00.0"]], "memory": {"0": {"hugepages-2048kB": 4194304, "memory": 5},
                                                                                    "1": {"memory": 1073741824}},
                "memory_group": [1], "mems": [1], "numa_nodes": [1]},
    "command": ["sleep", "60"], "cpunodebind": [], "created_unix": 1700000000.5, "lost": ["cpu 5"],
    "name": "web", "owner_uid": 1000, "pid": 14826, "pod": null,
    "request": {"cpus": 2, "devices": {"gpu": 1}, "hugepages": {}, "membind": [1], "memory_bytes": 1073741824,
                "policy": "best-effort", "shared": false},
    "shared": false}
  ]}}
"""


def _load(tmp_path) -> AgentState:
    store = CheckpointStore(tmp_path)
    store.path.write_text(CHECKPOINT_V1)
    payload = store.load()
    assert payload is not None
    return AgentState.from_json(payload)


def test_checkpoint_written_by_schema_1_loads(tmp_path):
    state = _load(tmp_path)
    assert STATE_SCHEMA == 1
    assert state.policy_fingerprint == "0863022000758b7a"
    assert [w.name for w in state.workloads] == ["db", "sh", "side", "web"]
    web = state.workload("web")
    assert isinstance(web, Workload)
    assert web.booking.cpus == CpuSet.parse("4,12")
    assert web.booking.devices == (("gpu", "0000:01:00.0"),)
    assert web.booking.device_addresses() == ("0000:01:00.0",)
    assert web.booking.memory == {0: {"hugepages-2048kB": 4194304, "memory": 5}, 1: {"memory": 1 << 30}}
    assert web.booking.memory_total("memory") == (1 << 30) + 5
    assert web.booking.numa_nodes == (1,) and web.booking.mems == (1,) and web.booking.memory_group == (1,)
    assert web.command == ("sleep", "60") and web.lost == ("cpu 5",) and web.pod is None
    assert web.request["policy"] == "best-effort" and web.request["membind"] == [1]
    assert web.created_unix == 1700000000.5 and web.owner_uid == 1000 and not web.shared
    sh = state.workload("sh")
    assert sh is not None and sh.shared and sh.cpunodebind == (0,) and sh.booking.cpus == CpuSet()
    pod = state.pod("p1")
    assert isinstance(pod, Pod) and pod.members == ("db", "side")
    assert pod.booking.cpus == CpuSet.parse("1-2,9-10")
    assert pod.request == {"cpus": 4, "devices": {}, "hugepages": {}, "memory_bytes": 2 << 30}
    assert [m.name for m in state.members_of("p1")] == ["db", "side"]
    assert state.exclusive_cpus() == CpuSet.parse("1-2,4,9-10,12")
    assert state.devices_in_use() == {"gpu": frozenset({"0000:01:00.0"})}


def test_loaded_checkpoint_saves_back_to_the_same_data(tmp_path):
    state = _load(tmp_path)
    document = json.loads(CHECKPOINT_V1)
    assert canonical_json(state.to_json()) == canonical_json(document["data"])
    store = CheckpointStore(tmp_path / "again")
    store.save(state.to_json())
    assert json.loads(store.path.read_text())["checksum"] == document["checksum"]


def test_entries_with_only_the_required_keys_load_with_defaults():
    state = AgentState.from_json({"schema": 1, "workloads": [{"name": "a", "owner_uid": 7}],
                                  "pods": [{"name": "p", "owner_uid": 0}]})
    assert state.workload("a") == Workload(name="a", owner_uid=7, booking=Booking())
    assert state.pod("p") == Pod(name="p", owner_uid=0, booking=Booking())
    assert state.policy_fingerprint == ""
