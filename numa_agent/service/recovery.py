"""Start-up: restore the checkpoint, then reconcile it with the kernel.

- A workload whose cgroup is gone or empty (or, in the affinity fallback,
  whose process is gone) is released; not one its runtime enforces (NRI,
  `Workload.runtime`), which has neither and stays as the checkpoint has it.
- A populated workload or pod cgroup the checkpoint does not know is adopted
  from its booking record (the `user.numa_agent.record` attribute the agent
  writes on the cgroup, see enforcement/record.py) when it has one that
  agrees with the cgroup (same name, pod and CPUs): memory per node,
  hugepages, devices, owner, pod and request come back as booked. Without
  one (a cgroup made by an older agent, or a record that disagrees) it is
  adopted from its cpuset files, and its `memory.max` and `hugetlb.*.max`
  are booked on its memory nodes and kept as its limits: recovery never
  loosens a limit. Either way, CPUs, memory or devices already booked by
  others are left out and the conflict is logged: never double-book (a
  workload left without CPUs is adopted as shared).
- A corrupt checkpoint is moved aside; the previous generation
  (`checkpoint.json.prev`) is used when it is good, else the state starts
  empty. Either way what it lacks is rebuilt: from the cgroup tree (adopted,
  below), or in the affinity fallback from the processes numa-run marked
  (`rebuild.py`, where what cannot be attributed is held for an operator).
  The node keeps working.
- A checkpoint written under other policies is refused with the remedy, or
  reconciled (bookings kept, new admissions follow the new policies) when
  the configuration says `on_policy_change = "reconcile"`.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from numa_agent.admission.accounting import unclaimed_cpus
from numa_agent.admission.admit import memory_usage
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import MEMORY, free_bytes, hugepages_resource
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.core.units import format_bytes
from numa_agent.enforcement.plan import (
    POD_PREFIX,
    SHARED_CGROUP,
    WORKLOAD_PREFIX,
    engine_clash,
    engine_held,
    safe_component,
    workload_relpath,
)
from numa_agent.enforcement.protocol import NO_LIMITS, Enforcer, Limits, engines_of, kept_records
from numa_agent.enforcement.record import decode_record
from numa_agent.hotplug.rebase import rebase_state
from numa_agent.service.rebuild import rebuild_from_live, source_text
from numa_agent.service.revocation_copy import merged
from numa_agent.service.revocations import revoked_by
from numa_agent.state.checkpoint import CheckpointCorruptError, Loaded
from numa_agent.state.model import AgentState, Booking, Pod, Revocation, Workload, replace

log = logging.getLogger("numa_agent.recovery")


class PolicyChanged(ValueError):
    """The checkpoint's bookings were made under other policies and the configuration
    does not say to keep them (`on_policy_change = "reconcile"`): a configuration error."""


@dataclass(frozen=True)
class RecoveryReport:
    restored: int
    released: tuple[str, ...]
    adopted: tuple[str, ...]
    quarantined: str | None
    policy_reconciled: bool
    generation: str | None = None  # the checkpoint file the state came from
    rebuilt: tuple[str, ...] = ()  # from live processes (affinity fallback)
    held: tuple[str, ...] = ()  # quarantined: CPUs held until an operator releases them


def restore(machine: Machine, store, enforcer: Enforcer, on_policy_change: str = "refuse",
            uid_of=None, mark_key: bytes | None = None, key_new: bool = False,
            revoked_copy: tuple[Revocation, ...] = ()) -> tuple[AgentState, RecoveryReport]:
    """The state to start from, and what was done to find it. `revoked_copy`:
    the revocations kept beside the mark key (service/revocation_copy.py),
    which outlive a lost checkpoint; `key_new`: the mark key was made at this
    start, so no live mark can be this agent's."""
    fingerprint = machine.policy.fingerprint()
    marked = enforcer.live_marked()
    source = source_text(marked, cgroups=kept_records(enforcer) is not None)
    quarantined = generation = None
    try:
        loaded = store.load_generation()
        quarantined, generation = _set_aside(store, loaded, source)
        state = _decoded(store, loaded)
    except (CheckpointCorruptError, ValueError, KeyError, TypeError) as exc:
        moved = store.quarantine(path=store.directory / generation if generation else None)
        _set_aside_journal(store)
        quarantined, generation = (quarantined or (str(moved) if moved else None)), None
        log.error("checkpoint unusable (%s); moved aside to %s; rebuilding from %s",
                  exc, moved, source)
        state = None
    if state is None:
        state = AgentState(policy_fingerprint=fingerprint)

    reconciled = False
    if state.workloads or state.pods:
        if state.policy_fingerprint and state.policy_fingerprint != fingerprint:
            if on_policy_change != "reconcile":
                raise PolicyChanged(
                    f"the checkpoint in {store.directory} holds {len(state.workloads)} workload(s) "
                    f"booked under other policies (fingerprint {state.policy_fingerprint}, now "
                    f"{fingerprint}: {machine.policy.describe()}). Either restore the previous "
                    f"cpu/memory/topology manager policies, or release the workloads first, or set "
                    f"agent.on_policy_change = \"reconcile\" to keep their bookings and apply the new "
                    f"policies to new admissions only")
            log.warning("policies changed since the checkpoint; keeping %d bookings as they are, "
                        "new admissions follow the new policies", len(state.workloads))
            reconciled = True
    state = replace(state, policy_fingerprint=fingerprint)
    state = state.with_revoked(merged(state.revoked, revoked_copy))  # before anything is adopted or rebuilt

    # CPUs or devices that disappeared while the agent was down.
    state, lost = rebase_state(machine, state)
    for name, what in lost:
        log.warning("workload %s lost %s while the agent was stopped", name, what)

    # A container its runtime enforces has no cgroup nor process of the agent's
    # to follow: it stands until released by name (its runtime tells, NRI).
    released = [w.name for w in state.workloads
                if w.runtime is None and not (_still_pinned_in(enforcer, w)
                                              and enforcer.track(workload_relpath(w), w.pid, w.pid_identity))]
    for name in released:
        from numa_agent.admission.admit import release
        state, _, _ = release(state, name)
    state, adopted = _adopt(machine, state, enforcer, uid_of)
    state, engines = _adopt_engines(machine, state, enforcer)
    adopted += engines
    live = rebuild_from_live(machine, state, enforcer, marked, mark_key, key_new=key_new)
    state = live.state
    report = RecoveryReport(restored=len(state.workloads), released=tuple(released),
                            adopted=tuple(adopted), quarantined=quarantined,
                            policy_reconciled=reconciled, generation=generation,
                            rebuilt=live.rebuilt, held=live.held)
    if released or adopted or quarantined or live.rebuilt or live.held:
        log.warning("recovery: released %s; adopted %s; rebuilt from processes %s; held %s",
                    ", ".join(released) or "none", ", ".join(adopted) or "none",
                    ", ".join(live.rebuilt) or "none", ", ".join(live.held) or "none")
    return state, report


