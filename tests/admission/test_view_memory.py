"""The memory usage of a state, handed on along updates with only the changed
bookings folded (view.memory_usage), equals a fold of every booking from
scratch: the same usage, or the same error for a state that is not consistent."""

from __future__ import annotations

import random

import pytest

from numa_agent.admission.errors import MemoryAllocationError
from numa_agent.admission.memory_manager import MEMORY, hugepages_resource, usage_from_booked
from numa_agent.admission.view import memory_usage
from numa_agent.state.model import AgentState, Booking
from tests.support.state_updates import random_update

GiB = 1 << 30
HP2M = hugepages_resource(2048)


def from_scratch(state):
    try:
        return usage_from_booked((b.memory_group or b.memory.keys(), b.memory)
                                 for b in state.top_level_bookings() if b.memory)
    except (ValueError, MemoryAllocationError) as exc:
        return type(exc)


def followed(state):
    try:
        return memory_usage(state)
    except (ValueError, MemoryAllocationError) as exc:
        return type(exc)


def random_booking(rng):
    """Memory on one node or a group of two; now and then a group that overlaps
    another's, or an amount no allocation can have (negative, outside its group)."""
    if rng.random() < 0.25:
        return Booking()
    # Groups of one partition of the nodes, and rarely one across two of its parts.
    group = rng.choice(((0,), (1,), (2, 3))) if rng.random() < 0.95 else (1, 2)
    memory = {n: {MEMORY: rng.randrange(1, 4) * GiB} for n in group}
    if rng.random() < 0.3:
        memory[group[0]][HP2M] = rng.randrange(1, 8) << 21
    odd = rng.random()
    if odd < 0.03:
        memory[group[0]][MEMORY] = -1
    elif odd < 0.06:
        memory[(group[-1] + 1) % 4] = {MEMORY: GiB}  # outside the group it names
    return Booking(memory=memory, memory_group=group if len(group) > 1 else ())


@pytest.mark.parametrize("seed", range(10))
def test_memory_usage_handed_on_along_updates_equals_a_fold_from_scratch(seed):
    rng = random.Random(seed)
    state = AgentState()
    handed_on = 0
    for step in range(200):
        handed_on += "memory_usage" in state.memo
        assert followed(state) == from_scratch(state)
        state = random_update(state, rng, step, lambda: random_booking(rng))
    # Most states took the usage on from the one before instead of folding every booking.
    assert handed_on > 100
