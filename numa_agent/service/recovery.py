"""Start-up: restore the checkpoint, then reconcile it with the kernel.

- A workload whose cgroup is gone or empty (or, in the affinity fallback,
  whose process is gone) is released.
- A populated workload cgroup the checkpoint does not know is adopted from
  its cpuset files, unless its CPUs are already booked (then it is adopted
  as shared and the conflict is logged: never double-book).
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

import logging
from dataclasses import dataclass

from numa_agent.admission.machine import Machine
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.plan import POD_PREFIX, SHARED_CGROUP, WORKLOAD_PREFIX, safe_component, workload_relpath
from numa_agent.enforcement.protocol import Enforcer
from numa_agent.hotplug.rebase import rebase_state
from numa_agent.service.config import ConfigError
from numa_agent.service.rebuild import rebuild_from_live, source_text
from numa_agent.state.checkpoint import CheckpointCorruptError, Loaded
from numa_agent.state.model import AgentState, Booking, Pod, Workload, replace

log = logging.getLogger("numa_agent.recovery")


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
            uid_of=None) -> tuple[AgentState, RecoveryReport]:
    fingerprint = machine.policy.fingerprint()
    marked = enforcer.live_marked()
    quarantined = generation = None
    try:
        loaded = store.load_generation()
        quarantined, generation = _set_aside(store, loaded, source_text(marked))
        state = AgentState.from_json(loaded.data) if loaded.data is not None else None
    except (CheckpointCorruptError, ValueError, KeyError, TypeError) as exc:
        moved = store.quarantine(path=store.directory / generation if generation else None)
        quarantined, generation = (quarantined or (str(moved) if moved else None)), None
        log.error("checkpoint unusable (%s); moved aside to %s; rebuilding from %s",
                  exc, moved, source_text(marked))
        state = None
    if state is None:
        state = AgentState(policy_fingerprint=fingerprint)

    reconciled = False
    if state.workloads or state.pods:
        if state.policy_fingerprint and state.policy_fingerprint != fingerprint:
            if on_policy_change != "reconcile":
                raise ConfigError(
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

    # CPUs or devices that disappeared while the agent was down.
    state, lost = rebase_state(machine, state)
    for name, what in lost:
        log.warning("workload %s lost %s while the agent was stopped", name, what)

    released = [w.name for w in state.workloads
                if not enforcer.track(workload_relpath(w), w.pid, w.pid_identity)]
    for name in released:
        from numa_agent.admission.admit import release
        state, _, _ = release(state, name)
    state, adopted = _adopt(machine, state, enforcer, uid_of)
    live = rebuild_from_live(machine, state, enforcer, marked)
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


def _set_aside(store, loaded: Loaded, source: str) -> tuple[str | None, str | None]:
    """Move the damaged generations aside and say which one is used; returns
    (where the current checkpoint was moved, the file name of the one used)."""
    moved_current = None
    for damage in loaded.damaged:
        moved = store.quarantine(path=damage.path)
        if damage.path == store.path:
            moved_current = str(moved) if moved else None
        log.error("checkpoint %s unusable (%s); moved aside to %s", damage.path, damage.reason, moved)
    if loaded.fallback:
        log.error("checkpoint %s is %s; using the previous generation %s; what it lacks is "
                  "rebuilt from %s", store.path, "damaged" if loaded.damaged else "missing",
                  loaded.path, source)
    elif loaded.damaged:
        log.error("no good checkpoint generation; starting empty, rebuilding from %s", source)
    return moved_current, loaded.path.name if loaded.path is not None else None


def _adopt(machine: Machine, state: AgentState, enforcer: Enforcer,
           uid_of) -> tuple[AgentState, list[str]]:
    """Adopt populated workload cgroups the state does not know."""
    known = {workload_relpath(w) for w in state.workloads} | {f"{POD_PREFIX}{p.name}" for p in state.pods}
    adopted: list[str] = []
    for rel in enforcer.existing():
        if rel in known or not enforcer.populated(rel):
            continue
        parts = rel.split("/")
        try:
            if len(parts) == 1 and parts[0].startswith(WORKLOAD_PREFIX):
                name, pod, shared = safe_component(parts[0][len(WORKLOAD_PREFIX):]), None, False
            elif len(parts) == 2 and parts[0] == SHARED_CGROUP:
                name, pod, shared = safe_component(parts[1]), None, True
            elif len(parts) == 1 and parts[0].startswith(POD_PREFIX):
                pod_name = safe_component(parts[0][len(POD_PREFIX):])
                cpus, mems = enforcer.read_cpuset(rel)
                cpus = _unbooked(machine, state, cpus, rel)
                state = state.with_pod(Pod(name=pod_name, owner_uid=0,
                                           booking=Booking(cpus=cpus, numa_nodes=machine.nodes_of(cpus),
                                                           mems=mems)))
                adopted.append(f"pod {pod_name}")
                continue
            elif len(parts) == 2 and parts[0].startswith(POD_PREFIX):
                name, pod, shared = safe_component(parts[1]), parts[0][len(POD_PREFIX):], None
            else:
                continue
        except ValueError:
            log.warning("ignoring cgroup %s: not a name this agent creates", rel)
            continue
        if state.workload(name) is not None:
            continue
        cpus, mems = enforcer.read_cpuset(rel)
        pids = enforcer.pids(rel)
        if pod is not None:
            p = state.pod(pod)
            if p is None:
                continue
            shared = cpus == p.booking.cpus or len(cpus) == 0
            booking = Booking(cpus=CpuSet() if shared else cpus & p.booking.cpus,
                              numa_nodes=p.booking.numa_nodes, mems=mems)
            state = state.with_pod(replace(p, members=tuple(sorted({*p.members, name}))))
        elif shared:
            booking = Booking(numa_nodes=(), mems=mems)
        else:
            cpus = _unbooked(machine, state, cpus, rel)
            shared = not cpus
            booking = Booking(cpus=cpus, numa_nodes=machine.nodes_of(cpus), mems=mems)
        owner = uid_of(pids[0]) if uid_of and pids else 0
        state = state.with_workload(Workload(name=name, owner_uid=owner, booking=booking, shared=shared,
                                             pod=pod, pid=pids[0] if pids else None,
                                             request={"adopted": True}))
        adopted.append(name)
    return state, adopted


def _unbooked(machine: Machine, state: AgentState, cpus: CpuSet, rel: str) -> CpuSet:
    """The part of an adopted cgroup's CPUs that nobody else holds."""
    usable = cpus & machine.usable_cpus - machine.reserved_cpus
    clash = usable & state.exclusive_cpus()
    if clash:
        log.error("cgroup %s claims CPUs %s that are already booked; adopting it without them",
                  rel, clash.format())
    return usable - clash