def _decoded(store, loaded: Loaded) -> AgentState | None:
    """The state of what was loaded. When it does not decode only with the
    journal's entries replayed, the journal is moved aside and the snapshot
    alone used (what the entries held is rebuilt like any other loss)."""
    if loaded.data is None:
        return None
    try:
        return AgentState.from_json(loaded.data)
    except (ValueError, KeyError, TypeError) as exc:
        if not loaded.journal_entries:
            raise
        alone = store.load_generation(replay=False)
        if alone.path != loaded.path or alone.data is None:
            raise
        state = AgentState.from_json(alone.data)
        moved = store.quarantine(path=store.journal_path)
        log.error("checkpoint journal %s does not apply to %s (%s); moved aside to %s; using the "
                  "snapshot alone", store.journal_path, loaded.path, exc, moved)
        return state


def _set_aside_journal(store) -> None:
    """The snapshot was moved aside: the journal that follows it goes with it
    (kept for inspection, never emptied by the next snapshot)."""
    journal = getattr(store, "journal_path", None)
    try:
        if journal is None or not journal.stat().st_size:
            return
    except OSError:
        return
    log.error("checkpoint journal %s moved aside to %s with its checkpoint", journal,
              store.quarantine(path=journal))


def _set_aside(store, loaded: Loaded, source: str) -> tuple[str | None, str | None]:
    """Move the damaged generations aside and say which one is used; returns
    (where the current checkpoint was moved, the file name of the one used)."""
    moved_current = None
    for damage in loaded.damaged:
        moved = store.quarantine(path=damage.path)
        if damage.path == store.path:
            moved_current = str(moved) if moved else None
        log.error("checkpoint %s unusable (%s); moved aside to %s", damage.path, damage.reason, moved)
    journal = getattr(store, "journal_path", None)
    if loaded.torn_bytes:
        log.warning("checkpoint journal %s ends in a torn entry (%d bytes, an interrupted write that "
                    "was never acknowledged); ignored", journal, loaded.torn_bytes)
    if any(d.path == journal for d in loaded.damaged):
        log.error("checkpoint journal %s is damaged; using %s with the %d journal entries before the "
                  "damage; what the rest held is rebuilt from %s", journal, loaded.path,
                  loaded.journal_entries, source)
    elif loaded.journal_entries:
        log.info("checkpoint %s and %d journal entries after it restored", loaded.path,
                 loaded.journal_entries)
    if loaded.fallback:
        log.error("checkpoint %s is %s; using the previous generation %s; what it lacks is "
                  "rebuilt from %s", store.path,
                  "damaged" if any(d.path == store.path for d in loaded.damaged) else "missing",
                  loaded.path, source)
    elif loaded.path is None and loaded.damaged:
        log.error("no good checkpoint generation; starting empty, rebuilding from %s", source)
    return moved_current, loaded.path.name if loaded.path is not None else None


