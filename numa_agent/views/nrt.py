"""This node's NodeResourceTopology object (topology.node.k8s.io/v1alpha2), the
shape the topology-aware scheduler plugin (scheduler-plugins'
NodeResourceTopologyMatch) reads NUMA zones from. Pure: a function of the
machine and the state, as `GET /v1/nrt` and `numa-agent export nrt` print it.

- One zone per usable NUMA node, `node-N`, type `Node`, its `costs` the
  node's distances to every node (`node-M`, the distance).
- Per zone `resources`, each with capacity, allocatable and available:
  `cpu` (the node's usable CPUs; allocatable leaves out the reserved ones,
  available also the exclusively booked ones; absent on a node without
  usable CPUs, such as a memory-only node), `memory` and `hugepages-<size>`
  in bytes under the kubelet's names (allocatable leaves out the reserved
  memory, as the memory manager reserves it; available also what bookings
  hold, never below 0), and each configured device resource on the node
  (its devices, less those booked).
- Top-level `attributes`: `topologyManagerPolicy`, `topologyManagerScope`,
  `topologyManagerMaxNUMANodes` (the names the plugin reads), and each
  topology manager option in effect as `topologyManagerOption<Name>` (the
  kubelet's option name in CamelCase); and the deprecated `topologyPolicies`
  (still in the v1alpha2 CRD, read by older plugins before the attributes).

Quantities are plain integers (CPUs, bytes, devices): int-or-string in the
CRD, parsed by the scheduler as Kubernetes quantities.
"""

from __future__ import annotations

from typing import Any

from numa_agent.admission.machine import Machine
from numa_agent.admission.memory_manager import kubelet_resource
from numa_agent.admission.view import memory_usage
from numa_agent.state.model import AgentState

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
ZONE_TYPE = "Node"
# (policy, scope) -> the deprecated topologyPolicies value (v1alpha2 types.go).
_POLICY_WORDS = {"single-numa-node": "SingleNUMANode", "restricted": "Restricted", "best-effort": "BestEffort"}
_SCOPE_WORDS = {"container": "ContainerLevel", "pod": "PodLevel"}


def zone_name(node: int) -> str:
    return f"node-{node}"


def option_attribute(option: str) -> str:
    """The attribute of a topology manager option: "prefer-closest-numa-nodes"
    -> "topologyManagerOptionPreferClosestNumaNodes"."""
    return "topologyManagerOption" + "".join(word.capitalize() for word in option.split("-"))


def topology_policies(policy: str, scope: str) -> list[str]:
    """The deprecated `topologyPolicies` field: one value naming policy and scope."""
    word = _POLICY_WORDS.get(policy)
    return [f"{word}{_SCOPE_WORDS.get(scope, 'ContainerLevel')}"] if word else ["None"]


def attributes(machine: Machine) -> list[dict[str, str]]:
    policy = machine.policy
    out = [{"name": "topologyManagerPolicy", "value": policy.topology_policy},
           {"name": "topologyManagerScope", "value": policy.topology_scope},
           {"name": "topologyManagerMaxNUMANodes", "value": str(machine.tm_options.max_allowable_numa_nodes)}]
    out += [{"name": option_attribute(name), "value": value}
            for name, value in sorted(machine.tm_options.to_mapping().items())]
    return out


def _resource(name: str, capacity: int, allocatable: int, booked: int) -> dict[str, Any]:
    return {"name": name, "capacity": capacity, "allocatable": allocatable,
            "available": max(0, allocatable - booked)}


def zone_resources(machine: Machine, state: AgentState, node: int) -> list[dict[str, Any]]:
    out = []
    cpus = machine.cpus_of_nodes((node,))
    if cpus:
        allocatable = cpus - machine.reserved_cpus
        out.append(_resource("cpu", len(cpus), len(allocatable), len(allocatable & state.exclusive_cpus())))
    usage = memory_usage(state)
    for n, resource, cap in machine.memory.entries:
        if n == node and cap.total:
            out.append(_resource(kubelet_resource(resource), cap.total, cap.allocatable,
                                 usage.allocated_bytes(node, resource)))
    in_use = state.devices_in_use()
    for resource, devices in machine.devices.resources:
        here = [d.address for d in devices if d.numa_node == node]
        if here:
            booked = sum(1 for a in here if a in in_use.get(resource, ()))
            out.append(_resource(resource, len(here), len(here), booked))
    return out


def node_resource_topology(machine: Machine, state: AgentState, node_name: str) -> dict[str, Any]:
    """The object for node `node_name`, as `kubectl apply` takes it."""
    zones = []
    for node in machine.node_ids:
        zone: dict[str, Any] = {"name": zone_name(node), "type": ZONE_TYPE}
        costs = [{"name": zone_name(other), "value": distance}
                 for other, distance in sorted(machine.distances.get(node, {}).items())]
        if costs:
            zone["costs"] = costs
        zone["resources"] = zone_resources(machine, state, node)
        zones.append(zone)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "topologyPolicies": topology_policies(machine.policy.topology_policy, machine.policy.topology_scope),
        "attributes": attributes(machine),
        "zones": zones,
    }
