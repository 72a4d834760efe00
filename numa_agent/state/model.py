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
import weakref
from bisect import bisect_left
from functools import cached_property
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping, Sequence, TypeVar, cast

import msgspec

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.layered import Layered

STATE_SCHEMA = 1
# How many updates back a state can still name what changed (changes_since):
# one admission or release makes at most three.
_ANCESTORS = 6

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


# A runtime's identifier or a Kubernetes name: at most 256 characters (the API's ShortStr).
_RuntimeText = Annotated[str, msgspec.Meta(max_length=256)]


class RuntimeRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A container that a runtime enforces (NRI): the agent books, the runtime writes its cgroup."""

    runtime: Literal["nri"]
    container_id: _RuntimeText  # the runtime's container id
    sandbox_id: _RuntimeText  # its pod sandbox's id
    namespace: _RuntimeText = ""  # Kubernetes namespace, pod name, pod uid, container name
    pod: _RuntimeText = ""
    pod_uid: _RuntimeText = ""
    container: _RuntimeText = ""


# The request key saying how a workload was rebuilt after a lost checkpoint, and the
# value that holds its CPUs for an operator instead (service.rebuild sets them).
REBUILT = "rebuilt"
QUARANTINED = "quarantined"


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
    # An engine's cgroup the workload is enforced on, as /proc/PID/cgroup names it
    # ("/libpod_parent/libpod-<id>"); None: a cgroup of the agent's own tree.
    cgroup: str | None = None
    # Exclusive CPUs resizes added, oldest first: a shrink gives back the last first.
    cpus_added: tuple[int, ...] = ()
    # A container its runtime enforces (NRI): booked here, but no cgroup of the
    # agent's, no process moved or followed; it lives until released by name.
    runtime: RuntimeRef | None = None
    # An engine's cgroup the workload shares with others booked apart (a Slurm
    # step's tasks in one cgroup): the agent pins its process inside it with
    # sched_setaffinity and follows it; the cgroup stays its engine's.
    pinned_in: str | None = None

    @property
    def quarantined(self) -> bool:
        """Rebuilt from a process whose mark did not verify: its CPUs are held for an
        operator, not for a workload (status lists it apart; only root releases it)."""
        return self.request.get(REBUILT) == QUARANTINED

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


# What holds a top-level booking: a pod (its budget) or a workload outside pods.
Holder = Workload | Pod


class FollowsChanges:
    """A value kept in a state's memo that a state derived from it by a few
    updates takes on, told the top-level holders (see top_level_holders) that
    left and came (AgentState._derive): what depends on every booking (or on
    who holds it) then costs the change, not the state. `after` returns None
    when it cannot follow; the derived state then computes the value afresh."""

    def after(self, removed: Sequence[Holder], added: Sequence[Holder]) -> "FollowsChanges | None":
        raise NotImplementedError


class FollowsWorkloads:
    """Like FollowsChanges, but told every workload that left and came, pod
    members included (what counts workloads rather than bookings)."""

    def after_workloads(self, removed: Sequence["Workload"], added: Sequence["Workload"]) -> "FollowsWorkloads | None":
        raise NotImplementedError


class IsolationLedger(_Value, frozen=True):
    """The original values of the isolation knobs the agent changed
    (numa_agent/isolation): recorded before the first write to a knob,
    dropped once it holds its original again."""

    originals: Mapping[str, str] = {}  # knob key -> value before the agent changed it
    # The boot they were read in ("" unknown): a reboot resets every knob, so
    # another boot's originals must never be written back.
    boot_id: str = ""
    # knob key -> the values the agent may have left in it: the one it wrote
    # and, between the checkpoint and the write, the next one. A knob holding
    # anything else was changed by someone else and is not overwritten.
    # Absent for a knob (older checkpoints): not known, restored as before.
    written: Mapping[str, tuple[str, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self.originals)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "IsolationLedger":
        return _from_json(d, cls)


class Revocation(_Value, frozen=True):
    """A workload an operator released while its process still ran. Its
    process keeps its mark (the affinity fallback) and its cgroup may keep its
    booking record until the release is enforced, either of which start-up
    would otherwise take for a workload the checkpoint lost and bring back.
    Kept while a trace of it may remain (see `service/revocations.py`): the
    process (pid, start time: a pid is never reused for a process with the
    same start time in one boot), or the record on its cgroup."""

    name: str
    pid: int | None = None  # the workload's process when it was released
    pid_identity: str | None = None  # "<boot id>:<start time>" of that process
    created_unix: float = 0.0  # with name and pid, tells its record from a later workload's
    cgroup: str = ""  # where it was enforced (plan.workload_relpath)
    released_unix: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    def covers(self, w: Workload) -> bool:
        """`w` (a booking record found on a cgroup) is the revoked booking itself."""
        return (w.name, w.pid, w.created_unix) == (self.name, self.pid, self.created_unix)

    def covers_process(self, pid: int, identity: str | None) -> bool:
        """The process (`pid`, its process_identity) is the revoked workload's own."""
        return pid == self.pid and (self.pid_identity is None or identity == self.pid_identity)


