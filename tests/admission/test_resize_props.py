"""Property tests: whatever a resize leaves satisfies every rule an admission of
the same request checks, on random machines, policies, CPU manager options and
constraint sets (-N, -m, within_cpus, memory); growth keeps what it held, a shrink
keeps a subset of it, a refusal changes nothing, and nothing is held twice."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from numa_agent.admission.admit import InvalidRequest, Refusal, Request, Resources, decide
from numa_agent.admission.cpu_options import CpuPolicyConfigError
from numa_agent.admission.machine import MachineConfigError, PolicyConfig, build_machine
from numa_agent.admission.memory_manager import shortfalls
from numa_agent.admission.resize import resize
from numa_agent.admission.view import fenced_nodes, memory_usage, shared_pool
from numa_agent.core.cpuset import CpuSet
from numa_agent.hotplug.rebase import rebase_state
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology, with_node_memory

GiB = 1 << 30
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
OPTIONS = ("full-pcpus-only", "distribute-cpus-across-numa", "align-by-socket")


@st.composite
def scenes(draw):
    """A machine, a state with a few workloads, and `web` admitted under random constraints."""
    topo = make_topology(sockets=draw(st.integers(1, 2)), nodes_per_socket=draw(st.integers(1, 2)),
                         cores_per_node=draw(st.integers(2, 4)), threads_per_core=draw(st.sampled_from([1, 2])),
                         memory_per_node_bytes=4 * GiB)
    policy = draw(st.sampled_from(POLICIES))
    options = {name: "true" for name in draw(st.sets(st.sampled_from(OPTIONS), max_size=2))}
    try:
        m = build_machine(topo, PolicyConfig(topology_policy=policy, cpu_options=options))
    except (CpuPolicyConfigError, MachineConfigError):
        assume(False)
    per_core = m.cpu_topology.cpus_per_core if "full-pcpus-only" in options else 1
    state = AgentState()
    for i in range(draw(st.integers(0, 3))):  # neighbours, some of which may not fit
        try:
            state = decide(m, state, Request(f"n{i}", 1001, Resources(
                cpus=per_core * draw(st.integers(1, 3)), memory_bytes=draw(st.sampled_from([0, GiB]))))).state
        except (Refusal, InvalidRequest):
            pass
    nodes = m.node_ids
    cpunodebind = draw(st.none() | st.sets(st.sampled_from(nodes), min_size=1).map(lambda s: tuple(sorted(s))))
    usable = m.usable_cpus.ids()
    within = draw(st.none() | st.sets(st.sampled_from(usable), min_size=per_core).map(CpuSet))
    membind = draw(st.none() | st.sets(st.sampled_from(nodes), min_size=1).map(lambda s: tuple(sorted(s))))
    memory = draw(st.sampled_from([0, GiB // 2, GiB, 3 * GiB]))
    request = Request("web", 1000, Resources(cpus=per_core * draw(st.integers(1, 3)), memory_bytes=memory),
                      cpunodebind=cpunodebind, membind=membind, within_cpus=within)
    try:
        state = decide(m, state, request).state
    except (Refusal, InvalidRequest):
        assume(False)
    return m, state, per_core


def _whole_cores(m, cpus: CpuSet) -> bool:
    return all((core & m.usable_cpus).issubset(cpus) or not core & cpus for core in m.cpu_topology.core_cpus.values())


def _check_state(m, state: AgentState) -> None:
    """Nothing held twice; memory within every node's capacity; a shared pool left."""
    held = [w.booking.cpus for w in state.workloads if not w.shared and w.pod is None]
    union = CpuSet.union_of(held)
    assert sum(len(c) for c in held) == len(union)
    assert not (union & m.reserved_cpus)
    assert not shortfalls(m.memory, memory_usage(state))
    assert shared_pool(m, state)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                  HealthCheck.too_slow])
