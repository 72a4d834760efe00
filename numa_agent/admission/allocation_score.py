"""How allocated a set of NUMA nodes is: the numa-allocation-strategy's rank. Pure.

The topology manager option `numa-allocation-strategy` (KEP-6007) breaks ties
between merged NUMA node sets that are equally good (same width and, under
prefer-closest-numa-nodes, the same distance) by how much of them is already
allocated. As the KEP defines it, each hint provider the request asks something
of scores a node set, over the resources it gives hints for:

    score = max(1, assigned * 100 // allocatable)   (the sums over the set's nodes)

(the CPU manager: exclusive CPUs assigned of those it may hand out; the memory
manager: bytes booked of the allocatable bytes; the device manager: devices
assigned of the resource's devices), and the set's score is the equal-weight
average of the providers' scores, `sum // count`. A set with nothing allocatable
for a provider scores 100 for it: it is full. least-allocated takes the lowest
score first, most-allocated the highest; equal scores fall back to the lowest
mask, as `none` always does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from numa_agent.core.policy import AllocationStrategy

if TYPE_CHECKING:
    from numa_agent.admission.topology_manager import TieScore
    from numa_agent.admission.view import AdmissionView

# node -> (assigned, allocatable), for one resource of one provider
NodeFigures = Mapping[int, tuple[int, int]]


def provider_score(figures: Sequence[NodeFigures], bits: int) -> int:
    """One provider's score of the node set `bits`, over its resources' figures."""
    assigned = allocatable = 0
    for per_node in figures:
        for node, (used, total) in per_node.items():
            if node >= 0 and bits >> node & 1:  # a device of no known node is in no set
                assigned += used
                allocatable += total
    if allocatable <= 0:
        return 100
    return max(1, assigned * 100 // allocatable)


def set_score(providers: Sequence[Sequence[NodeFigures]], bits: int) -> int:
    """The equal-weight average of the providers' scores (0 when none is asked)."""
    if not providers:
        return 0
    return sum(provider_score(figures, bits) for figures in providers) // len(providers)


def tie_rank(strategy: AllocationStrategy, providers: Sequence[Sequence[NodeFigures]]) -> "TieScore | None":
    """The merge's rank of equally good sets under `strategy` (smaller first);
    None under `none` (or with nothing scored): the lowest mask wins."""
    if strategy is AllocationStrategy.NONE or not providers:
        return None
    sign = 1 if strategy is AllocationStrategy.LEAST_ALLOCATED else -1
    return lambda bits: sign * set_score(providers, bits)


def resource_figures(view: "AdmissionView", provider: str, resource: str) -> NodeFigures:
    """(assigned, allocatable) per NUMA node of one resource a provider gives hints for."""
    machine = view.machine
    if provider == "cpu":
        exclusive = view.state.exclusive_cpus().bits
        reserved = machine.reserved_cpus.bits
        return {n: ((bits & exclusive).bit_count(), (bits & ~reserved).bit_count())
                for n, bits in machine.usable_cpu_bits_by_node.items()}
    if provider == "memory":
        capacity, usage = machine.memory, view.memory_usage
        return {n: (usage.allocated_bytes(n, resource), capacity.allocatable(n, resource))
                for n in machine.node_ids}
    in_use = view.devices_in_use.get(resource, frozenset())
    out: dict[int, tuple[int, int]] = {}
    for dev in machine.devices.devices(resource):
        used, total = out.get(dev.numa_node, (0, 0))
        out[dev.numa_node] = (used + (dev.address in in_use), total + 1)
    return out


__all__ = ["NodeFigures", "provider_score", "resource_figures", "set_score", "tie_rank"]
