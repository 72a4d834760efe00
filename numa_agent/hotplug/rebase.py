"""Fit a state to a machine whose hardware changed (hotplug, or changes made
while the agent was stopped). Pure.

A booked CPU that went offline (or left the agent's cpuset) is taken out of
its booking and recorded in the workload's `lost` list; likewise a PCI device
that disappeared. Nothing is re-booked automatically: a CPU that comes back
returns to the shared pool, so nothing can ever be held twice.

Memory is not taken out of bookings (the kernel keeps a workload's pages): a
node left with less memory than is booked on it is fenced instead (see
`admission.view.fenced_nodes`), and `memory_changes` says what changed.
"""

from __future__ import annotations

from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import shortfalls
from numa_agent.admission.view import memory_usage
from numa_agent.core.units import format_bytes
from numa_agent.state.model import AgentState, Booking, replace


def _trim(machine: Machine, booking: Booking) -> tuple[Booking, list[str]]:
    lost = []
    gone_cpus = booking.cpus - machine.usable_cpus
    if gone_cpus:
        lost.append(f"cpus {gone_cpus.format()}")
    present = {d.address for d in machine.topology.pci_devices}
    kept_devices = tuple(d for d in booking.devices if d[1] in present)
    lost += [f"pci {addr} ({resource})" for resource, addr in booking.devices if addr not in present]
    if not lost:
        return booking, []
    return replace(booking, cpus=booking.cpus - gone_cpus, devices=kept_devices), lost


def rebase_state(machine: Machine, state: AgentState) -> tuple[AgentState, list[tuple[str, str]]]:
    """Returns the fitted state and (workload or pod name, what it lost) pairs."""
    report: list[tuple[str, str]] = []
    for pod in state.pods:
        booking, lost = _trim(machine, pod.booking)
        if lost:
            state = state.with_pod(replace(pod, booking=booking))
            report += [(f"pod {pod.name}", what) for what in lost]
            for member in state.members_of(pod.name):
                state = state.with_workload(replace(member, lost=tuple(dict.fromkeys((*member.lost, *lost)))))
    for w in state.workloads:
        booking, lost = _trim(machine, w.booking)
        if lost:
            # A workload never loses its last CPU silently into "every CPU":
            # with nothing left it runs on the shared pool until released.
            shared = w.shared or (not booking.cpus and bool(w.booking.cpus))
            state = state.with_workload(replace(w, booking=booking, shared=shared,
                                                lost=tuple(dict.fromkeys((*w.lost, *lost)))))
            report += [(w.name, what) for what in lost]
    return state, report


def memory_changes(old: Machine, new: Machine, state: AgentState) -> list[tuple[str, str]]:
    """What a machine change did to memory, as (log level, message) pairs:
    each node's capacity that changed, and each node that became short of
    its bookings (with the workloads booked there) or fits them again."""
    out: list[tuple[str, str]] = []
    for n, resource, before, after in _capacity_changes(old, new):
        out.append(("info", f"NUMA node {n} {resource} capacity {format_bytes(before)} -> {format_bytes(after)}"))
    usage = memory_usage(state)
    was = {(n, r) for n, r, _, _ in shortfalls(old.memory, usage)}
    out += [("warning", text) for text in shortfall_warnings(new, state, was)]
    now = {n for n, _, _, _ in shortfalls(new.memory, usage)}
    for n in sorted({n for n, _ in was} - now):
        out.append(("warning", f"NUMA node {n} holds its bookings again: it takes new admissions"))
    return out


def shortfall_warnings(machine: Machine, state: AgentState, known=frozenset()) -> list[str]:
    """A warning for each node and resource short of its bookings on `machine`
    (those in `known`, (node, resource) pairs already said, left out)."""
    out = []
    for n, r, booked, allocatable in shortfalls(machine.memory, memory_usage(state)):
        if (n, r) in known:
            continue
        holders = [w.name for w in state.workloads if w.booking.memory.get(n, {}).get(r)]
        holders += [f"pod {p.name}" for p in state.pods if p.booking.memory.get(n, {}).get(r)]
        out.append(f"NUMA node {n} has less {r} than is booked on it: {format_bytes(booked)} booked, "
                   f"{format_bytes(allocatable)} allocatable (held by {', '.join(holders)}); "
                   f"it takes no new admission until its memory comes back or they leave")
    return out


def _capacity_changes(old: Machine, new: Machine) -> list[tuple[int, str, int, int]]:
    before = {(n, r): c.total for n, r, c in old.memory.entries}
    after = {(n, r): c.total for n, r, c in new.memory.entries}
    return [(n, r, before.get((n, r), 0), after.get((n, r), 0))
            for n, r in sorted(before.keys() | after.keys()) if before.get((n, r), 0) != after.get((n, r), 0)]