class AgentState(_Value, frozen=True, dict=True, weakref=True):
    # dict=True: room for the cached properties; weakref=True: a derived state
    # names the state it came from without keeping it alive (changes_since).
    workloads: tuple[Workload, ...] = ()  # sorted by name
    pods: tuple[Pod, ...] = ()  # sorted by name
    # The configuration the bookings were made under; a restart with another
    # policy must reconcile explicitly (see numa_agent.daemon.config).
    policy_fingerprint: str = ""
    isolation: IsolationLedger = IsolationLedger()
    # Workloads released while their process ran: never rebuilt or adopted again.
    revoked: tuple[Revocation, ...] = ()

    # ---- lookups ---------------------------------------------------------
    # By name through an index made once per state (and handed on to the
    # states derived by the updates below), not a scan per lookup: a node
    # holds a thousand workloads and every admission looks several up.
    def workload(self, name: str) -> Workload | None:
        return self._workload_index.get(name)

    def pod(self, name: str) -> Pod | None:
        return self._pod_index.get(name)

    def members_of(self, pod: str) -> tuple[Workload, ...]:
        return self._members.get(pod, ())

    @cached_property
    def _workload_index(self) -> Layered[str, Workload]:
        return Layered(_index(self.workloads))

    @cached_property
    def _pod_index(self) -> Layered[str, Pod]:
        return Layered(_index(self.pods))

    @cached_property
    def _members(self) -> dict[str, tuple[Workload, ...]]:
        out: dict[str, list[Workload]] = {}
        for w in self.workloads:
            if w.pod is not None:
                out.setdefault(w.pod, []).append(w)
        return {pod: tuple(ws) for pod, ws in out.items()}

    @cached_property
    def _workloads_sorted(self) -> bool:
        return _strictly_sorted(self.workloads)

    @cached_property
    def _pods_sorted(self) -> bool:
        return _strictly_sorted(self.pods)

    # ---- derived accounting --------------------------------------------
    @cached_property
    def memo(self) -> dict[str, Any]:
        """Values derived from this (immutable) state, computed once by the
        functions that need them. Not copied by `replace`: a new state starts
        with an empty memo; a state derived by the updates below starts with
        the values that FollowsChanges, followed."""
        return {}

    def top_level_holders(self) -> Iterable[Holder]:
        """What holds bookings against the machine: pods (their budgets) and
        workloads outside pods (a pod member's resources come out of its pod's
        budget)."""
        yield from self.pods
        for w in self.workloads:
            if w.pod is None:
                yield w

    def top_level_bookings(self) -> Iterable[Booking]:
        """Bookings against the machine: those of the top-level holders."""
        for holder in self.top_level_holders():
            yield holder.booking

    @cached_property
    def _cpu_holders(self) -> dict[int, int]:
        """CPU -> how many top-level bookings hold it (more than one only in a
        state that is not consistent): counted, so that a state derived by a
        few updates gets its exclusive CPUs exactly from this one's (_derive)."""
        return _holders_after({}, (), self.top_level_bookings(), _cpus_of)

    @cached_property
    def _exclusive_cpus(self) -> CpuSet:
        return CpuSet(self._cpu_holders)

    def exclusive_cpus(self) -> CpuSet:
        return self._exclusive_cpus

    @cached_property
    def _device_holders(self) -> dict[tuple[str, str], int]:
        """(resource, PCI address) -> how many top-level bookings hold it:
        counted and handed on like _cpu_holders."""
        return _holders_after({}, (), self.top_level_bookings(), _devices_of)

    @cached_property
    def _devices_in_use(self) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for resource, addr in self._device_holders:
            out.setdefault(resource, set()).add(addr)
        return {r: frozenset(a) for r, a in sorted(out.items())}

    def devices_in_use(self) -> dict[str, frozenset[str]]:
        return dict(self._devices_in_use)

    # ---- updates -----------------------------------------------------------
    def with_workload(self, w: Workload) -> "AgentState":
        if self._workloads_sorted:
            workloads = _put_sorted(self.workloads, w)
        else:
            rest = [x for x in self.workloads if x.name != w.name]
            workloads = tuple(sorted([*rest, w], key=lambda x: x.name))
        new = replace(self, workloads=workloads)
        return self._derive(new, workloads=(w.name,), index=("_workload_index", w.name, w))

    def without_workload(self, name: str) -> "AgentState":
        if self._workloads_sorted:
            workloads = _drop_sorted(self.workloads, name)
        else:
            workloads = tuple(x for x in self.workloads if x.name != name)
        new = replace(self, workloads=workloads)
        return self._derive(new, workloads=(name,), index=("_workload_index", name, None))

    def with_pod(self, p: Pod) -> "AgentState":
        if self._pods_sorted:
            pods = _put_sorted(self.pods, p)
        else:
            rest = [x for x in self.pods if x.name != p.name]
            pods = tuple(sorted([*rest, p], key=lambda x: x.name))
        new = replace(self, pods=pods)
        return self._derive(new, pods=(p.name,), index=("_pod_index", p.name, p))

    def without_pod(self, name: str) -> "AgentState":
        if self._pods_sorted:
            pods = _drop_sorted(self.pods, name)
        else:
            pods = tuple(x for x in self.pods if x.name != name)
        new = replace(self, pods=pods)
        return self._derive(new, pods=(name,), index=("_pod_index", name, None))

    def with_isolation(self, ledger: IsolationLedger) -> "AgentState":
        if ledger == self.isolation:
            return self
        return self._derive(replace(self, isolation=ledger), index=("", "", None))

    def with_revoked(self, revoked: tuple[Revocation, ...]) -> "AgentState":
        if revoked == self.revoked:
            return self
        return self._derive(replace(self, revoked=revoked), index=("", "", None))

    def _derive(self, new: "AgentState", *, workloads: tuple[str, ...] = (), pods: tuple[str, ...] = (),
                index: tuple[str, str, Any]) -> "AgentState":
        """Hand on what this state knows that still holds for `new`, which
        differs from it only in the named workloads or pods."""
        mine, theirs = self.__dict__, new.__dict__
        for key in ("_workload_index", "_pod_index"):
            if key in mine:
                theirs[key] = mine[key] if key != index[0] else _with_entry(mine[key], index[1], index[2])
        counted = [(key, held) for key, held in _COUNTED if key in mine]
        # Taken in one step (no Python code runs while it is copied): a value may be
        # added to this memo meanwhile by a reader outside the service's lock.
        memo = tuple(self.memo.items())
        followers = [(key, value) for key, value in memo if isinstance(value, FollowsChanges)]
        if (counted or followers) and self._workloads_sorted and self._pods_sorted:
            # (sorted: one value per name, so the named ones are all that changed)
            removed, added = _top_level_of(self, workloads, pods), _top_level_of(new, workloads, pods)
            for key, held in counted:
                theirs[key] = _holders_after(mine[key], [h.booking for h in removed],
                                             [h.booking for h in added], held)
            _hand_on_held(mine, theirs, (*removed, *added))
            for key, value in followers:
                followed = value.after(removed, added)
                if followed is not None:
                    new.memo[key] = followed
        counting = [(key, v) for key, v in memo if isinstance(v, FollowsWorkloads)]
        if counting and self._workloads_sorted:
            gone = [w for w in map(self.workload, workloads) if w is not None]
            came = [w for w in map(new.workload, workloads) if w is not None]
            for key, tally in counting:
                kept = tally.after_workloads(gone, came)
                if kept is not None:
                    new.memo[key] = kept
        for key in ("_workloads_sorted", "_pods_sorted"):
            if mine.get(key) is True:
                theirs[key] = True  # one entry replaced or dropped keeps the order
        if "_json_cache" in mine:
            cache = theirs["_json_cache"] = mine["_json_cache"]
            if index[0] == "_workload_index" and index[2] is None:
                cache.pop(index[1], None)  # released: not kept for ever
        # Each of the last few ancestors (held weakly: the intermediate states
        # of one decision are garbage at once) with what changed since it.
        changed_w, changed_p = frozenset(workloads), frozenset(pods)
        ancestors = [(weakref.ref(self), changed_w, changed_p)]
        for ref, w_names, p_names in self.memo.get("derived", ())[:_ANCESTORS - 1]:
            ancestors.append((ref, w_names | changed_w, p_names | changed_p))
        new.memo["derived"] = tuple(ancestors)
        return new

    def changes_since(self, base: "AgentState") -> tuple[frozenset[str], frozenset[str]] | None:
        """The names of the workloads and of the pods that may differ between
        `base` and this state, when this state was made from `base` by a few
        of the updates above; None when it was not (or that can no longer be
        told), and a caller must compare everything."""
        if base is self:
            return frozenset(), frozenset()
        for ref, workloads, pods in self.memo.get("derived", ()):
            if ref() is base:
                return workloads, pods
        return None

    # ---- serialization -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The checkpoint payload. Each workload's part is converted once and
        kept (for this state and the states derived from it) while the
        workload is unchanged: a checkpoint per admission must not convert a
        thousand unchanged workloads again. So the workload entries of the
        result are shared between calls: read them, never change them."""
        cache = self._json_cache
        workloads = []
        for w in self.workloads:
            entry = cache.get(w.name)
            if entry is None or entry[0] is not w:
                entry = cache[w.name] = (w, _without_unknown_identity(_to_json(w)))
            workloads.append(entry[1])
        out = {"schema": STATE_SCHEMA, "workloads": workloads,
               # Converted as the state's own field (a tuple stays a tuple, as before).
               "pods": _to_json_value(self.pods), "policy_fingerprint": self.policy_fingerprint}
        if self.isolation:  # only when there is one: older checkpoints read back unchanged
            out["isolation"] = self.isolation.to_json()
        if self.revoked:  # likewise
            out["revoked"] = _to_json_value(self.revoked)
        return out

    @cached_property
    def _json_cache(self) -> dict[str, tuple[Workload, dict[str, Any]]]:
        # name -> (the workload, its JSON): shared along a line of derived
        # states; an entry counts only for the very workload value it names.
        return {}

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
    """pid_identity, an engine's cgroup (booked whole or pinned inside), a runtime's container and the CPUs
    resizes added are written only when there are some, so older checkpoints read back unchanged."""
    for key in ("pid_identity", "cgroup", "runtime", "pinned_in"):
        if workload.get(key) is None:
            workload.pop(key, None)
    if not workload.get("cpus_added"):
        workload.pop("cpus_added", None)
    return workload


def _to_json(value: _Value) -> dict[str, Any]:
    """JSON-ready builtins: CPU sets as list text, tuples as lists, node ids as strings."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook, str_keys=True)


