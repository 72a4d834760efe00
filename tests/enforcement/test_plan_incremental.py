"""The incremental layout (plan.update_layout) equals the full one
(plan.desired_layout) after any sequence of admissions, releases and pods,
and names every path whose spec changed but those that inherit the pool's
CPUs (plan.pool_followers names them). Seeded random sequences on synthetic
machines."""

from __future__ import annotations

import random

import pytest

from numa_agent.admission.admit import Refusal, Request, Resources, decide, release
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.enforcement.plan import (
    SHARED_CGROUP,
    desired_layout,
    order_changes,
    pool_followers,
    update_layout,
    workload_relpath,
)
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

MIB = 1 << 20


def machine_of(shape: int):
    topo = [make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30),
            make_topology(sockets=2, nodes_per_socket=2, cores_per_node=3, threads_per_core=2,
                          memory_per_node_bytes=4 << 30, hugepages_2m_per_node=64)][shape]
    return build_machine(topo, PolicyConfig(topology_policy="best-effort", reserved_cpu_count=1))


def random_request(rng: random.Random, machine, state: AgentState, n: int) -> Request:
    name = f"w{n}"
    kind = rng.choice(["shared", "shared", "bound", "exclusive", "pod", "pod", "memory"])
    if kind == "shared":
        return Request(name=name, owner_uid=0, shared=True, pid=1000 + n)
    if kind == "bound":
        return Request(name=name, owner_uid=0, shared=True, pid=1000 + n,
                       cpunodebind=(rng.choice(machine.node_ids),))
    if kind == "exclusive":
        return Request(name=name, owner_uid=0, resources=Resources(cpus=rng.randint(1, 3)), pid=1000 + n)
    if kind == "memory":
        return Request(name=name, owner_uid=0, shared=True, pid=1000 + n,
                       resources=Resources(memory_bytes=rng.randint(1, 64) * MIB))
    pod = f"p{rng.randint(0, 3)}"
    cpus = rng.choice([0, 0, 1])
    budget = None if state.pod(pod) is not None else Resources(cpus=4, memory_bytes=256 * MIB)
    return Request(name=name, owner_uid=0, pod=pod, pod_budget=budget, pid=1000 + n,
                   resources=Resources(cpus=cpus))


def step(rng: random.Random, machine, state: AgentState, n: int) -> AgentState:
    if state.workloads and rng.random() < 0.4:
        return release(state, rng.choice(state.workloads).name)[0]
    try:
        return decide(machine, state, random_request(rng, machine, state, n)).state
    except Refusal:
        return state


@pytest.mark.parametrize("seed", range(12))
def test_incremental_layout_equals_the_full_layout(seed):
    rng = random.Random(seed)
    machine = machine_of(seed % 2)
    state = AgentState()
    layout = desired_layout(machine, state)
    for n in range(80):
        new_state = step(rng, machine, state, n)
        changes = new_state.changes_since(state)
        assert changes is not None  # every decision and release names what it changed
        new_layout, touched = update_layout(machine, layout, state, new_state, *changes)
        full = desired_layout(machine, new_state)
        assert new_layout == full
        # Only the touched paths and the pool's followers are compared: the
        # same steps as a full diff.
        followers = pool_followers(layout, new_layout)
        assert not followers or new_layout[SHARED_CGROUP].cpus != layout[SHARED_CGROUP].cpus
        assert order_changes(layout, new_layout, {*touched, *followers}) == order_changes(layout, full)
        assert order_changes(new_layout, layout, {*touched, *followers}) == order_changes(full, layout)
        state, layout = new_state, new_layout


def test_a_shared_admission_touches_its_own_cgroup_and_the_pool_level_only():
    machine = machine_of(0)
    state = AgentState()
    for i in range(50):
        state = decide(machine, state, Request(name=f"s{i}", owner_uid=0, shared=True)).state
    layout = desired_layout(machine, state)
    new_state = decide(machine, state, Request(name="new", owner_uid=0, shared=True)).state
    new_layout, touched = update_layout(machine, layout, state, new_state,
                                        *new_state.changes_since(state))
    assert touched == {"agent", "shared", "shared/_released", "shared/new"}
    assert [c.relpath for c in order_changes(layout, new_layout, touched)] == ["shared/new"]


