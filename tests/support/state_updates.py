"""A random walk of state updates, for property tests of what a state hands on
to the states derived from it."""

from __future__ import annotations

import random
from typing import Callable

from numa_agent.state.model import AgentState, Booking, Pod, Workload


def random_update(state: AgentState, rng: random.Random, step: int, booking: Callable[[], Booking]) -> AgentState:
    """One update of twelve workload names (a third of them in pod p0) and two
    pods: a workload or pod put in with `booking()`, or one taken out."""
    op, name = rng.random(), f"w{rng.randrange(12)}"
    if op < 0.5:
        return state.with_workload(Workload(name=name, owner_uid=step, booking=booking(),
                                            pod=rng.choice([None, None, "p0"])))
    if op < 0.75:
        return state.without_workload(name)
    if op < 0.9:
        return state.with_pod(Pod(name=f"p{rng.randrange(2)}", owner_uid=0, booking=booking()))
    return state.without_pod(f"p{rng.randrange(2)}")
