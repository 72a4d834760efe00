"""Containers their runtime enforces (NRI) have no cgroup in the layout, nor
do pods of them; their exclusive CPUs leave the pool's cgroups all the same,
and the incremental layout still equals the full one when they come and go
among the agent's own workloads."""

from __future__ import annotations

import random

import pytest

from numa_agent.admission.admit import Refusal, Request, Resources, decide, release, shared_pool
from numa_agent.enforcement.plan import (
    AGENT_CGROUP,
    RELEASED_CGROUP,
    SHARED_CGROUP,
    desired_layout,
    order_changes,
    update_layout,
)
from numa_agent.state.model import AgentState, RuntimeRef, replace
from tests.enforcement.test_plan_incremental import machine_of, random_request

REF = RuntimeRef(runtime="nri", container_id="c1", sandbox_id="s1", namespace="ns", pod="p", container="c")


def runtime_admitted(machine, state: AgentState, req: Request) -> AgentState:
    """`req` decided, then recorded as a container its runtime enforces (as the service does)."""
    decision = decide(machine, state, req)
    return decision.state.with_workload(replace(decision.workload, runtime=REF, pid=None))


def test_no_cgroup_for_them_and_the_pool_shrinks_by_their_cpus():
    machine = machine_of(0)
    state = runtime_admitted(machine, AgentState(), Request(name="ctr", owner_uid=0, resources=Resources(cpus=2)))
    state = runtime_admitted(machine, state, Request(name="m1", owner_uid=0, pod="rp",
                                                     pod_budget=Resources(cpus=4), resources=Resources(cpus=2)))
    layout = desired_layout(machine, state)
    assert sorted(layout) == sorted([AGENT_CGROUP, SHARED_CGROUP, RELEASED_CGROUP])
    held = state.exclusive_cpus()
    assert len(held) == 6 and not layout[SHARED_CGROUP].cpus & held
    assert layout[SHARED_CGROUP].cpus == shared_pool(machine, state)


@pytest.mark.parametrize("seed", range(8))
def test_incremental_layout_equals_the_full_layout_with_runtime_containers(seed):
    rng = random.Random(seed)
    machine = machine_of(seed % 2)
    state = AgentState()
    layout = desired_layout(machine, state)
    for n in range(80):
        if state.workloads and rng.random() < 0.35:
            new_state = release(state, rng.choice(state.workloads).name)[0]
        else:
            try:
                if rng.random() < 0.5:  # a runtime's container, alone or in a pod of such ("rp*")
                    pod = rng.choice([None, None, f"rp{rng.randint(0, 2)}"])
                    budget = Resources(cpus=4) if pod is not None and state.pod(pod) is None else None
                    req = Request(name=f"w{n}", owner_uid=0, pod=pod, pod_budget=budget,
                                  resources=Resources(cpus=rng.randint(1, 2)))
                    new_state = runtime_admitted(machine, state, req)
                else:
                    new_state = decide(machine, state, random_request(rng, machine, state, n)).state
            except Refusal:
                continue
        changes = new_state.changes_since(state)
        assert changes is not None
        new_layout, touched = update_layout(machine, layout, state, new_state, *changes)
        full = desired_layout(machine, new_state)
        assert new_layout == full
        runtime = {w.name for w in new_state.workloads if w.runtime is not None}
        assert not runtime & {spec.workload for spec in full.values()}
        assert not [rel for rel in full if rel.startswith("pod-rp")]
        assert not full[SHARED_CGROUP].cpus & new_state.exclusive_cpus()
        assert order_changes(layout, new_layout, None) == order_changes(layout, full)
        state, layout = new_state, new_layout