@pytest.mark.parametrize("live", [5, 50])
def test_an_exclusive_admission_shrinks_the_pool_once_and_names_none_of_its_followers(live):
    machine = machine_of(0)
    state = AgentState()
    for i in range(live):
        state = decide(machine, state, Request(name=f"s{i}", owner_uid=0, shared=True)).state
    state = decide(machine, state, Request(name="bound", owner_uid=0, shared=True,
                                           cpunodebind=(machine.node_ids[0],))).state
    layout = desired_layout(machine, state)
    new_state = decide(machine, state, Request(name="x", owner_uid=0, resources=Resources(cpus=2))).state
    new_layout, touched = update_layout(machine, layout, state, new_state,
                                        *new_state.changes_since(state))
    # The pool shrinks before the new holder is created; the bound workload
    # is written again; those that inherit the pool are not named, whatever
    # their number: their specs read the pool's CPUs.
    assert touched == {"agent", "shared", "shared/_released", "shared/bound", "wl-x"}
    kinds = [(c.kind, c.relpath) for c in order_changes(layout, new_layout, touched)]
    assert kinds.index(("shrink", "shared")) < kinds.index(("create", "wl-x"))
    followers = pool_followers(layout, new_layout)
    assert sorted(followers) == sorted(f"shared/s{i}" for i in range(live))
    assert all(new_layout[rel].inherit and new_layout[rel].cpus == new_layout[SHARED_CGROUP].cpus
               for rel in followers)
    assert pool_followers(new_layout, new_layout) == []


def test_only_plain_shared_workloads_inherit_the_pool():
    machine = machine_of(1)
    state = AgentState()
    for req in (Request(name="plain", owner_uid=0, shared=True),
                Request(name="bound", owner_uid=0, shared=True, cpunodebind=(machine.node_ids[-1],)),
                Request(name="excl", owner_uid=0, resources=Resources(cpus=1)),
                Request(name="m1", owner_uid=0, pod="p", pod_budget=Resources(cpus=4)),
                Request(name="m2", owner_uid=0, pod="p", resources=Resources(cpus=1))):
        state = decide(machine, state, req).state
    layout = desired_layout(machine, state)
    inherit = {w.name: layout[workload_relpath(w)].inherit for w in state.workloads}
    assert inherit == {"plain": True, "bound": False, "excl": False, "m1": False, "m2": False}
    assert layout["shared/plain"].cpus == layout[SHARED_CGROUP].cpus


def test_a_state_not_derived_from_the_base_names_no_changes():
    machine = machine_of(0)
    base = decide(machine, AgentState(), Request(name="a", owner_uid=0, shared=True)).state
    other = AgentState.from_json(base.to_json())
    assert other.changes_since(base) is None
    assert base.changes_since(base) == (frozenset(), frozenset())


def test_a_change_away_from_the_pool_does_not_copy_the_bound_workloads():
    """A thousand shared containers (bound to the pool, written one by one) cost
    an admission that leaves the pool alone nothing: their set is kept, not copied."""
    from numa_agent.core.cpuset import CpuSet
    from numa_agent.enforcement.plan import CgroupLayout, CgroupSpec
    from numa_agent.state.model import Workload

    def shared_container(i):
        rel = f"/libpod_parent/libpod-{i:012x}"
        record = Workload(name=f"ctr-{i:012x}", owner_uid=0, shared=True, cgroup=rel)
        return CgroupSpec(rel, CpuSet.parse("0-7"), (0,), workload=record.name, record=record)

    layout = CgroupLayout({spec.relpath: spec for spec in map(shared_container, range(1000))})
    assert len(layout.bound()) == 1000
    exclusive = CgroupSpec("wl-x", CpuSet.parse("8-9"), (1,), workload="x")
    after = layout.updated({"wl-x": exclusive})
    assert after._bound is layout._bound
    gone = after.updated({}, ["wl-x"])
    assert gone._bound is layout._bound
    fewer = gone.updated({}, ["/libpod_parent/libpod-000000000000"])
    assert len(fewer.bound()) == 999 and len(layout.bound()) == 1000


@pytest.mark.parametrize("before, after, steps", [
    ("0-7", "0-5", ("0-5", None)),   # the pool loses CPUs: followers pinned first
    ("0-5", "0-7", (None, "0-7")),   # it gains some: pinned last
    ("0-5", "2-7", ("2-5", "2-7")),  # it moves: drop what it loses first, gain the rest last
    ("0-1", "2-3", (None, "2-3")),   # keeps nothing: one pin, last
    ("0-5", "0-5", (None, None)),    # unchanged: nothing
])
def test_pool_steps_move_the_followers_as_order_changes_moves_one_cgroup(before, after, steps):
    from numa_agent.core.cpuset import CpuSet
    from numa_agent.enforcement.plan import CgroupSpec, pool_steps

    def layout(cpus):
        return {SHARED_CGROUP: CgroupSpec(relpath=SHARED_CGROUP, cpus=CpuSet.parse(cpus), mems=(0,))}
    shrink_to, grow_to = pool_steps(layout(before), layout(after))
    assert (shrink_to and shrink_to.format(), grow_to and grow_to.format()) == steps
    if before != after:  # the same steps as order_changes plans for the pool's own cgroup
        kinds = [(c.kind, c.spec.cpus.format()) for c in order_changes(layout(before), layout(after))]
        assert kinds == [(kind, cpus) for kind, cpus in (("shrink", steps[0]), ("grow", steps[1])) if cpus]
