"""The kubelet's CPU and memory manager state files, as this agent's
bookings read in the kubelet's terms. Pure (documents as bytes); written by
`numa_agent.kubelet.files`.

Mapping: a pod of the agent is a pod and its members are its containers; a
workload outside a pod is a pod of one container of the same name. The
kubelet keys `entries` by pod UID; the agent has no UIDs and keys them by
pod name. Field names are the kubelet's (`cpu_manager_state`:
policyName, defaultCpuSet, entries pod -> container -> CPU list;
`memory_manager_state`: policyName, machineState node -> numberOfAssignments,
memoryMap resource -> total/systemReserved/allocatable/reserved/free, cells;
entries pod -> container -> [{numaAffinity, type, size}]), resource names
too ("memory", "hugepages-2Mi").

`checksum` is the agent's own: the kubelet's hashes a Go dump of its
structs, which cannot be reproduced. Here it is the first 32 bits (big
endian, unsigned) of the SHA-256 of the file's bytes before
`,"checksum":`, so a reader can tell a whole file from a damaged one.

`StateDocuments` keeps each pod's encoded entries and replaces only those of
the pods a change names (AgentState.changes_since), so a document after an
admission costs the change plus joining the kept pieces, not converting
every workload again.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Mapping, Sequence

import msgspec

from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import kubelet_resource
from numa_agent.admission.view import effective_cpus, memory_usage, shared_pool
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState, Booking, FollowsChanges, Holder, Workload

CPU_MANAGER_STATE = "cpu_manager_state"
MEMORY_MANAGER_STATE = "memory_manager_state"
CHECKSUM_KEY = b',"checksum":'
# The memory manager's policy names as the kubelet spells them in its state file.
_MEMORY_POLICY = {"static": "Static", "none": "None"}


def pod_of(w: Workload) -> str:
    """The kubelet pod a workload is a container of."""
    return w.pod if w.pod is not None else w.name


def containers_of(state: AgentState, pod: str) -> tuple[Workload, ...]:
    """The containers of kubelet pod `pod`: an agent pod's members, and a
    workload outside pods of that name (names of pods and workloads may meet)."""
    # By the pod's member names and the name index (handed on from state to
    # state), not members_of, which groups every workload of a new state.
    found = state.pod(pod)
    members = tuple(w for w in map(state.workload, found.members if found is not None else ())
                    if w is not None and w.pod == pod)
    alone = state.workload(pod)
    if alone is not None and alone.pod is None:
        return (*members, alone)
    return members


def container_cpus(machine: Machine, state: AgentState, w: Workload) -> CpuSet | None:
    """The CPUs a container's entry names, or None when it runs on the
    default (shared) CPU set and the kubelet would record no entry: exclusive
    CPUs, and a pod's shared part for its members without exclusive CPUs."""
    if not w.shared or w.pod is not None:
        return effective_cpus(machine, state, w)
    return None


def memory_blocks(booking: Booking) -> list[dict[str, Any]]:
    """A container's memory as the kubelet's blocks: one per resource, its
    size in bytes and the NUMA nodes of its group."""
    totals: dict[str, int] = {}
    for per in booking.memory.values():
        for resource, amount in per.items():
            if amount:
                totals[resource] = totals.get(resource, 0) + amount
    affinity = sorted(booking.memory_group or booking.memory)
    return [{"numaAffinity": affinity, "type": kubelet_resource(r), "size": size}
            for r, size in sorted(totals.items())]


def with_checksum(head: bytes) -> bytes:
    """`head` (a JSON object without its closing brace) closed with the checksum field."""
    digest = hashlib.sha256(head).digest()
    return head + CHECKSUM_KEY + str(int.from_bytes(digest[:4], "big")).encode() + b"}"


def checksum_ok(document: bytes) -> bool:
    head, sep, _ = document.rpartition(CHECKSUM_KEY)
    return bool(sep) and with_checksum(head) == document


# ---- machineState -------------------------------------------------------------
class _Assignments(FollowsChanges):
    """NUMA node -> how many memory blocks (resource of a booking) name it, as
    the kubelet counts numberOfAssignments; kept in the state's memo and
    followed through admissions and releases."""

    def __init__(self, counts: Mapping[int, int]) -> None:
        self.counts = dict(counts)

    @staticmethod
    def _blocks(booking: Booking) -> Iterable[tuple[int, int]]:
        resources = {r for per in booking.memory.values() for r, amount in per.items() if amount}
        if resources:
            for node in booking.memory_group or booking.memory:
                yield node, len(resources)

    def after(self, removed: Sequence[Holder], added: Sequence[Holder]) -> "_Assignments":
        if not any(h.booking.memory for h in (*removed, *added)):
            return self  # the same value: what is built from it may be kept
        counts = dict(self.counts)
        for holders, sign in ((removed, -1), (added, 1)):
            for holder in holders:
                for node, n in self._blocks(holder.booking):
                    counts[node] = counts.get(node, 0) + sign * n
        return _Assignments({k: v for k, v in counts.items() if v})


def _assignments(state: AgentState) -> _Assignments:
    kept = state.memo.get("kubelet_assignments")
    if kept is None:
        kept = state.memo["kubelet_assignments"] = _Assignments({}).after((), list(state.top_level_holders()))
    return kept