@given(scenes(), st.data())
def test_a_resize_keeps_every_rule_its_admission_checked(scene, data):
    m, state, per_core = scene
    w = state.workload("web")
    held = w.booking.cpus
    cpus = data.draw(st.integers(1, len(m.usable_cpus)), label="cpus")
    memory = data.draw(st.none() | st.sampled_from([GiB // 4, GiB, 2 * GiB, 5 * GiB]), label="memory")
    try:
        d = resize(m, state, "web", cpus=cpus, memory_bytes=memory)
    except Refusal:
        assert state.workload("web") == w  # a refusal changes nothing (the state is a value)
        return
    got = d.workload.booking
    # growth keeps what it held; a shrink keeps a subset of it
    assert held.issubset(got.cpus) if cpus >= len(held) else got.cpus.issubset(held)
    assert len(got.cpus) == cpus
    # the constraints it was admitted with
    r = w.request
    if r.get("within_cpus") is not None:
        assert got.cpus.issubset(CpuSet.parse(r["within_cpus"]))
    if r.get("cpunodebind") is not None:
        assert got.cpus.issubset(m.cpus_of_nodes(tuple(r["cpunodebind"])))
    if r.get("membind") is not None:
        assert set(got.mems) == set(r["membind"]) and set(got.memory) <= set(r["membind"])
    if m.cpu_options.full_pcpus_only:
        assert _whole_cores(m, got.cpus)
    if memory is not None:
        assert got.memory_total("memory") == memory
    # the policy: an aligned policy admits only its preferred width, and the same
    # request decided afresh on the state without the workload is admitted too
    policy = m.policy.topology_policy
    cpu_nodes = m.nodes_of(got.cpus)
    if policy == "single-numa-node":  # -N and -m take part in the merge like the rest
        assert len(set(cpu_nodes) | set(got.memory) | set(got.mems)) == 1
    if policy == "restricted" and not m.cpu_options.align_by_socket:
        assert len(cpu_nodes) <= m.cpu_topology.min_nodes_for(cpus)
    fresh = Request("web", 1000, Resources(cpus=cpus, memory_bytes=got.memory_total("memory")),
                    cpunodebind=None if r.get("cpunodebind") is None else tuple(r["cpunodebind"]),
                    membind=None if r.get("membind") is None else tuple(r["membind"]),
                    within_cpus=None if r.get("within_cpus") is None else CpuSet.parse(r["within_cpus"]))
    decide(m, state.without_workload("web"), fresh)
    # its nodes are those of what it holds now
    assert set(got.numa_nodes) == set(cpu_nodes) | set(got.mems)
    assert set(got.memory) <= set(got.mems) or not got.memory
    _check_state(m, d.state)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.integers(2, 8), st.integers(1, 4), st.booleans(), st.integers(1, 8))
def test_a_pod_member_resizes_inside_its_pod(budget, first, sharing, target):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=4 * GiB)
    m = build_machine(topo, PolicyConfig(topology_policy="best-effort"))
    assume(first + 1 + sharing <= budget)
    state = decide(m, AgentState(), Request("main", 1000, Resources(cpus=first), pod="pd",
                                            pod_budget=Resources(cpus=budget))).state
    state = decide(m, state, Request("other", 1000, Resources(cpus=1), pod="pd")).state
    if sharing:
        state = decide(m, state, Request("side", 1000, Resources(), pod="pd")).state
    pod, held = state.pod("pd"), state.workload("main").booking.cpus
    try:
        d = resize(m, state, "main", cpus=target)
    except Refusal:
        return
    got = d.workload.booking.cpus
    assert len(got) == target and got.issubset(pod.booking.cpus)
    assert held.issubset(got) if target >= len(held) else got.issubset(held)
    assert got.isdisjoint(d.state.workload("other").booking.cpus)
    if sharing:
        assert pod.booking.cpus - got - d.state.workload("other").booking.cpus  # the sharers keep a CPU
    assert d.state.exclusive_cpus() == state.exclusive_cpus()  # the machine's pool does not change
    assert d.state.pod("pd").members == pod.members


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                  HealthCheck.too_slow])
@given(scenes(), st.data())
def test_on_a_node_short_of_memory_a_resize_gives_back_and_adds_only_off_it(scene, data):
    """The node web's memory is on loses memory below its bookings (fenced): a
    resize that only gives back is admitted and keeps a subset of what it held; a
    growth adds nothing on a fenced node (its new CPUs, or memory grown there)."""
    m, state, per_core = scene
    w = state.workload("web")
    assume(w.booking.memory)
    node = min(w.booking.memory)
    shrunk = build_machine(with_node_memory(m.topology, node, GiB // 4), m.policy)
    state, _ = rebase_state(shrunk, state)
    fenced = fenced_nodes(shrunk, state)
    assert node in fenced
    held, memory = w.booking.cpus, w.booking.memory_total("memory")
    cpus = per_core * data.draw(st.integers(1, len(shrunk.usable_cpus) // per_core), label="cores")
    grows_memory = data.draw(st.booleans(), label="grows memory")
    target = memory + GiB if grows_memory else data.draw(st.integers(1, memory), label="memory")
    try:
        got = resize(shrunk, state, "web", cpus=cpus, memory_bytes=target).workload.booking
    except Refusal as refusal:
        assert cpus > len(held) or grows_memory, refusal.message  # giving back is always allowed
        return
    assert not grows_memory  # its memory group holds a fenced node
    added = got.cpus - held
    assert not set(shrunk.nodes_of(added)) & set(fenced) if added else got.cpus.issubset(held)
    assert got.memory_total("memory") == target and set(got.memory) <= set(w.booking.memory)
