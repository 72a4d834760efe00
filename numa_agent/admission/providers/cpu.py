"""The CPU manager as a provider: exclusive CPUs (static policy), pinned
CPUs (physcpubind), and a pod member's CPUs from its pod's budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from numa_agent.admission.cpu_manager import allocate_cpus, cpu_hints
from numa_agent.admission.errors import (
    CpuAllocationError,
    CpusBusyError,
    PodSharedPartEmptyError,
    SharedPoolEmptyError,
    SMTAlignmentError,
)
from numa_agent.admission.keep import grow_cpus, shrink_cpus
from numa_agent.admission.machine import Machine
from numa_agent.admission.provider import NOTHING, Allocation
from numa_agent.admission.request import Request
from numa_agent.admission.view import AdmissionView
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask
from numa_agent.core.names import engine_cgroup_parent


def _wants_exclusive(request: Request, machine: Machine) -> bool:
    return request.resources.cpus > 0 and machine.policy.cpu_policy == "static"


def _available(request: Request, view: AdmissionView) -> CpuSet:
    available = view.allocatable_cpus
    if request.cpunodebind is not None:
        available = available & view.machine.cpus_of_nodes(request.cpunodebind)
    if request.within_cpus is not None:
        available = available & request.within_cpus
    return available


def _outside_grant(request: Request, view: AdmissionView, count: int) -> str:
    """Too few CPUs inside what the workload's engine granted it (or its own within_cpus)."""
    granted = request.within_cpus or CpuSet()
    free = _available(request, view)
    if request.cgroup is None:  # the caller's own within_cpus, in the agent's tree
        where = f"inside within_cpus {granted.format() or 'none'}"
    else:
        source = request.granted_by or engine_cgroup_parent(request.cgroup)
        where = (f"inside the CPUs its engine granted ({granted.format() or 'none'}, the cpuset of cgroup "
                 f"{source})")
    return (f"not enough CPUs: requested {count}, {len(free)} free for exclusive use {where}; "
            f"free there: {free.format() or 'none'}")


def _per_node_cpu_text(machine: Machine, available: CpuSet) -> str:
    parts = [f"node {n}: {len(available & machine.cpus_of_nodes((n,)))}" for n in machine.node_ids]
    return " (" + ", ".join(parts) + ")" if len(parts) > 1 else ""


@dataclass(frozen=True)
class CpuProvider:
    name: str = "cpu"

    def hints(self, request: Request, view: AdmissionView) -> Mapping[str, HintSet] | None:
        machine = view.machine
        if view.pod is not None:
            return None
        if request.physcpubind is not None:
            # The CPUs are named: the masks holding all of them, preferred when as narrow
            # as any mask holding that many could be (as the kubelet regenerates the hints
            # of CPUs a container already holds), so the memory is placed beside them.
            pinned = request.physcpubind
            return {"cpu": cpu_hints(machine.cpu_topology, pinned, len(pinned), machine.cpu_options,
                                     already_allocated=pinned)}
        if not _wants_exclusive(request, machine):
            return None
        # -N narrows what is available: the hints are those of the named nodes' CPUs.
        count, available = request.resources.cpus, _available(request, view)
        kept = request.keep.booking.cpus if request.keep is not None else None
        if kept:  # a resize: masks holding its CPUs (growth) or `count` of them (shrink)
            if count < len(kept):
                return {"cpu": cpu_hints(machine.cpu_topology, kept, count, machine.cpu_options)}
            return {"cpu": cpu_hints(machine.cpu_topology, available, count, machine.cpu_options, reusable=kept)}
        return {"cpu": cpu_hints(machine.cpu_topology, available, count, machine.cpu_options)}

    def allocate(self, request: Request, view: AdmissionView, affinity: NumaMask | None) -> Allocation:
        if view.pod is not None:
            return _allocate_in_pod(request, view)
        cpus = _pick(request, view, affinity)
        if cpus and not (view.shared_pool - cpus):
            raise SharedPoolEmptyError(
                f"giving CPUs {cpus.format()} away would leave the shared pool empty; "
                f"reserve at least one CPU (cpu_manager.reserved_cpu_count)")
        return Allocation(cpus=cpus) if cpus else NOTHING

    def refusal_reason(self, request: Request, view: AdmissionView) -> str | None:
        cpus = request.resources.cpus
        if not cpus:
            return None
        if request.within_cpus is not None and cpus > len(_available(request, view)):
            return _outside_grant(request, view, cpus)
        per_node = [v["cpus"] for v in view.free.values()]
        if cpus <= max(per_node, default=0):
            return None  # they fit on one node: another provider's part is the reason
        return (f"{cpus} CPUs requested; {sum(per_node)} free, but at most "
                f"{max(per_node, default=0)} on one NUMA node")