def machine_state(machine: Machine, state: AgentState) -> dict[str, Any]:
    """Per NUMA node with memory: the memory map of every resource it has and
    its group. reserved is what the bookings hold; free = allocatable - reserved
    (never below 0), so a group's free memory is the sum of its nodes' free."""
    usage = memory_usage(state)
    assignments = _assignments(state).counts
    out: dict[str, Any] = {}
    for node, resource, cap in machine.memory.entries:
        entry = out.get(str(node))
        if entry is None:
            group = usage.group_of(node)
            entry = out[str(node)] = {"numberOfAssignments": assignments.get(node, 0), "memoryMap": {},
                                      "cells": list(group.nodes()) if group is not None else [node]}
        reserved = usage.allocated_bytes(node, resource)
        entry["memoryMap"][kubelet_resource(resource)] = {
            "total": cap.total, "systemReserved": cap.reserved, "allocatable": cap.allocatable,
            "reserved": reserved, "free": max(0, cap.allocatable - reserved)}
    return out


# ---- the documents, kept per pod -------------------------------------------------
def changed_pods(old_machine: Machine | None, old: AgentState | None, machine: Machine,
                 state: AgentState, key: Callable[[Workload], str] = pod_of) -> set[str] | None:
    """The kubelet pods whose containers may differ between `old` and `state`
    (derived from it by a few updates), or None when everything must be
    built again (no old state, another machine, an unrelated state). `key`:
    the pod a workload is reported in (PodResources has its own for NRI's)."""
    if old is None or machine is not old_machine:
        return None
    changes = state.changes_since(old)
    if changes is None:
        return None
    workloads, pods = changes
    out = set(pods)
    for name in workloads:
        for s in (old, state):
            w = s.workload(name)
            if w is not None:
                out.add(key(w))
    return out



class StateDocuments:
    """Both documents for the latest state, rebuilt for what changed since
    the previous one. One instance per writer; not shared between threads."""

    def __init__(self) -> None:
        self._machine: Machine | None = None
        self._state: AgentState | None = None
        # kubelet pod -> its encoded `"pod":{...}` piece in each document (absent: no entry)
        self._cpu: dict[str, bytes] = {}
        self._memory: dict[str, bytes] = {}
        # Each document with what it was made of; made again only when that differs
        # (a shared workload without memory changes neither).
        self._cpu_made: tuple[Any, bytes] | None = None
        self._memory_made: tuple[Any, bytes] | None = None
        self._entries_changed = {"cpu": True, "memory": True}

    def update(self, machine: Machine, state: AgentState) -> tuple[bytes, bytes]:
        """(cpu_manager_state, memory_manager_state) for `state`."""
        changed = changed_pods(self._machine, self._state, machine, state)
        if changed is None:
            self._cpu, self._memory = {}, {}
            self._entries_changed = {"cpu": True, "memory": True}
            changed = {pod_of(w) for w in state.workloads}
        for pod in changed:
            self._entries_of(machine, state, pod)
        self._machine, self._state = machine, state
        return self._cpu_document(machine, state), self._memory_document(machine, state)

    def _entries_of(self, machine: Machine, state: AgentState, pod: str) -> None:
        cpus: dict[str, str] = {}
        memory: dict[str, list[dict[str, Any]]] = {}
        for w in containers_of(state, pod):
            mine = container_cpus(machine, state, w)
            if mine is not None:
                cpus[w.name] = mine.format()
            blocks = memory_blocks(w.booking)
            if blocks:
                memory[w.name] = blocks
        key = msgspec.json.encode(pod) + b":"
        for which, kept, value in (("cpu", self._cpu, cpus), ("memory", self._memory, memory)):
            before = kept.get(pod)
            if value:
                kept[pod] = key + msgspec.json.encode(value)
            else:
                kept.pop(pod, None)
            if kept.get(pod) != before:
                self._entries_changed[which] = True

    def _cpu_document(self, machine: Machine, state: AgentState) -> bytes:
        made_of = (machine, shared_pool(machine, state))
        kept = self._cpu_made
        if kept is not None and not self._entries_changed["cpu"] and kept[0] == made_of:
            return kept[1]
        head = (b'{"policyName":' + msgspec.json.encode(machine.policy.cpu_policy)
                + b',"defaultCpuSet":' + msgspec.json.encode(made_of[1].format())
                + b',"entries":{' + b",".join(self._cpu.values()) + b"}")
        self._cpu_made, self._entries_changed["cpu"] = (made_of, with_checksum(head)), False
        return self._cpu_made[1]

    def _memory_document(self, machine: Machine, state: AgentState) -> bytes:
        # The usage and the assignments are kept values, the same object while no memory changes.
        made_of = (machine, memory_usage(state), _assignments(state))
        kept = self._memory_made
        if kept is not None and not self._entries_changed["memory"] and all(
                a is b for a, b in zip(kept[0], made_of, strict=True)):
            return kept[1]
        policy = _MEMORY_POLICY.get(machine.policy.memory_policy, machine.policy.memory_policy)
        head = (b'{"policyName":' + msgspec.json.encode(policy)
                + b',"machineState":' + msgspec.json.encode(machine_state(machine, state))
                + b',"entries":{' + b",".join(self._memory.values()) + b"}")
        self._memory_made, self._entries_changed["memory"] = (made_of, with_checksum(head)), False
        return self._memory_made[1]


def documents(machine: Machine, state: AgentState) -> tuple[bytes, bytes]:
    """Both documents built afresh (what `StateDocuments.update` must equal)."""
    return StateDocuments().update(machine, state)
