"""Rebuilding workloads from their live processes (the affinity fallback).

Without cgroups nothing of a workload outlives the agent but its processes,
which numa-run marked with `NUMA_AGENT_WORKLOAD=<name>` (see
`numa_agent.enforcement.marked`). When the checkpoint (both generations of
it) lost a workload, its CPUs are still in use; handing them out again would
double-book them at kernel level. So after loading whatever generation is
good, start-up reconciles the state with the marked processes:

- A workload of the state whose process is alive was already followed
  (`Enforcer.track`); processes carrying its name are its own.
- Of the processes carrying a name the state does not know, the oldest one
  is the workload (numa-run's exec'd command); younger ones of that name are
  its children, which inherited the environment.
- That process is rebuilt as the workload: its name, its owner (effective
  uid), its PID and identity, and its CPUs from its affinity within the
  usable CPUs: exclusive, minus any CPU another workload already holds (the
  holder keeps it; the conflict is logged as an error). Memory nodes and
  devices are booked as its environment names them; memory and hugepage
  amounts cannot be read back, so the workload is marked
  `request["rebuilt"] = "partial"` with what is unknown.
- `NUMA_AGENT_EXCLUSIVE` (0 or 1, set by numa-run) says whether it is shared;
  without it (an older numa-run) its affinity tells only in some cases: a reserved CPU
  in it means the shared pool (reserved CPUs are never booked exclusively,
  and the shared pool has them unless the reservation is strict). An
  affinity that is the whole shared pool it could be on, or that differs
  from the CPUs it was given (`NUMA_AGENT_CPUS`, so it moved since), cannot
  be told apart. Such a process, or one whose CPUs all belong to others or
  whose name is not a workload name, is *held*: its CPUs are booked to a
  quarantined entry (`request["rebuilt"] = "quarantined"`, owner root, no
  process followed) that status and health report and that only an operator
  releases (`numa-agent release NAME`, as root).

Only a process whose `NUMA_AGENT_MARK` is the agent's token for its own
(name, pid, start time) is trusted (`numa_agent.core.mark`): anyone can
write the name into their environment and pin their own affinity. Another
marked process is neither rebuilt nor held, only logged; its children carry
the leader's token and are passed over silently. The one exception is a
process of root with no token at all (a numa-run older than the token),
trusted as before so that an upgrade keeps root's workloads.

A process the state's revocations name (a workload an operator released while
it ran: `AgentState.revoked`) is neither rebuilt nor held, nor are its
children (they carry its token): the release stands.

A rebuilt workload was created when its process started (`created_unix`).

`reconcile` is the rule, a pure function; `rebuild_from_live` is the glue
restore calls with what the enforcer's `live_marked()` returned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from numa_agent.admission.accounting import unclaimed_cpus
from numa_agent.admission.machine import Machine
from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.mark import mark_verifies
from numa_agent.core.names import is_workload_name
from numa_agent.enforcement.marked import MARK, MarkedProcess
from numa_agent.enforcement.plan import workload_relpath
from numa_agent.enforcement.protocol import Tracking
from numa_agent.state.model import QUARANTINED, REBUILT, AgentState, Booking, Workload

log = logging.getLogger("numa_agent.recovery")

PARTIAL = "partial"
UNKNOWN_ALWAYS = ("memory", "hugepages")  # never visible from outside a process


@dataclass(frozen=True)
class Rebuild:
    state: AgentState
    rebuilt: tuple[str, ...] = ()  # workloads rebuilt from a process (to be followed)
    held: tuple[str, ...] = ()  # quarantined entries
    messages: tuple[tuple[int, str], ...] = field(default=())  # (logging level, text)


def source_text(marked: Sequence[MarkedProcess] | None, cgroups: bool = False) -> str:
    """What the state is rebuilt from, for the log (`cgroups`: the enforcer keeps its
    own record of the workloads, and `marked` are only the tasks pinned in engines' cgroups)."""
    if marked is None:
        return "the workload cgroups below the cgroup root"
    if cgroups:
        return (f"the workload cgroups below the cgroup root, and the live processes marked {MARK} "
                f"in engines' cgroups ({len(marked)} found)")
    return (f"the live processes marked {MARK} in /proc ({len(marked)} found); "
            "workloads without one are gone")


def is_trusted(key: bytes | None, p: MarkedProcess) -> bool:
    """Whether the agent issued `p`'s mark for `p` itself, or `p` is root's
    from a numa-run older than the token."""
    if p.mark is None and p.uid == 0:
        return True
    return mark_verifies(key, p.name, p.pid, p.start_time, p.mark)


def reconcile(machine: Machine, state: AgentState, processes: Iterable[MarkedProcess], *,
              key: bytes | None, key_new: bool = False) -> Rebuild:
    """`state` with a workload rebuilt, or an entry held, for every trusted
    marked process whose workload it does not know (`key`: the mark key;
    None: only root's unsigned marks are trusted); see the module doc.
    `key_new`: the key was made at this start, so the marks that do not verify
    are another agent's or an earlier key's, not forgeries: said once, quietly."""
    known = {w.name for w in state.workloads}
    followed = {w.pid for w in state.workloads if w.pid is not None}
    messages: list[tuple[int, str]] = []
    processes, released = _without_revoked(state, processes)
    messages += [(logging.INFO, f"{p.describe()} was released by an operator while it ran; not rebuilt")
                 for p in released]
    ordered = [p for p in sorted(processes, key=lambda p: (p.start_time, p.pid))
               if p.name not in known and p.pid not in followed]
    leaders: dict[str, MarkedProcess] = {}
    for p in ordered:
        if is_trusted(key, p):
            leaders.setdefault(p.name, p)  # the oldest: younger ones are its children
    unverified = [p for p in ordered if (leader := leaders.get(p.name)) is None
                  or (p is not leader and p.mark != leader.mark)]
    if key_new and unverified:
        messages.append((logging.INFO, f"{len(unverified)} process(es) carry a {MARK} this agent's new mark "
                                       "key did not sign (another agent's, or one made before the key was "
                                       "replaced): not rebuilt; pids "
                                       + ", ".join(str(p.pid) for p in unverified)))
    elif unverified:
        messages += [(logging.WARNING, f"unverified mark on pid {p.pid} uid {p.uid} name {p.name!r}: not "
                                       "issued by this agent for this process; not rebuilt") for p in unverified]
    candidates = list(leaders.values())
    seen = {p.pid: p.affinity & machine.usable_cpus for p in candidates}
    rebuilt: list[str] = []
    held: list[str] = []
    for p in candidates:
        others = [cpus for pid, cpus in seen.items() if pid != p.pid]
        kind, why = _classify(machine, state, p, seen[p.pid], others)
        if p.cgroup is not None and kind != "exclusive":
            # Outside the agent's tree only a task pinned inside a cgroup it shares is the
            # agent's, and such a task holds exclusive CPUs: nothing to rebuild, and no
            # CPUs held for an operator (that needs a cgroup of the agent's to hold them).
            messages.append((logging.WARNING, f"{p.describe()} in cgroup {p.cgroup}: {why}; not rebuilt"))
            continue
        if kind == "hold":
            state, name = _hold(machine, state, p, seen[p.pid], why)
            held.append(name)
            messages.append((logging.ERROR, _held_text(p, name, state, why)))
            continue
        state, made, notes = _rebuild(machine, state, p, seen[p.pid], shared=kind == "shared")
        if made is None:  # every CPU it runs on belongs to another workload
            why = f"all of its CPUs are booked to {_holders(state, seen[p.pid])}"
            state, name = _hold(machine, state, p, CpuSet(), why)
            held.append(name)
            messages.append((logging.ERROR, _held_text(p, name, state, why)))
            continue
        rebuilt.append(made)
        messages.extend(notes)
    return Rebuild(state, tuple(rebuilt), tuple(held), tuple(messages))


def _without_revoked(state: AgentState, processes: Iterable[MarkedProcess],
                     ) -> tuple[list[MarkedProcess], list[MarkedProcess]]:
    """(the processes no revocation names, the revoked workloads' own): a
    revoked process's children carry its token, and go with it unnamed."""
    processes = list(processes)
    if not state.revoked:
        return processes, []
    released = [p for p in processes if any(r.covers_process(p.pid, p.identity) for r in state.revoked)]
    pids, tokens = {p.pid for p in released}, {p.mark for p in released if p.mark}
    return [p for p in processes if p.pid not in pids and p.mark not in tokens], released


def _classify(machine: Machine, state: AgentState, p: MarkedProcess, cpus: CpuSet,
              others: list[CpuSet]) -> tuple[str, str]:
    """("exclusive" | "shared" | "hold", why)."""
    if not is_workload_name(p.name):
        return "hold", f"its {MARK} is not a workload name"
    if p.env_exclusive is False:  # numa-run said so: it follows the pool wherever it moved
        return "shared", "its NUMA_AGENT_EXCLUSIVE=0 says it runs on the shared pool"
    reserved = machine.reserved_cpus
    strict = machine.cpu_options.strict_cpu_reservation
    if cpus & reserved and not strict:
        return "shared", f"its affinity includes reserved CPUs {(cpus & reserved).format()}"
    if not cpus - reserved:
        return "hold", "its affinity has no CPU this agent hands out"
    given = _parse_cpus(p.env_cpus)
    if given is not None and given & machine.usable_cpus != cpus:
        return "hold", (f"its affinity differs from the CPUs it was given (NUMA_AGENT_CPUS="
                        f"{p.env_cpus}): it moved since, so it may be on the shared pool")
    # The shared pool it would be on, if the other marked processes apart from
    # it held theirs exclusively. An exclusive booking never takes the whole pool.
    pool = machine.usable_cpus - state.exclusive_cpus()
    for o in others:
        if o.isdisjoint(cpus):
            pool = pool - o
    if strict:
        pool = pool - reserved
    if pool and cpus.issuperset(pool) and p.env_exclusive is not True:
        return "hold", "its affinity is the whole shared pool and nothing says it is exclusive"
    return "exclusive", ""


def _rebuild(machine: Machine, state: AgentState, p: MarkedProcess, cpus: CpuSet,
             shared: bool) -> tuple[AgentState, str | None, list[tuple[int, str]]]:
    notes: list[tuple[int, str]] = []
    unknown = list(UNKNOWN_ALWAYS)
    exclusive = CpuSet()
    if not shared:
        exclusive, clash = unclaimed_cpus(machine, state, cpus)
        if not exclusive:
            return state, None, notes
        if clash:
            notes.append((logging.ERROR, f"{p.describe()}: CPUs {clash.format()} are already booked to "
                                         f"{_holders(state, clash)} and stay with them; {p.name} is "
                                         f"rebuilt with CPUs {exclusive.format()} only, but still "
                                         "runs on the others: double-booked until one of them is stopped"))
    else:
        unknown.append("cpunodebind")
    mems = tuple(n for n in _parse_nodes(p.env_mems) if n in machine.node_ids)
    if p.env_mems is None:
        unknown.append("mems")
    devices, device_notes = _devices(machine, state, p)
    notes.extend(device_notes)
    if device_notes or p.env_devices is None:
        unknown.append("devices")
    request: dict[str, Any] = {REBUILT: PARTIAL, "rebuilt_from": f"pid {p.pid}", "unknown": unknown}
    w = Workload(name=p.name, owner_uid=p.uid, shared=shared, pid=p.pid, pid_identity=p.identity,
                 pinned_in=p.cgroup,  # a task pinned inside its engine's cgroup, pinned and followed again
                 booking=Booking(cpus=exclusive, numa_nodes=machine.nodes_of(exclusive) if exclusive else (),
                                 mems=mems, devices=devices),
                 created_unix=p.started_unix or 0.0,  # its process's start: not known, 0 as before
                 request=request)
    notes.append((logging.WARNING,
                  f"rebuilt workload {p.name} from {p.describe()}: "
                  + (f"exclusive CPUs {exclusive.format()}" if not shared else "on the shared pool")
                  + f", owner uid {p.uid}; not known: {', '.join(unknown)}"))
    return state.with_workload(w), p.name, notes


def _devices(machine: Machine, state: AgentState,
             p: MarkedProcess) -> tuple[tuple[tuple[str, str], ...], list[tuple[int, str]]]:
    addresses = [a for a in (p.env_devices or "").split(",") if a]
    owner = {d.address: name for name, devs in machine.devices.resources for d in devs}
    in_use = {a for addrs in state.devices_in_use().values() for a in addrs}
    out, notes = [], []
    for address in addresses:
        if address not in owner:
            notes.append((logging.WARNING, f"{p.describe()}: device {address} is not one this agent "
                                           "hands out; not booked"))
        elif address in in_use:
            notes.append((logging.ERROR, f"{p.describe()}: device {address} is already booked to "
                                         "another workload and stays with it"))
        else:
            out.append((owner[address], address))
    return tuple(sorted(out)), notes


def _hold(machine: Machine, state: AgentState, p: MarkedProcess, cpus: CpuSet,
          why: str) -> tuple[AgentState, str]:
    """Book what nobody else holds of `cpus` to a quarantined entry."""
    held, _ = unclaimed_cpus(machine, state, cpus)
    name = p.name if is_workload_name(p.name) else f"quarantined-{p.pid}"
    n = 1
    while state.workload(name) is not None:
        n += 1
        name = f"quarantined-{p.pid}-{n}"
    request = {REBUILT: QUARANTINED, "reason": why, "pid": p.pid, "pid_identity": p.identity, "uid": p.uid,
               "affinity": p.affinity.format(), "marked": p.name}
    w = Workload(name=name, owner_uid=0, booking=Booking(cpus=held, numa_nodes=machine.nodes_of(held) if held else ()),
                 request=request)
    return state.with_workload(w), name


def _held_text(p: MarkedProcess, name: str, state: AgentState, why: str) -> str:
    w = state.workload(name)
    cpus = w.booking.cpus.format() if w is not None else ""
    return (f"cannot rebuild the workload of {p.describe()}: {why}. CPUs {cpus or 'none'} are held as "
            f"{name!r} and not handed out; stop or re-pin the process, then release them with "
            f"`numa-agent release {name}` as root")


def _holders(state: AgentState, cpus: CpuSet) -> str:
    names = [f"pod {p.name}" for p in state.pods if p.booking.cpus & cpus]
    names += [w.name for w in state.workloads if w.pod is None and w.booking.cpus & cpus]
    return ", ".join(names) or "reserved CPUs"


def _parse_cpus(text: str | None) -> CpuSet | None:
    if text is None:
        return None
    try:
        return CpuSet.parse(text)
    except (CpuSetParseError, ValueError):
        return None


def _parse_nodes(text: str | None) -> tuple[int, ...]:
    cpus = _parse_cpus(text)  # the same list syntax
    return cpus.ids() if cpus is not None else ()


def rebuild_from_live(machine: Machine, state: AgentState, enforcer: Tracking,
                      marked: Sequence[MarkedProcess] | None, key: bytes | None,
                      key_new: bool = False) -> Rebuild:
    """Reconcile `state` with the marked processes (None: the enforcer keeps
    its own record, nothing to do), log what was done, and follow each
    rebuilt workload's process; one that exited meanwhile is dropped."""
    if marked is None:
        return Rebuild(state)
    result = reconcile(machine, state, marked, key=key, key_new=key_new)
    for level, text in result.messages:
        log.log(level, "%s", text)
    state, rebuilt = result.state, []
    for name in result.rebuilt:
        w = state.workload(name)
        assert w is not None
        if enforcer.track(workload_relpath(w), w.pid, w.pid_identity):
            rebuilt.append(name)
        else:
            log.warning("rebuilt workload %s: pid %s exited meanwhile; released", name, w.pid)
            state = state.without_workload(name)
    return Rebuild(state, tuple(rebuilt), result.held, result.messages)


__all__ = ["Rebuild", "is_trusted", "rebuild_from_live", "reconcile", "source_text"]
