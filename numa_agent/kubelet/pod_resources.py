"""PodResources v1 answers from an immutable state. Pure.

The same mapping as the state files (numa_agent.kubelet.state_files): an
agent pod is a pod, its members its containers; a workload outside pods is a
pod of one container of its name; every pod is in the configured namespace.
A container its runtime enforces (NRI) that names its Kubernetes pod is
reported as Kubernetes knows it instead: under its namespace and pod name,
as its container name, the containers of one pod in one PodResources pod
(found through `runtime_pods`, an index the state's memo keeps).
A container's `cpu_ids` are the CPUs its state file entry names (exclusive
CPUs, or a pod's shared part; none on the shared pool, as with the kubelet),
its memory the same blocks, its devices one entry per device with its NUMA
node.
"""

from __future__ import annotations

from typing import Iterable

from numa_agent.admission.machine import Machine
from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet.state_files import (
    changed_pods,
    container_cpus,
    containers_of,
    kubelet_resource,
    memory_blocks,
    pod_of,
)
from numa_agent.state.model import AgentState, Workload
from numa_agent.state.runtime_pods import kubernetes_pod, runtime_pods

DEFAULT_NAMESPACE = "numa-agent"


def _topology(nodes: Iterable[int]) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes if n >= 0])


def _device(machine: Machine, resource: str, address: str) -> pb.ContainerDevices:
    return pb.ContainerDevices(resource_name=resource, device_ids=[address],
                               topology=_topology((machine.topology.device(address).numa_node,)))


def container(machine: Machine, state: AgentState, w: Workload) -> pb.ContainerResources:
    cpus = container_cpus(machine, state, w)
    return pb.ContainerResources(
        name=(w.runtime.container if w.runtime is not None and kubernetes_pod(w) else "") or w.name,
        devices=[_device(machine, resource, addr) for resource, addr in w.booking.devices],
        cpu_ids=list(cpus) if cpus is not None else [],
        memory=[pb.ContainerMemory(memory_type=b["type"], size=b["size"], topology=_topology(b["numaAffinity"]))
                for b in memory_blocks(w.booking)])


def pod(machine: Machine, state: AgentState, name: str, namespace: str) -> pb.PodResources | None:
    """The agent's pod `name` (or workload outside pods) in the configured `namespace`."""
    members = [w for w in containers_of(state, name) if kubernetes_pod(w) is None]
    return _pod(machine, state, namespace, name, members)


def runtime_pod(machine: Machine, state: AgentState, namespace: str, name: str) -> pb.PodResources | None:
    """Kubernetes pod `namespace`/`name`, of the containers their runtime enforces."""
    members = [w for w in map(state.workload, runtime_pods(state).pods.get((namespace, name)) or ())
               if w is not None]
    return _pod(machine, state, namespace, name, members)


def _pod(machine: Machine, state: AgentState, namespace: str, name: str,
         members: list[Workload]) -> pb.PodResources | None:
    """The pod of these containers; None for none (a pod with no container is not listed)."""
    if not members:
        return None
    return pb.PodResources(name=name, namespace=namespace,
                           containers=[container(machine, state, w) for w in members])


# A ListEncoder part's key: the agent's pod name, or for a Kubernetes pod of
# runtime-enforced containers its namespace and name after a NUL (no name has one).
def _part_key(w: Workload) -> str:
    found = kubernetes_pod(w)
    return pod_of(w) if found is None else f"\0{found[0]}\0{found[1]}"


def _part(machine: Machine, state: AgentState, key: str, namespace: str) -> pb.PodResources | None:
    if key.startswith("\0"):
        ns, _, name = key[1:].partition("\0")
        return runtime_pod(machine, state, ns, name)
    return pod(machine, state, key, namespace)


class ListEncoder:
    """The encoded List answer for the latest state, each pod's part kept and
    encoded again only when a change names it: a repeated field's encoding
    is the concatenation of its elements', so the answer is the kept parts
    joined. Not shared between threads without a lock."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._machine: Machine | None = None
        self._state: AgentState | None = None
        self._parts: dict[str, bytes] = {}

    def update(self, machine: Machine, state: AgentState) -> bytes:
        changed = changed_pods(self._machine, self._state, machine, state, key=_part_key)
        if changed is None:
            self._parts = {}
            changed = {_part_key(w) for w in state.workloads}
        for name in changed:
            p = _part(machine, state, name, self.namespace)
            if p is None:
                self._parts.pop(name, None)
            else:
                self._parts[name] = pb.ListPodResourcesResponse(pod_resources=[p]).SerializeToString()
        self._machine, self._state = machine, state
        return b"".join(self._parts.values())


def allocatable_response(machine: Machine) -> pb.AllocatableResourcesResponse:
    """What can be handed out at all (not what is free now): the CPUs that can
    become exclusive (reserved ones excluded), every device with its node,
    and per node the allocatable memory and hugepages of each size."""
    devices = [_device(machine, resource, d.address)
               for resource, found in machine.devices.resources for d in found]
    memory = [pb.ContainerMemory(memory_type=kubelet_resource(resource), size=cap.allocatable,
                                 topology=_topology((node,)))
              for node, resource, cap in machine.memory.entries if cap.allocatable > 0]
    return pb.AllocatableResourcesResponse(devices=devices,
                                           cpu_ids=list(machine.usable_cpus - machine.reserved_cpus),
                                           memory=memory)