def _to_json_value(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=_enc_hook, str_keys=True)


_V = TypeVar("_V", bound=_Value)


def _from_json(d: Mapping[str, Any], cls: type[_V]) -> _V:
    """Decode what `_to_json` wrote; absent keys take their defaults, unknown keys
    are ignored. ValueError (naming the field) when a value has the wrong type."""
    try:
        return msgspec.convert(d, cls, dec_hook=_dec_hook, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{cls.__name__}: {exc}") from None


_Named = TypeVar("_Named", Workload, Pod)


def _index(values: tuple[_Named, ...]) -> dict[str, _Named]:
    """Name -> value; the first of equal names wins, as a scan would find it."""
    out: dict[str, _Named] = {}
    for v in values:
        out.setdefault(v.name, v)
    return out


def _top_level_of(state: AgentState, workloads: tuple[str, ...], pods: tuple[str, ...]) -> list[Holder]:
    """The top-level holders (see top_level_holders) among the named workloads and pods."""
    held: list[Holder] = [w for w in map(state.workload, workloads) if w is not None and w.pod is None]
    return held + [p for p in map(state.pod, pods) if p is not None]


def _cpus_of(booking: Booking) -> Iterable[int]:
    return booking.cpus.ids()


def _devices_of(booking: Booking) -> Iterable[tuple[str, str]]:
    return booking.devices


# What a state counts over its top-level bookings and hands on to the states
# derived from it: the cached property, and what one booking holds.
_COUNTED = (("_cpu_holders", _cpus_of), ("_device_holders", _devices_of))

_K = TypeVar("_K")


def _holders_after(counts: dict[_K, int], removed: Iterable[Booking], added: Iterable[Booking],
                   held: Callable[[Booking], Iterable[_K]]) -> dict[_K, int]:
    """`counts` (how many bookings hold each thing) with the `removed`
    bookings' things taken out and the `added` ones' put in: the cost of the
    change, not of the state."""
    out = dict(counts)
    for bookings, step in ((removed, -1), (added, 1)):
        for booking in bookings:
            for thing in held(booking):
                n = out.get(thing, 0) + step
                if n:
                    out[thing] = n
                else:
                    out.pop(thing, None)
    return out


def _hand_on_held(mine: dict[str, Any], theirs: dict[str, Any], changed: Sequence[Holder]) -> None:
    """The exclusive CPUs and the devices in use of a derived state, from its
    ancestor's and the `changed` holders (its counts already handed on): only
    what they hold can have come or gone."""
    if "_exclusive_cpus" in mine and "_cpu_holders" in theirs:
        bits, still = mine["_exclusive_cpus"].bits, theirs["_cpu_holders"]
        for h in changed:
            for cpu in h.booking.cpus.ids():
                bits = bits | 1 << cpu if cpu in still else bits & ~(1 << cpu)
        theirs["_exclusive_cpus"] = CpuSet.from_bits(bits)
    if "_devices_in_use" in mine and "_device_holders" in theirs:
        theirs["_devices_in_use"] = _devices_after(mine["_devices_in_use"], theirs["_device_holders"],
                                                   {d for h in changed for d in h.booking.devices})


def _devices_after(in_use: dict[str, frozenset[str]], holders: dict[tuple[str, str], int],
                   changed: set[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """`in_use` (resource -> addresses) with the `changed` devices in or out
    as `holders` (the new counts) says: the cost of the change."""
    if not changed:
        return in_use
    out = dict(in_use)
    for resource in {r for r, _ in changed}:
        addresses = set(out.get(resource, ()))
        for r, addr in changed:
            if r == resource:
                if (r, addr) in holders:
                    addresses.add(addr)
                else:
                    addresses.discard(addr)
        if addresses:
            out[resource] = frozenset(addresses)
        else:
            out.pop(resource, None)
    return dict(sorted(out.items()))


def _with_entry(index: Layered[str, Any], name: str, value: Any) -> Layered[str, Any]:
    return index.updated(removed=(name,)) if value is None else index.updated({name: value})


def _strictly_sorted(values: tuple[_Named, ...]) -> bool:
    return all(values[i].name < values[i + 1].name for i in range(len(values) - 1))


def _name(value: Workload | Pod) -> str:
    return value.name


def _put_sorted(values: tuple[_Named, ...], value: _Named) -> tuple[_Named, ...]:
    """`value` in its place in a tuple strictly sorted by name, replacing the
    one of that name."""
    i: int = bisect_left(values, value.name, key=_name)
    end: int = i + 1 if i < len(values) and values[i].name == value.name else i
    return values[:i] + (value,) + values[end:]


def _drop_sorted(values: tuple[_Named, ...], name: str) -> tuple[_Named, ...]:
    i = bisect_left(values, name, key=_name)
    if i < len(values) and values[i].name == name:
        return values[:i] + values[i + 1:]
    return values


def _sorted_devices(b: Booking) -> Booking:
    devices = tuple(sorted(b.devices))
    return b if devices == b.devices else replace(b, devices=devices)


_Holder = TypeVar("_Holder", Workload, Pod)


def _with_booking(value: _Holder, booking: Booking) -> _Holder:
    return value if booking is value.booking else replace(value, booking=booking)
