"""The provider seam: what the CPU, memory and device managers (and any
further resource) offer admission, in the spirit of the kubelet's
``HintProvider``.

Admission asks every registered provider (``registry.PROVIDERS``) for its
hints, merges them under the topology policy, asks every provider to
allocate inside the merged affinity, and combines the partial allocations
into one ``Booking``. A provider is a pure value: no I/O, no state of its
own; it reads the request and the view and returns new values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

from numa_agent.admission.request import Request
from numa_agent.admission.view import AdmissionView
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import HintSet, NumaMask


@dataclass(frozen=True, slots=True)
class Allocation:
    """One provider's part of a booking.

    ``memory`` holds (node, resource, bytes) triples and ``memory_group`` the
    nodes booked as one memory group; ``mems`` is the cpuset.mems this
    provider decides (None: derived from the CPUs and the affinity);
    ``numa_nodes`` the nodes the allocation touches besides its CPUs and mems
    (a device's node, say)."""

    cpus: CpuSet = CpuSet()
    memory: tuple[tuple[int, str, int], ...] = ()
    memory_group: tuple[int, ...] = ()
    mems: tuple[int, ...] | None = None
    devices: tuple[tuple[str, str], ...] = ()
    numa_nodes: tuple[int, ...] = ()


NOTHING = Allocation()


@runtime_checkable
class HintProvider(Protocol):
    """One resource manager as admission sees it."""

    @property
    def name(self) -> str:
        """Names the provider in explanations ("cpu", "memory", "devices")."""
        ...

    def hints(self, request: Request, view: AdmissionView) -> Mapping[str, HintSet] | None:
        """resource -> hints for `request` against the view, or None when the
        provider has no say in the merge (nothing asked). A request that names
        its nodes or CPUs (-N, -m, -C) has hints of them, so the merge places
        the rest beside them. Not asked for pod members: the pod budget was merged."""
        ...

    def allocate(self, request: Request, view: AdmissionView, affinity: NumaMask | None) -> Allocation:
        """This provider's part of the booking inside the merged `affinity`
        (None: no NUMA restriction), or from the pod budget when ``view.pod``
        is set. Raises an ``errors.AllocationError`` (its ``reason`` is the
        refusal code)."""
        ...

    def refusal_reason(self, request: Request, view: AdmissionView) -> str | None:
        """Why this provider's part may not fit on one NUMA node, for the
        topology refusal's text; None when it has nothing to say."""
        ...
