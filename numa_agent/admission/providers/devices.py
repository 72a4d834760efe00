"""The device manager as a provider: PCI devices by resource name, and a pod
member's devices from its pod's budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from numa_agent.admission.device_manager import allocate_request_devices, device_hints, device_refusal_reason
from numa_agent.admission.errors import DeviceAllocationError
from numa_agent.admission.keep import require_nodes
from numa_agent.admission.provider import NOTHING, Allocation
from numa_agent.admission.request import Request
from numa_agent.admission.view import AdmissionView
from numa_agent.core.hints import HintSet, NumaMask
from numa_agent.core.topology import UNKNOWN_NODE


@dataclass(frozen=True)
class DeviceProvider:
    name: str = "devices"

    def hints(self, request: Request, view: AdmissionView) -> Mapping[str, HintSet] | None:
        if view.pod is not None:
            return None
        machine, in_use = view.machine, view.devices_in_use
        sets = {resource: device_hints(machine.devices, in_use, resource, count, machine.node_mask)
                for resource, count in sorted(request.resources.devices.items()) if count > 0}
        if request.keep is not None and request.keep.booking.devices:  # a resize keeps its devices
            held = _nodes_of(view, request.keep.booking.devices)
            sets = {resource: require_nodes(h, held) for resource, h in sets.items()}
        return sets or None

    def allocate(self, request: Request, view: AdmissionView, affinity: NumaMask | None) -> Allocation:
        if view.pod is not None:
            return _allocate_in_pod(request, view)
        machine, in_use = view.machine, view.devices_in_use
        if request.keep is not None and request.keep.booking.devices:
            kept = request.keep.booking.devices
            return Allocation(devices=kept, numa_nodes=_nodes_of(view, kept))
        devices = allocate_request_devices(machine.devices, in_use, request.resources.devices, affinity,
                                           machine.distances)
        if not devices:
            return NOTHING
        return Allocation(devices=devices, numa_nodes=_nodes_of(view, devices))

    def refusal_reason(self, request: Request, view: AdmissionView) -> str | None:
        machine, in_use = view.machine, view.devices_in_use
        reasons = [device_refusal_reason(machine.devices, in_use, resource, count)
                   for resource, count in sorted(request.resources.devices.items())]
        return "; ".join(r for r in reasons if r) or None


def _nodes_of(view: AdmissionView, devices) -> tuple[int, ...]:
    """The NUMA nodes of (resource, address) pairs, the unknown node left out."""
    nodes = {view.machine.topology.device(a).numa_node for _, a in devices} - {UNKNOWN_NODE}
    return tuple(sorted(nodes))


def _allocate_in_pod(request: Request, view: AdmissionView) -> Allocation:
    pod = view.pod
    assert pod is not None
    taken = {a for m in view.pod_members for a in m.booking.device_addresses()}
    devices: list[tuple[str, str]] = []
    for resource, count in sorted(request.resources.devices.items()):
        pool = [a for r, a in pod.booking.devices if r == resource and a not in taken]
        if count > len(pool):
            raise DeviceAllocationError(
                f"pod {pod.name!r}: requested {count} {resource}, {len(pool)} left in the pod budget")
        devices.extend((resource, a) for a in pool[:count])
    return Allocation(devices=tuple(sorted(devices))) if devices else NOTHING