def _pick(request: Request, view: AdmissionView, affinity: NumaMask | None) -> CpuSet:
    machine = view.machine
    available = _available(request, view)
    if request.physcpubind is not None:
        busy = request.physcpubind - available
        if busy:
            raise CpusBusyError(f"physcpubind: CPUs {busy.format()} are reserved or exclusively allocated; "
                                f"free for exclusive use: {available.format() or 'none'}")
        return request.physcpubind
    if not _wants_exclusive(request, machine):
        return CpuSet()
    count = request.resources.cpus
    if request.keep is not None and request.keep.booking.cpus:
        # A resize: a shrink takes nothing from what is free; a growth adds to what it keeps.
        available = available | request.keep.booking.cpus
    if count > len(available) and request.within_cpus is not None:
        raise CpuAllocationError(_outside_grant(request, view, count))
    if count > len(available):
        raise CpuAllocationError(f"not enough CPUs: requested {count}, {len(available)} free for exclusive use"
                                 f"{_per_node_cpu_text(machine, available)}")
    where = affinity
    if request.cpunodebind:  # the merge took -N into the CPU hints: its affinity lies on them
        named = NumaMask(request.cpunodebind)
        where = named if affinity is None or not affinity.bits & named.bits else \
            NumaMask.from_bits(affinity.bits & named.bits)
    if request.keep is not None and request.keep.booking.cpus:
        return _resized(machine, request, available, where)
    return allocate_cpus(machine.cpu_topology, available, count, where, machine.cpu_options)


def _resized(machine: Machine, request: Request, available: CpuSet, where: NumaMask | None) -> CpuSet:
    """A resize's CPUs: the kept ones and more (growth) or a subset of them (shrink)."""
    assert request.keep is not None
    kept, count, options = request.keep.booking.cpus, request.resources.cpus, machine.cpu_options
    topo = machine.cpu_topology
    if count <= len(kept):
        return shrink_cpus(topo, kept, request.keep.added, count, where, options)
    if options.full_pcpus_only and (count - len(kept)) % topo.cpus_per_core:
        raise SMTAlignmentError(count, topo.cpus_per_core)
    return grow_cpus(topo, available, kept, count, where, options)


def _allocate_in_pod(request: Request, view: AdmissionView) -> Allocation:
    """Exclusive CPUs from the part of the pod no other member holds; a
    sharing member needs that part not to be empty."""
    pod, members, shared_part = view.pod, view.pod_members, view.pod_shared_cpus
    assert pod is not None
    count = request.resources.cpus
    if count <= 0:
        if not shared_part:
            raise PodSharedPartEmptyError(
                f"pod {pod.name!r}: its exclusive members hold all {len(pod.booking.cpus)} CPUs; "
                f"nothing is left for a member that shares")
        return NOTHING
    if count > len(shared_part):
        raise CpuAllocationError(
            f"pod {pod.name!r}: requested {count} exclusive CPUs, only {len(shared_part)} "
            f"of the pod's {len(pod.booking.cpus)} are not taken by other members")
    if any(m.shared for m in members) and count == len(shared_part):
        raise PodSharedPartEmptyError(
            f"pod {pod.name!r}: {count} exclusive CPUs would leave nothing for the members "
            f"that share the rest ({', '.join(m.name for m in members if m.shared)})")
    machine = view.machine
    try:
        if request.keep is not None and request.keep.booking.cpus:
            return Allocation(cpus=_resized(machine, request, shared_part, None))
        cpus = allocate_cpus(machine.cpu_topology, shared_part, count, None, machine.cpu_options)
    except CpuAllocationError as exc:
        # Inside a pod every CPU shortfall reads as insufficient_cpus.
        raise CpuAllocationError(f"pod {pod.name!r}: {exc}") from None
    return Allocation(cpus=cpus)
