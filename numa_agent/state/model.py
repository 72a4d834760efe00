"""The agent's state as immutable values: what is booked, by whom.

The state is the single source of truth for accounting: free CPUs, memory and
devices are always *derived* from it (capacity - reserved - booked), never
kept as separate counters that could drift. Every admission or release
returns a new AgentState; the service swaps it in after the checkpoint is on
disk.

The classes are frozen msgspec Structs: the checkpoint's JSON is their fields
(a CPU set as its kernel list text, "2-3,8"; node ids as JSON object keys are
strings), encoded and decoded by `to_json` / `from_json` from the one
declaration. `replace` makes an updated copy of any of them.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any, Iterable, Mapping, TypeVar, cast

import msgspec

from numa_agent.core.cpuset import CpuSet, CpuSetParseError

STATE_SCHEMA = 1

_T = TypeVar("_T")


def replace(value: _T, /, **changes: Any) -> _T:
    """A copy of `value` (a state Struct or a dataclass) with `changes`."""
    if isinstance(value, msgspec.Struct):
        return cast(_T, msgspec.structs.replace(value, **changes))
    return dataclasses.replace(value, **changes)  # type: ignore[type-var]


class _Value(msgspec.Struct, frozen=True):
    pass


class Booking(_Value, frozen=True):
    """Resources held by one workload or one pod budget.

    memory: node id -> resource name ("memory", "hugepages-2048kB") -> bytes.
    devices: (resource, PCI address) pairs, sorted.
    """

    cpus: CpuSet = CpuSet()  # exclusive CPUs
    numa_nodes: tuple[int, ...] = ()  # the NUMA affinity the decision aligned on
    mems: tuple[int, ...] = ()  # cpuset.mems
    memory: Mapping[int, Mapping[str, int]] = {}
    memory_group: tuple[int, ...] = ()  # nodes the memory manager booked as one group
    devices: tuple[tuple[str, str], ...] = ()

    def memory_total(self, resource: str) -> int:
        return sum(per.get(resource, 0) for per in self.memory.values())

    def device_addresses(self) -> tuple[str, ...]:
        return tuple(addr for _, addr in self.devices)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Booking":
        return _sorted_devices(_from_json(d, cls))


class Workload(_Value, frozen=True):
    name: str
    owner_uid: int
    booking: Booking = Booking()  # absent from the JSON: an empty booking
    shared: bool = False  # runs on the shared pool (or the pod's shared part)
    pod: str | None = None
    pid: int | None = None  # the process that asked (numa-run, which then execs)
    # "<boot id>:<start time>" of that process, so a recycled PID is never taken for it.
    pid_identity: str | None = None
    created_unix: float = 0.0
    command: tuple[str, ...] = ()
    cpunodebind: tuple[int, ...] = ()  # shared workloads restricted to these nodes' CPUs
    request: Mapping[str, Any] = {}  # as asked, for status/explain
    lost: tuple[str, ...] = ()  # resources taken away by hotplug ("cpu 5", "pci 0000:3b:00.0")

    def to_json(self) -> dict[str, Any]:
        return _without_unknown_identity(_to_json(self))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Workload":
        w = _from_json(d, cls)
        return _with_booking(w, _sorted_devices(w.booking))


class Pod(_Value, frozen=True):
    """A pod budget: booked once, shared by its members."""

    name: str
    owner_uid: int
    booking: Booking = Booking()  # absent from the JSON: an empty booking
    members: tuple[str, ...] = ()
    created_unix: float = 0.0
    request: Mapping[str, Any] = {}

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Pod":
        p = _from_json(d, cls)
        return _with_booking(p, _sorted_devices(p.booking))


class AgentState(_Value, frozen=True, dict=True):  # dict=True: room for the cached properties
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
        return CpuSet.union_of(b.cpus for b in self.top_level_bookings())

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
        out = _to_json(self)
        out["workloads"] = [_without_unknown_identity(w) for w in out.get("workloads", [])]
        return {"schema": STATE_SCHEMA, **out}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AgentState":
        if d.get("schema") != STATE_SCHEMA:
            raise ValueError(f"unknown state schema {d.get('schema')!r} (this agent reads {STATE_SCHEMA})")
        state = _from_json(d, cls)  # "schema" is not a field: ignored like any unknown key
        workloads = tuple(sorted((_with_booking(w, _sorted_devices(w.booking)) for w in state.workloads),
                                 key=lambda x: x.name))
        pods = tuple(sorted((_with_booking(p, _sorted_devices(p.booking)) for p in state.pods),
                            key=lambda x: x.name))
        return replace(state, workloads=workloads, pods=pods)


# ---- the checkpoint's JSON ---------------------------------------------------------
def _enc_hook(value: Any) -> Any:
    if isinstance(value, CpuSet):
        return value.format()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def _dec_hook(typ: type, value: Any) -> Any:
    if typ is CpuSet and isinstance(value, str):
        try:
            return CpuSet.parse(value)
        except CpuSetParseError as exc:
            raise ValueError(str(exc)) from None
    raise NotImplementedError(f"cannot decode {typ.__name__} from {type(value).__name__}")


def _without_unknown_identity(workload: dict[str, Any]) -> dict[str, Any]:
    """pid_identity is written only when known, so older checkpoints read back unchanged."""
    if workload.get("pid_identity") is None:
        workload.pop("pid_identity", None)
    return workload


def _to_json(value: _Value) -> dict[str, Any]:
    """JSON-ready builtins: CPU sets as list text, tuples as lists, node ids as strings."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook, str_keys=True)


_V = TypeVar("_V", bound=_Value)


def _from_json(d: Mapping[str, Any], cls: type[_V]) -> _V:
    """Decode what `_to_json` wrote; absent keys take their defaults, unknown keys
    are ignored. ValueError (naming the field) when a value has the wrong type."""
    try:
        return msgspec.convert(d, cls, dec_hook=_dec_hook, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{cls.__name__}: {exc}") from None


def _sorted_devices(b: Booking) -> Booking:
    devices = tuple(sorted(b.devices))
    return b if devices == b.devices else replace(b, devices=devices)


_Holder = TypeVar("_Holder", Workload, Pod)


def _with_booking(value: _Holder, booking: Booking) -> _Holder:
    return value if booking is value.booking else replace(value, booking=booking)
