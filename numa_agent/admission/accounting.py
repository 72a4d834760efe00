"""Per-NUMA-node accounting: capacity, reserved, allocated, free. Pure.

Derived from the machine and the state every time, so allocated + free +
reserved == capacity holds by construction (except on a node whose memory
shrank under its bookings: there allocated is what is booked, free is 0, and
`memory_short` says by how much), and status, metrics and the explanations
all read the same numbers.
"""

from __future__ import annotations

from typing import Any

from numa_agent.admission.admit import memory_usage
from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import MEMORY, free_bytes, hugepages_resource, shortfalls
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState


def unclaimed_cpus(machine: Machine, state: AgentState, cpus: CpuSet) -> tuple[CpuSet, CpuSet]:
    """Of `cpus`, (what may still be booked exclusively, what others hold):
    recovery claims a found workload's CPUs by this rule, so nothing is held twice."""
    wanted = cpus & machine.usable_cpus - machine.reserved_cpus
    clash = wanted & state.exclusive_cpus()
    return wanted - clash, clash


def node_accounting(machine: Machine, state: AgentState) -> list[dict[str, Any]]:
    exclusive = state.exclusive_cpus()
    usage = memory_usage(state)
    in_use = state.devices_in_use()
    short = shortfalls(machine.memory, usage)
    out = []
    for n in machine.node_ids:
        node_cpus = machine.cpus_of_nodes((n,))
        reserved = node_cpus & machine.reserved_cpus
        allocated = node_cpus & exclusive
        entry: dict[str, Any] = {
            "id": n,
            "kind": machine.topology.node_kind(n),
            # Discovery's distances to every node, as `numa-agent topology` shows them.
            "distances": {str(k): v for k, v in sorted(machine.distances.get(n, {}).items())},
            "cpus": {"capacity": len(node_cpus), "reserved": len(reserved),
                     "allocated": len(allocated), "free": len(node_cpus - reserved - allocated)},
            "memory_bytes": _memory_states(machine, usage, n, MEMORY, 1),
            # The node's MemTotal as `numa-agent topology` shows it; the memory
            # capacity above is that minus the node's hugepage pools.
            "memory_total_bytes": machine.topology.node(n).memory_total_bytes,
            # Set: the node takes no new admission (see memory_manager.shortfalls).
            "memory_short": [{"resource": r, "booked_bytes": booked, "allocatable_bytes": allocatable}
                             for m, r, booked, allocatable in short if m == n],
            "hugepages": {},
            "devices": {},
        }
        for hp in machine.topology.node(n).hugepages:
            resource = hugepages_resource(hp.size_kb)
            entry["hugepages"][f"{hp.size_kb}kB"] = _memory_states(
                machine, usage, n, resource, hp.size_kb * 1024)
        for resource, devices in machine.devices.resources:
            here = [d.address for d in devices if d.numa_node == n]
            if here:
                used = sum(1 for a in here if a in in_use.get(resource, ()))
                entry["devices"][resource] = {"capacity": len(here), "allocated": used,
                                              "free": len(here) - used}
        out.append(entry)
    return out


def _memory_states(machine: Machine, usage, node: int, resource: str, unit: int) -> dict[str, int]:
    cap = machine.memory.get(node, resource)
    free = free_bytes(machine.memory, usage, node, resource) if cap.total else 0
    allocated = usage.allocated_bytes(node, resource)  # all of it, also beyond a shrunk capacity
    return {"capacity": cap.total // unit, "reserved": cap.reserved // unit,
            "allocated": allocated // unit, "free": free // unit}
