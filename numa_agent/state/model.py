"""The agent's state as immutable values: what is booked, by whom.

The state is the single source of truth for accounting: free CPUs, memory and
devices are always *derived* from it (capacity - reserved - booked), never
kept as separate counters that could drift. Every admission or release
returns a new AgentState; the service swaps it in after the checkpoint is on
disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Iterable, Mapping

from numa_agent.core.cpuset import CpuSet

STATE_SCHEMA = 1


@dataclass(frozen=True)
class Booking:
    """Resources held by one workload or one pod budget.

    memory: node id -> resource name ("memory", "hugepages-2048kB") -> bytes.
    devices: (resource, PCI address) pairs, sorted.
    """

    cpus: CpuSet = CpuSet()  # exclusive CPUs
    numa_nodes: tuple[int, ...] = ()  # the NUMA affinity the decision aligned on
    mems: tuple[int, ...] = ()  # cpuset.mems
    memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    memory_group: tuple[int, ...] = ()  # nodes the memory manager booked as one group
    devices: tuple[tuple[str, str], ...] = ()

    def memory_total(self, resource: str) -> int:
        return sum(per.get(resource, 0) for per in self.memory.values())

    def device_addresses(self) -> tuple[str, ...]:
        return tuple(addr for _, addr in self.devices)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus.format(),
            "numa_nodes": list(self.numa_nodes),
            "mems": list(self.mems),
            "memory": {str(n): dict(sorted(r.items())) for n, r in sorted(self.memory.items())},
            "memory_group": list(self.memory_group),
            "devices": [list(d) for d in self.devices],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Booking":
        return cls(
            cpus=CpuSet.parse(d.get("cpus", "")),
            numa_nodes=tuple(int(n) for n in d.get("numa_nodes", ())),
            mems=tuple(int(n) for n in d.get("mems", ())),
            memory={int(n): {str(k): int(v) for k, v in r.items()}
                    for n, r in d.get("memory", {}).items()},
            memory_group=tuple(int(n) for n in d.get("memory_group", ())),
            devices=tuple(sorted((str(r), str(a)) for r, a in d.get("devices", ()))),
        )


@dataclass(frozen=True)
class Workload:
    name: str
    owner_uid: int
    booking: Booking
    shared: bool = False  # runs on the shared pool (or the pod's shared part)
    pod: str | None = None
    pid: int | None = None  # the process that asked (numa-run, which then execs)
    created_unix: float = 0.0
    command: tuple[str, ...] = ()
    cpunodebind: tuple[int, ...] = ()  # shared workloads restricted to these nodes' CPUs
    request: Mapping[str, Any] = field(default_factory=dict)  # as asked, for status/explain
    lost: tuple[str, ...] = ()  # resources taken away by hotplug ("cpu 5", "pci 0000:3b:00.0")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "owner_uid": self.owner_uid, "booking": self.booking.to_json(),
            "shared": self.shared, "pod": self.pod, "pid": self.pid,
            "created_unix": self.created_unix, "command": list(self.command),
            "cpunodebind": list(self.cpunodebind), "request": dict(self.request),
            "lost": list(self.lost),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Workload":
        return cls(
            name=str(d["name"]), owner_uid=int(d["owner_uid"]),
            booking=Booking.from_json(d.get("booking", {})), shared=bool(d.get("shared", False)),
            pod=d.get("pod"), pid=d.get("pid"), created_unix=float(d.get("created_unix", 0.0)),
            command=tuple(d.get("command", ())), cpunodebind=tuple(d.get("cpunodebind", ())),
            request=dict(d.get("request", {})), lost=tuple(d.get("lost", ())),
        )


@dataclass(frozen=True)
class Pod:
    """A pod budget: booked once, shared by its members."""

    name: str
    owner_uid: int
    booking: Booking
    members: tuple[str, ...] = ()
    created_unix: float = 0.0
    request: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "owner_uid": self.owner_uid, "booking": self.booking.to_json(),
                "members": list(self.members), "created_unix": self.created_unix,
                "request": dict(self.request)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Pod":
        return cls(name=str(d["name"]), owner_uid=int(d["owner_uid"]),
                   booking=Booking.from_json(d.get("booking", {})),
                   members=tuple(d.get("members", ())),
                   created_unix=float(d.get("created_unix", 0.0)),
                   request=dict(d.get("request", {})))


@dataclass(frozen=True)
class AgentState:
    workloads: tuple[Workload, ...] = ()  # sorted by name
    pods: tuple[Pod, ...] = ()  # sorted by name
    # The configuration the bookings were made under; a restart with another
    # policy must reconcile explicitly (see numa_agent.service.config).
    policy_fingerprint: str = ""

    # ---- lookups ---------------------------------------------------------
    def workload(self, name: str) -> Workload | None:
        for w in self.workloads:
            if w.name == name:
                return w
        return None

    def pod(self, name: str) -> Pod | None:
        for p in self.pods:
            if p.name == name:
                return p
        return None

    def members_of(self, pod: str) -> tuple[Workload, ...]:
        return tuple(w for w in self.workloads if w.pod == pod)

    # ---- derived accounting --------------------------------------------
    @cached_property
    def memo(self) -> dict[str, Any]:
        """Values derived from this (immutable) state, computed once by the
        functions that need them. Not copied by `replace`: a new state starts
        with an empty memo."""
        return {}

    def top_level_bookings(self) -> Iterable[Booking]:
        """Bookings against the machine: pod budgets and workloads outside pods
        (a pod member's resources come out of its pod's budget)."""
        for p in self.pods:
            yield p.booking
        for w in self.workloads:
            if w.pod is None:
                yield w.booking

    @cached_property
    def _exclusive_cpus(self) -> CpuSet:
        bits = 0
        for b in self.top_level_bookings():
            bits |= b.cpus.bits
        return CpuSet.from_bits(bits)

    def exclusive_cpus(self) -> CpuSet:
        return self._exclusive_cpus

    @cached_property
    def _devices_in_use(self) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for b in self.top_level_bookings():
            for resource, addr in b.devices:
                out.setdefault(resource, set()).add(addr)
        return {r: frozenset(a) for r, a in sorted(out.items())}

    def devices_in_use(self) -> dict[str, frozenset[str]]:
        return dict(self._devices_in_use)

    # ---- updates -----------------------------------------------------------
    def with_workload(self, w: Workload) -> "AgentState":
        rest = [x for x in self.workloads if x.name != w.name]
        return replace(self, workloads=tuple(sorted([*rest, w], key=lambda x: x.name)))

    def without_workload(self, name: str) -> "AgentState":
        return replace(self, workloads=tuple(x for x in self.workloads if x.name != name))

    def with_pod(self, p: Pod) -> "AgentState":
        rest = [x for x in self.pods if x.name != p.name]
        return replace(self, pods=tuple(sorted([*rest, p], key=lambda x: x.name)))

    def without_pod(self, name: str) -> "AgentState":
        return replace(self, pods=tuple(x for x in self.pods if x.name != name))

    # ---- serialization -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"schema": STATE_SCHEMA, "policy_fingerprint": self.policy_fingerprint,
                "workloads": [w.to_json() for w in self.workloads],
                "pods": [p.to_json() for p in self.pods]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AgentState":
        if d.get("schema") != STATE_SCHEMA:
            raise ValueError(f"unknown state schema {d.get('schema')!r} (this agent reads {STATE_SCHEMA})")
        return cls(
            workloads=tuple(sorted((Workload.from_json(w) for w in d.get("workloads", ())),
                                   key=lambda x: x.name)),
            pods=tuple(sorted((Pod.from_json(p) for p in d.get("pods", ())), key=lambda x: x.name)),
            policy_fingerprint=str(d.get("policy_fingerprint", "")),
        )