def _adopt(machine: Machine, state: AgentState, enforcer: Enforcer,
           uid_of) -> tuple[AgentState, list[str]]:
    """Adopt populated workload and pod cgroups the state does not know: from
    each one's booking record where it has a sound one, else from its cpuset
    and limits. Parents come before children, so a pod before its members."""
    known = {workload_relpath(w) for w in state.workloads} | {f"{POD_PREFIX}{p.name}" for p in state.pods}
    adopted: list[str] = []
    for rel in enforcer.existing():
        if rel in known or not enforcer.populated(rel):
            continue
        try:
            place = _place_of(rel)
        except ValueError:
            log.warning("ignoring cgroup %s: not a name this agent creates", rel)
            continue
        if place is None:
            continue
        if place.is_pod:
            state = state.with_pod(_adopted_pod(machine, state, enforcer, rel, place))
            adopted.append(f"pod {place.name}")
            continue
        if state.workload(place.name) is not None:
            continue
        pod = state.pod(place.pod) if place.pod is not None else None
        if place.pod is not None and pod is None:
            continue
        if _revoked(state, rel, _kept_record(enforcer, rel) if state.revoked else None):
            continue
        w = _adopted_workload(machine, state, enforcer, rel, place, pod, uid_of)
        state = state.with_workload(w)
        if pod is not None:
            state = state.with_pod(replace(pod, members=tuple(sorted({*pod.members, w.name}))))
        adopted.append(w.name)
    return state, adopted


def _still_pinned_in(enforcer: Enforcer, w: Workload) -> bool:
    """A workload pinned inside a shared cgroup is followed again only while its
    process is still in that cgroup: moved out while the agent was down (or a
    damaged `pinned_in`), its grant, and so its booking, are not that cgroup's."""
    engines = engines_of(enforcer)
    if w.pinned_in is None or engines is None:
        return True  # (an agent without cgroups tells no cgroup: it follows the process alone)
    where = engines.cgroup_of(w.pid) if w.pid is not None else None
    if where is not None and where != w.pinned_in:
        log.warning("%s: pid %s is in cgroup %s, not %s where it was pinned; released", w.name, w.pid,
                    where, w.pinned_in)
    return where == w.pinned_in


def _adopt_engines(machine: Machine, state: AgentState, enforcer: Enforcer) -> tuple[AgentState, list[str]]:
    """Adopt the workloads enforced on engines' cgroups (containers, Slurm
    tasks) that the state lost, from the record on each: only one that names
    that very cgroup, while it still holds processes, never double-booking."""
    engines = engines_of(enforcer)
    if engines is None:
        return state, []
    # Pinned workloads hold theirs too: no whole booking joins them there, nor above or below.
    known = sorted(held for w in state.workloads if (held := engine_held(w)) is not None)
    adopted: list[str] = []
    for rel in engines.engine_cgroups():  # parents before children
        if rel in known or not enforcer.populated(rel):
            continue
        clash = engine_clash(known, rel)
        if clash is not None:
            # A cpuset there governs the whole subtree: one workload in it at most.
            log.warning("engine cgroup %s: a booking record below or above %s, which holds a workload; "
                        "left alone", rel, clash)
            continue
        data = _kept_record(enforcer, rel)
        try:
            record = decode_record(data) if data is not None else None
        except ValueError as exc:
            log.warning("engine cgroup %s: booking record unreadable (%s); left alone", rel, exc)
            continue
        if _revoked(state, rel, data):
            continue
        if not isinstance(record, Workload) or record.cgroup != rel or state.workload(record.name) is not None:
            log.warning("engine cgroup %s: its booking record does not name it, or names a workload "
                        "that exists; left alone", rel)
            continue
        pod = state.pod(record.pod) if record.pod is not None else None
        w = _from_record(machine, state, rel, record, pod, enforcer.pids(rel))
        state = state.with_workload(w)
        if pod is not None:
            state = state.with_pod(replace(pod, members=tuple(sorted({*pod.members, w.name}))))
        adopted.append(w.name)
        bisect.insort(known, rel)
    return state, adopted


