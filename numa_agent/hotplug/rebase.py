"""Fit a state to a machine whose hardware changed (hotplug, or changes made
while the agent was stopped). Pure.

A booked CPU that went offline (or left the agent's cpuset) is taken out of
its booking and recorded in the workload's `lost` list; likewise a PCI device
that disappeared. Nothing is re-booked automatically: a CPU that comes back
returns to the shared pool, so nothing can ever be held twice.
"""

from __future__ import annotations

from numa_agent.admission.machine import Machine
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
