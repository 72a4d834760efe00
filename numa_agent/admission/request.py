"""What a workload asks for: the request values admission and the providers read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.units import format_bytes
from numa_agent.state.model import Booking


@dataclass(frozen=True)
class Resources:
    """What one request asks for."""

    cpus: int = 0
    memory_bytes: int = 0
    hugepages: Mapping[int, int] = field(default_factory=dict)  # size kB -> count
    devices: Mapping[str, int] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.cpus or self.memory_bytes or any(self.hugepages.values())
                    or any(self.devices.values()))

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory_bytes": self.memory_bytes,
                "hugepages": {str(k): v for k, v in sorted(self.hugepages.items())},
                "devices": dict(sorted(self.devices.items()))}


def describe_amounts(amounts: Mapping[str, Any]) -> str:
    """"4 CPUs, 2 GiB of memory, 512 hugepages of 2 MiB, 1 gpu": a request or
    pod budget in its JSON form (`Resources.to_json`), for people."""
    parts = []
    if amounts.get("cpus"):
        parts.append(_counted(amounts["cpus"], "CPU"))
    if amounts.get("memory_bytes"):
        parts.append(f"{format_bytes(amounts['memory_bytes'])} of memory")
    for size_kb, count in (amounts.get("hugepages") or {}).items():
        if count:
            parts.append(f"{_counted(count, 'hugepage')} of {format_bytes(int(size_kb) << 10)}")
    parts += [f"{count} {resource}" for resource, count in (amounts.get("devices") or {}).items() if count]
    return ", ".join(parts) or "nothing"


def _counted(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class Keep:
    """What a resize keeps: the booking its workload holds, decided again at the
    new size against the state without it (`admission/keep.py`). `added`: the
    CPUs resizes added, oldest first (a shrink gives them back first)."""

    booking: Booking
    added: tuple[int, ...] = ()


@dataclass(frozen=True)
class Request:
    name: str
    owner_uid: int
    resources: Resources = Resources()
    shared: bool = False
    pid: int | None = None
    pid_identity: str | None = None  # see Workload.pid_identity
    policy: str | None = None  # overrides the configured topology policy
    numa_allocation_strategy: str | None = None  # overrides the configured one
    physcpubind: CpuSet | None = None
    cpunodebind: tuple[int, ...] | None = None
    membind: tuple[int, ...] | None = None
    pod: str | None = None
    pod_budget: Resources | None = None
    command: tuple[str, ...] = ()
    created_unix: float = 0.0
    # An engine's cgroup to enforce on (Workload.cgroup), and what its engine
    # granted there (the parent's effective CPUs and nodes): the booking lies
    # inside them. None: the agent's own tree, the whole machine.
    cgroup: str | None = None
    within_cpus: CpuSet | None = None
    within_mems: tuple[int, ...] | None = None
    # The cgroup whose cpuset that grant is, for a refusal to name: None, the engine
    # cgroup's parent; the cgroup itself for a task pinned inside it (its tasks run there).
    granted_by: str | None = None
    # Set only by a resize (None for every admission): the booking to keep.
    keep: Keep | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.resources.to_json(), "shared": self.shared}
        if self.within_cpus is not None:
            out["within_cpus"] = self.within_cpus.format()
        if self.within_mems is not None:
            out["within_mems"] = list(self.within_mems)
        if self.policy:
            out["policy"] = self.policy
        if self.numa_allocation_strategy:
            out["numa_allocation_strategy"] = self.numa_allocation_strategy
        if self.physcpubind is not None:
            out["physcpubind"] = self.physcpubind.format()
        if self.cpunodebind is not None:
            out["cpunodebind"] = list(self.cpunodebind)
        if self.membind is not None:
            out["membind"] = list(self.membind)
        if self.pod_budget is not None:
            out["pod_budget"] = self.pod_budget.to_json()
        return out