def _revoked(state: AgentState, rel: str, data: bytes | None) -> bool:
    """The booking record `data` found on `rel` is of a workload an operator
    released while it ran (a crash came before the release was enforced):
    not adopted; start-up hands what runs there to the shared pool."""
    revocation = revoked_by(state.revoked, data)
    if revocation is None:
        return False
    log.warning("cgroup %s: its workload %s was released by an operator; not adopted, its processes go "
                "to the shared pool", rel, revocation.name)
    return True


class _Place(NamedTuple):
    """What a cgroup's path says it holds."""

    name: str
    pod: str | None = None  # the pod of a member
    shared: bool | None = None  # None: a pod member, whose path does not say
    is_pod: bool = False  # the pod's own cgroup (its budget)


def _place_of(rel: str) -> _Place | None:
    """None for paths the agent does not adopt; ValueError for unsafe names."""
    parts = rel.split("/")
    if len(parts) == 1 and parts[0].startswith(WORKLOAD_PREFIX):
        return _Place(safe_component(parts[0][len(WORKLOAD_PREFIX):]), shared=False)
    if len(parts) == 2 and parts[0] == SHARED_CGROUP:
        return _Place(safe_component(parts[1]), shared=True)
    if len(parts) == 1 and parts[0].startswith(POD_PREFIX):
        return _Place(safe_component(parts[0][len(POD_PREFIX):]), is_pod=True)
    if len(parts) == 2 and parts[0].startswith(POD_PREFIX):
        return _Place(safe_component(parts[1]), pod=safe_component(parts[0][len(POD_PREFIX):]))
    return None


def _kept_record(enforcer: Enforcer, rel: str) -> bytes | None:
    """The booking record kept with `rel`, None when the enforcer keeps none."""
    kept = kept_records(enforcer)
    return kept.read_record(rel) if kept is not None else None


def _kept_limits(enforcer: Enforcer, rel: str) -> Limits:
    """The limits set on `rel`, NO_LIMITS when the enforcer sets none."""
    kept = kept_records(enforcer)
    return kept.read_limits(rel) if kept is not None else NO_LIMITS


def _record_of(enforcer: Enforcer, rel: str, place: _Place, cpus: CpuSet) -> Workload | Pod | None:
    """The cgroup's booking record, when it has one that agrees with the cgroup."""
    data = _kept_record(enforcer, rel)
    if data is None:
        return None
    try:
        value = decode_record(data)
    except ValueError as exc:
        log.warning("cgroup %s: booking record unreadable (%s); adopting it from its cpuset and "
                    "limits", rel, exc)
        return None
    problem = _disagreement(value, place, cpus)
    if problem:
        log.warning("cgroup %s: booking record ignored, %s; adopting it from its cpuset and limits",
                    rel, problem)
        return None
    return value


def _disagreement(value: Workload | Pod, place: _Place, cpus: CpuSet) -> str | None:
    kind = "pod" if place.is_pod else "workload"
    if not isinstance(value, Pod if place.is_pod else Workload):
        return f"it is not a {kind}'s"
    if value.name != place.name:
        return f"it names {kind} {value.name!r}"
    if isinstance(value, Workload):
        if value.pod != place.pod:
            return f"it names pod {value.pod!r}" if value.pod else "it names no pod"
        if place.shared is not None and value.shared != place.shared:
            return "it says shared" if value.shared else "it says exclusive"
        if value.shared:
            return None  # on the shared pool: its cpuset is the pool's, not a booking
    if value.booking.cpus and value.booking.cpus != cpus:
        return (f"it books CPUs {value.booking.cpus.format()} and the cgroup has "
                f"{cpus.format() or 'none'}")
    return None


def _adopted_pod(machine: Machine, state: AgentState, enforcer: Enforcer, rel: str, place: _Place) -> Pod:
    cpus, mems = enforcer.read_cpuset(rel)
    record = _record_of(enforcer, rel, place, cpus)
    if isinstance(record, Pod):
        # Members are adopted from their own cgroups, which come next.
        return replace(record, booking=_claimable(machine, state, rel, record.booking), members=())
    limits = _kept_limits(enforcer, rel)
    cpus = _unbooked(machine, state, cpus, rel)
    memory, group = _memory_of_limits(machine, state, rel, mems, limits)
    return Pod(name=place.name, owner_uid=0, request=_limits_request(limits),
               booking=Booking(cpus=cpus, numa_nodes=machine.nodes_of(cpus), mems=mems,
                               memory=memory, memory_group=group))


def _adopted_workload(machine: Machine, state: AgentState, enforcer: Enforcer, rel: str, place: _Place,
                      pod: Pod | None, uid_of) -> Workload:
    cpus, mems = enforcer.read_cpuset(rel)
    pids = enforcer.pids(rel)
    record = _record_of(enforcer, rel, place, cpus)
    if isinstance(record, Workload):
        return _from_record(machine, state, rel, record, pod, pids)
    limits = _kept_limits(enforcer, rel)
    if pod is not None:
        # A member's memory is a limit inside its pod's budget, not a booking.
        shared = cpus == pod.booking.cpus or len(cpus) == 0
        booking = Booking(cpus=CpuSet() if shared else cpus & pod.booking.cpus,
                          numa_nodes=pod.booking.numa_nodes, mems=mems)
    elif place.shared:
        shared = True
        memory, group = _memory_of_limits(machine, state, rel, mems, limits)
        booking = Booking(numa_nodes=(), mems=mems, memory=memory, memory_group=group)
    else:
        cpus = _unbooked(machine, state, cpus, rel)
        shared = not cpus
        memory, group = _memory_of_limits(machine, state, rel, mems, limits)
        booking = Booking(cpus=cpus, numa_nodes=machine.nodes_of(cpus), mems=mems, memory=memory,
                          memory_group=group)
    owner = uid_of(pids[0]) if uid_of and pids else 0
    return Workload(name=place.name, owner_uid=owner, booking=booking, shared=shared, pod=place.pod,
                    pid=pids[0] if pids else None,
                    request={"adopted": True, **_limits_request(limits)})


def _from_record(machine: Machine, state: AgentState, rel: str, record: Workload, pod: Pod | None,
                 pids: list[int]) -> Workload:
    """A workload adopted from the booking record on its cgroup: what nobody else
    holds now (out of its pod's budget when its pod is known; outside any pod when
    the record's pod is gone), and the recorded process while it is still there,
    else whoever is."""
    booking = (_claimable_in_pod(state, pod, rel, record.booking) if pod is not None
               else _claimable(machine, state, rel, record.booking))
    pid, identity = ((record.pid, record.pid_identity) if record.pid in pids
                     else (pids[0] if pids else None, None))
    return replace(record, booking=booking, shared=record.shared or not booking.cpus,
                   pod=record.pod if pod is not None else None, pid=pid, pid_identity=identity)


def _unbooked(machine: Machine, state: AgentState, cpus: CpuSet, rel: str) -> CpuSet:
    """The part of an adopted cgroup's CPUs that nobody else holds."""
    free, clash = unclaimed_cpus(machine, state, cpus)
    if clash:
        log.error("cgroup %s claims CPUs %s that are already booked; adopting it without them",
                  rel, clash.format())
    return free


def _claimable(machine: Machine, state: AgentState, rel: str, booking: Booking) -> Booking:
    """A recorded booking against the machine, without what others hold now."""
    memory, group = _unbooked_memory(machine, state, rel, booking)
    return replace(booking, cpus=_unbooked(machine, state, booking.cpus, rel), memory=memory,
                   memory_group=group, devices=_unbooked_devices(machine, state, rel, booking.devices))


def _claimable_in_pod(state: AgentState, pod: Pod, rel: str, booking: Booking) -> Booking:
    """A recorded member's booking, out of its pod's budget: the pod's CPUs
    and devices that no other member holds."""
    members = [m for m in state.members_of(pod.name) if workload_relpath(m) != rel]
    taken = CpuSet.union_of(m.booking.cpus for m in members)
    cpus = booking.cpus & pod.booking.cpus - taken
    if cpus != booking.cpus:
        log.error("cgroup %s claims CPUs %s outside its pod's budget or already booked; adopting it "
                  "without them", rel, (booking.cpus - cpus).format())
    held = {d for m in members for d in m.booking.devices}
    devices = tuple(d for d in booking.devices if d in pod.booking.devices and d not in held)
    if devices != booking.devices:
        log.error("cgroup %s claims devices %s outside its pod's budget or already booked; adopting "
                  "it without them", rel, ", ".join(a for _, a in sorted(set(booking.devices) - set(devices))))
    return replace(booking, cpus=cpus, devices=devices)


def _unbooked_devices(machine: Machine, state: AgentState, rel: str,
                      devices: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    in_use = state.devices_in_use()
    kept = []
    for resource, addr in devices:
        if addr not in {d.address for d in machine.devices.devices(resource)}:
            log.error("cgroup %s claims %s device %s, which this machine does not offer; adopting it "
                      "without it", rel, resource, addr)
        elif addr in in_use.get(resource, ()):
            log.error("cgroup %s claims %s device %s that is already booked; adopting it without it",
                      rel, resource, addr)
        else:
            kept.append((resource, addr))
    return tuple(kept)


def _unbooked_memory(machine: Machine, state: AgentState, rel: str,
                     booking: Booking) -> tuple[dict[int, dict[str, int]], tuple[int, ...]]:
    """A recorded memory booking, less what is no longer free; nothing when its
    group would overlap another group in use (the memory manager's rule)."""
    if not booking.memory:
        return {}, ()
    group = NumaMask(booking.memory_group or booking.memory.keys())
    usage = memory_usage(state)
    if not _group_fits(usage, group, rel):
        return {}, ()
    memory: dict[int, dict[str, int]] = {}
    for node, per in sorted(booking.memory.items()):
        for resource, amount in sorted(per.items()):
            free = free_bytes(machine.memory, usage, node, resource) if node in group else 0
            take = min(amount, free)
            if take < amount:
                log.error("cgroup %s claims %s of %s on NUMA node %d; %s of it already booked or "
                          "not there; adopting it with %s", rel, format_bytes(amount), resource, node,
                          format_bytes(amount - max(take, 0)), format_bytes(max(take, 0)))
            if take > 0:
                memory.setdefault(node, {})[resource] = take
    return memory, (booking.memory_group if memory else ())


def _group_fits(usage, group: NumaMask, rel: str) -> bool:
    for n in group.nodes():
        held = usage.group_of(n)
        if held is not None and held != group:
            log.error("cgroup %s: its memory on NUMA node(s) %s would overlap the memory group {%s} "
                      "in use; adopting it without booking memory (its limits stay)", rel,
                      group.format(), held.format())
            return False
    return True


def _memory_of_limits(machine: Machine, state: AgentState, rel: str, mems: tuple[int, ...],
                      limits: Limits) -> tuple[dict[int, dict[str, int]], tuple[int, ...]]:
    """Book the memory a cgroup without a record may use, as its limits say,
    on its memory nodes: one node holds it all; several hold it as one group
    (the memory manager's rule), filled in node order. What is not free any
    more is left out and logged; the limits stay as they are either way."""
    wanted = [(hugepages_resource(kb), amount) for kb, amount in sorted(limits.hugetlb_max.items())]
    if limits.memory_max:
        wanted.append((MEMORY, limits.memory_max))
    nodes = tuple(n for n in mems if n in machine.memory.memory_nodes)
    if machine.policy.memory_policy != "static" or not wanted or not nodes:
        return {}, ()
    group = NumaMask(nodes)
    usage = memory_usage(state)
    if not _group_fits(usage, group, rel):
        return {}, ()
    memory: dict[int, dict[str, int]] = {}
    for resource, amount in wanted:
        left = amount
        for n in nodes:
            take = min(left, free_bytes(machine.memory, usage, n, resource))
            if take > 0:
                memory.setdefault(n, {})[resource] = take
                left -= take
        if left:
            log.error("cgroup %s may use %s of %s on NUMA node(s) %s; %s of it could not be "
                      "booked (already booked or not there); its limit stays", rel, format_bytes(amount),
                      resource, group.format(), format_bytes(left))
    return memory, (group.nodes() if memory else ())


def _limits_request(limits: Limits) -> dict[str, Any]:
    """The request that makes the layout keep the limits found."""
    out: dict[str, Any] = {}
    if limits.memory_max is not None:
        out["memory_bytes"] = limits.memory_max
    if limits.hugetlb_max:
        out["hugepages"] = {str(kb): amount // (kb * 1024) for kb, amount in sorted(limits.hugetlb_max.items())}
    return out
