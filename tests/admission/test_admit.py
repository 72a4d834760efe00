"""The admission pipeline end to end, on synthetic machines: hints, merge,
allocation, pods, explicit bindings, hotplug rebase and the accounting
invariants."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.admission.accounting import node_accounting
from numa_agent.admission.admit import (
    InvalidRequest,
    Refusal,
    Request,
    Resources,
    decide,
    effective_cpus,
    pod_shared_cpus,
    release,
    shared_pool,
)
from numa_agent.admission.machine import MachineConfigError, PolicyConfig, build_machine
from numa_agent.admission.request import describe_amounts
from numa_agent.core.cpuset import CpuSet
from numa_agent.hotplug.rebase import rebase_state
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

GPU = ("0x030200", "0x10de", "0x20b0", 1, "nvidia")
NIC = ("0x020000", "0x8086", "0x1572", 0, "i40e")
DEVICES = {"gpu": {"vendor": "0x10de", "class_prefixes": ["0x0302", "0x0300"]},
           "nic": {"class_prefixes": ["0x0200"]}}


def machine(policy="best-effort", sockets=2, cores=4, threads=2, devices=(GPU, NIC), **kw):
    topo = make_topology(sockets=sockets, cores_per_node=cores, threads_per_core=threads,
                         memory_per_node_bytes=8 << 30, hugepages_2m_per_node=64, devices=devices)
    return build_machine(topo, PolicyConfig(topology_policy=policy, devices=DEVICES, **kw))


def req(name, **kw):
    res = {k: kw.pop(k) for k in ("cpus", "memory_bytes", "hugepages", "devices") if k in kw}
    return Request(name=name, owner_uid=1000, pid=4242, resources=Resources(**res), **kw)


def test_exclusive_cpus_are_whole_cores_on_one_node_and_leave_the_pool():
    m = machine()
    d = decide(m, AgentState(), req("a", cpus=2))
    cpus = d.workload.booking.cpus
    assert len(cpus) == 2
    assert len(m.nodes_of(cpus)) == 1
    assert m.topology.cpu(cpus.min()).siblings == cpus  # both threads of one core
    assert cpus.isdisjoint(m.reserved_cpus)
    assert cpus.isdisjoint(shared_pool(m, d.state))
    assert d.explanation["alignment"] == {"numa_node": True, "physical_core": True, "l3": True}


def test_reserved_cpus_are_never_handed_out():
    m = machine(reserved_cpu_count=2)
    state = AgentState()
    for i in range(7):  # 16 CPUs - 2 reserved = 14 = 7 x 2
        state = decide(m, state, req(f"w{i}", cpus=2)).state
    assert state.exclusive_cpus().isdisjoint(m.reserved_cpus)
    with pytest.raises(Refusal) as err:
        decide(m, state, req("late", cpus=2))
    assert "requested 2" in err.value.message and "0 free" in err.value.message


def test_single_numa_node_refuses_what_spans_nodes_and_explains():
    m = machine("single-numa-node")
    with pytest.raises(Refusal) as err:
        decide(m, AgentState(), req("big", cpus=10))
    e = err.value
    assert e.code == "topology_affinity_error"
    assert "TopologyAffinityError" in e.message
    assert "15 free, but at most 8 on one NUMA node" in e.message  # 1 reserved on node 0
    assert e.explanation["providers"][0]["provider"] == "cpu"
    assert e.explanation["merged"]["preferred"] is False
    # best-effort admits the same request across both nodes
    d = decide(machine("best-effort"), AgentState(), req("big", cpus=10))
    assert len(d.workload.booking.cpus) == 10
    assert d.workload.booking.numa_nodes == (0, 1)


def test_a_topology_refusal_names_only_the_resources_that_do_not_fit_one_node():
    # 2 CPUs fit on either node; 10 GiB of memory fits on none (8 GiB each): the reason is memory's.
    with pytest.raises(Refusal) as err:
        decide(machine("single-numa-node"), AgentState(), req("mem", cpus=2, memory_bytes=10 << 30))
    assert err.value.code == "topology_affinity_error"
    assert "memory: requested 10 GiB" in err.value.message
    assert "CPUs requested" not in err.value.message


def test_a_refusal_says_admit_false_whatever_the_topology_verdict():
    # The merge aligns 3 CPUs on one node; the CPU manager then refuses an odd count.
    m = machine("single-numa-node", cpu_options={"full-pcpus-only": "true"})
    with pytest.raises(Refusal) as err:
        decide(m, AgentState(), req("odd", cpus=3))
    assert err.value.code == "smt_alignment_error"
    assert err.value.explanation["admit"] is False
    assert err.value.explanation["topology"] == {"policy": "single-numa-node", "scope": "container",
                                                 "verdict": "aligned"}
    # The topology manager's own refusal.
    with pytest.raises(Refusal) as err:
        decide(machine("single-numa-node"), AgentState(), req("big", cpus=10))
    assert err.value.explanation["admit"] is False
    assert err.value.explanation["topology"]["verdict"] == "not-aligned"
    # best-effort admits what is not aligned; none checks nothing.
    # (8 CPUs fit only node 1, the NIC is on node 0)
    spread = decide(machine("best-effort"), AgentState(), req("apart", cpus=8, devices={"nic": 1})).explanation
    assert spread["admit"] is True and spread["topology"]["verdict"] == "not-aligned"
    anywhere = decide(machine("none"), AgentState(), req("any", cpus=2)).explanation
    assert anywhere["admit"] is True and anywhere["topology"] == {
        "policy": "none", "scope": "container", "verdict": "not-checked"}


def test_a_memory_refusal_reads_in_binary_units_beside_its_bytes():
    m = machine("single-numa-node")  # 8 GiB per node, 128 MiB of it in 2 MiB hugepages
    with pytest.raises(Refusal) as err:
        decide(m, AgentState(), req("big", cpus=2, memory_bytes=10 << 30, hugepages={2048: 2}))
    assert "memory: requested 10 GiB, node 0 has 7.9 GiB free, node 1 has 7.9 GiB free;" in err.value.message
    e = err.value.explanation
    assert e["requested"] == {"cpus": 2, "memory_bytes": 10 << 30, "hugepages": {"2048": 2}, "devices": {}}
    assert e["free"]["1"] == {"cpus": 8, "memory_bytes": (8 << 30) - (128 << 20),
                              "hugepages_bytes": {"2048": 128 << 20}}


def test_device_pulls_cpus_and_memory_to_its_node():
    m = machine("single-numa-node")
    d = decide(m, AgentState(), req("infer", cpus=2, memory_bytes=1 << 30, devices={"gpu": 1}))
    b = d.workload.booking
    assert b.devices == (("gpu", m.devices.devices("gpu")[0].address),)
    assert m.nodes_of(b.cpus) == (1,)
    assert b.mems == (1,)
    assert b.memory == {1: {"memory": 1 << 30}}


def test_memory_follows_cpus_and_hugepages_are_booked():
    m = machine("restricted")
    d = decide(m, AgentState(), req("db", cpus=4, memory_bytes=2 << 30, hugepages={2048: 32}))
    b = d.workload.booking
    node = m.nodes_of(b.cpus)
    assert len(node) == 1
    assert b.mems == node
    assert b.memory[node[0]] == {"memory": 2 << 30, "hugepages-2048kB": 32 * 2048 * 1024}
    acc = {n["id"]: n for n in node_accounting(m, d.state)}
    assert acc[node[0]]["hugepages"]["2048kB"]["allocated"] == 32


def test_physcpubind_books_exactly_those_cpus_and_refuses_busy_ones():
    m = machine()
    d = decide(m, AgentState(), req("pinned", physcpubind=CpuSet.parse("3,11")))
    assert d.workload.booking.cpus == CpuSet.parse("3,11")
    with pytest.raises(Refusal, match="CPUs 3 are reserved or exclusively allocated"):
        decide(m, d.state, req("again", physcpubind=CpuSet.parse("3")))
    with pytest.raises(InvalidRequest, match="not usable"):
        decide(m, d.state, req("nope", physcpubind=CpuSet.parse("99")))


def test_cpunodebind_restricts_exclusive_and_shared_cpus():
    m = machine()
    d = decide(m, AgentState(), req("n1", cpus=2, cpunodebind=(1,)))
    assert m.nodes_of(d.workload.booking.cpus) == (1,)
    d2 = decide(m, d.state, req("s1", shared=True, cpunodebind=(1,)))
    cpus = effective_cpus(m, d2.state, d2.workload)
    assert m.nodes_of(cpus) == (1,)
    assert cpus.isdisjoint(d.workload.booking.cpus)
    with pytest.raises(InvalidRequest, match="NUMA node"):
        decide(m, AgentState(), req("bad", cpus=1, cpunodebind=(7,)))


def test_bad_requests_are_refused_with_the_reason():
    m = machine()
    with pytest.raises(InvalidRequest, match="unknown device resource 'fpga'"):
        decide(m, AgentState(), req("x", devices={"fpga": 1}))
    with pytest.raises(InvalidRequest, match="exclude each other"):
        decide(m, AgentState(), req("x", cpus=2, shared=True))
    with pytest.raises(InvalidRequest) as err:
        decide(m, AgentState(), req("x", hugepages={16384: 1}))
    assert str(err.value) == ("hugepages of 16 MiB (16384kB) do not exist on this machine "
                              "(its page sizes: 2 MiB (2048kB), 1 GiB (1048576kB))")
    with pytest.raises(Refusal, match="more than the machine can ever hold"):
        decide(m, AgentState(), req("x", hugepages={1048576: 1}))  # the size exists, no pages
    state = decide(m, AgentState(), req("dup", cpus=1)).state
    with pytest.raises(InvalidRequest, match="already exists"):
        decide(m, state, req("dup", cpus=1))


def test_pod_main_member_exclusive_sidecar_shares_the_rest():
    m = machine("single-numa-node")
    budget = Resources(cpus=6, memory_bytes=2 << 30)
    d1 = decide(m, AgentState(), req("main", pod="p", pod_budget=budget, cpus=4))
    pod = d1.state.pod("p")
    assert d1.pod_created is not None and len(pod.booking.cpus) == 6
    assert len(m.nodes_of(pod.booking.cpus)) == 1
    assert d1.workload.booking.cpus.issubset(pod.booking.cpus)
    d2 = decide(m, d1.state, req("side", pod="p"))
    side_cpus = effective_cpus(m, d2.state, d2.workload)
    assert side_cpus == pod.booking.cpus - d1.workload.booking.cpus and len(side_cpus) == 2
    # an exclusive member that would leave the sidecar nothing is refused
    with pytest.raises(Refusal) as err:
        decide(m, d2.state, req("greedy", pod="p", cpus=2))
    assert err.value.code == "pod_shared_part_empty" and "side" in err.value.message
    # members' memory stays inside the budget
    with pytest.raises(Refusal, match="would use 3 GiB of memory, more than the pod's budget of 2 GiB"):
        decide(m, d2.state, req("fat", pod="p", memory_bytes=3 << 30))
    # a later member cannot change the budget
    with pytest.raises(InvalidRequest) as err:
        decide(m, d2.state, req("other", pod="p", pod_budget=Resources(cpus=8, hugepages={2048: 1})))
    assert str(err.value) == ("pod 'p' already exists with a budget of 6 CPUs, 2 GiB of memory, not "
                              "8 CPUs, 1 hugepage of 2 MiB: a later member cannot change it (leave out "
                              "the --pod-* options)")
    # the budget goes with the last member
    s, _, freed = release(d2.state, "main")
    assert freed is None and s.pod("p").members == ("side",)
    s, _, freed = release(s, "side")
    assert freed is not None and s.pods == () and s.exclusive_cpus() == CpuSet()


def test_amounts_read_as_a_phrase():
    assert describe_amounts({"cpus": 1, "memory_bytes": 3 << 29, "hugepages": {"1048576": 4, "2048": 0},
                             "devices": {"gpu": 2, "nic": 0}}) == \
        "1 CPU, 1.5 GiB of memory, 4 hugepages of 1 GiB, 2 gpu"
    assert describe_amounts(Resources().to_json()) == "nothing"


def test_pod_member_without_budget_is_refused():
    with pytest.raises(InvalidRequest, match="first member must give the pod budget"):
        decide(machine(), AgentState(), req("m", pod="nopod", cpus=1))


def test_shared_pool_never_empties():
    m = machine(sockets=1, cores=2, threads=1, reserved_cpu_count=0, devices=())
    s = decide(m, AgentState(), req("a", cpus=1)).state
    with pytest.raises(Refusal) as err:
        decide(m, s, req("b", cpus=1))
    assert err.value.code == "shared_pool_empty"


def test_config_errors_name_the_key():
    topo = make_topology(sockets=2, cores_per_node=2)
    with pytest.raises(MachineConfigError, match="topology_manager.policy"):
        build_machine(topo, PolicyConfig(topology_policy="strict"))
    with pytest.raises(MachineConfigError, match="reserved_cpus: CPUs 99"):
        build_machine(topo, PolicyConfig(reserved_cpus="99"))
    with pytest.raises(MachineConfigError, match="devices.gpu"):
        build_machine(topo, PolicyConfig(devices={"gpu": {"colour": "green"}}))


def test_hotplug_rebase_records_lost_cpus_and_devices():
    m = machine()
    d = decide(m, AgentState(), req("infer", cpus=2, devices={"gpu": 1}))
    cpus = d.workload.booking.cpus
    gone = cpus.min()
    topo = m.topology
    new_cpus = tuple(replace(c, online=False) if c.id == gone else c for c in topo.cpus)
    new_topo = replace(topo, cpus=new_cpus, pci_devices=tuple(p for p in topo.pci_devices
                                                               if p.vendor != "0x10de"))
    m2 = build_machine(new_topo, m.policy)
    state, lost = rebase_state(m2, d.state)
    w = state.workload("infer")
    assert w.booking.cpus == cpus - CpuSet([gone])
    assert w.booking.devices == ()
    assert {what.split()[0] for _, what in lost} == {"cpus", "pci"}
    assert any(str(gone) in x for x in w.lost)
    assert gone not in shared_pool(m2, state)  # an offline CPU is nobody's


# ---- invariants over random machines and random sequences -----------------

ops = st.lists(st.tuples(st.sampled_from(["admit", "release", "pod"]), st.integers(0, 6),
                         st.integers(0, 3)), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 2),
       st.sampled_from(["none", "best-effort", "restricted", "single-numa-node"]), ops)
def test_invariants_hold_over_random_sequences(sockets, cores, threads, policy, sequence):
    m = machine(policy, sockets=sockets, cores=cores, threads=threads, devices=())
    initial = node_accounting(m, AgentState())
    state = AgentState()
    n = 0
    for op, size, mem in sequence:
        n += 1
        try:
            if op == "admit":
                r = req(f"w{n}", cpus=size, memory_bytes=mem << 30, shared=size == 0)
            elif op == "pod":
                r = req(f"w{n}", pod=f"p{size % 2}", pod_budget=Resources(cpus=size + 1),
                        cpus=size // 2)
                if state.pod(f"p{size % 2}") is not None:
                    r = replace(r, pod_budget=None)  # later members join the budget
            else:
                if state.workloads:
                    victim = state.workloads[size % len(state.workloads)].name
                    state, _, _ = release(state, victim)
                continue
            again = decide(m, state, r)
            assert decide(m, state, r).state == again.state  # deterministic
            state = again.state
        except (Refusal, InvalidRequest):
            pass
        _check_invariants(m, state)
    for w in list(state.workloads):
        state, _, _ = release(state, w.name)
    assert state.pods == ()
    assert node_accounting(m, state) == initial


def _check_invariants(m, state):
    seen = 0
    for b in state.top_level_bookings():
        assert b.cpus.bits & seen == 0, "a CPU was booked twice"
        seen |= b.cpus.bits
        assert b.cpus.isdisjoint(m.reserved_cpus)
    for pod in state.pods:
        member_bits = 0
        for w in state.members_of(pod.name):
            assert w.booking.cpus.issubset(pod.booking.cpus)
            assert w.booking.cpus.bits & member_bits == 0
            member_bits |= w.booking.cpus.bits
        assert set(pod.members) == {w.name for w in state.members_of(pod.name)}
        assert pod_shared_cpus(state, pod) or not any(w.shared for w in state.members_of(pod.name))
    for node in node_accounting(m, state):
        for key in ("cpus", "memory_bytes"):
            c = node[key]
            assert c["allocated"] + c["free"] + c["reserved"] == c["capacity"]
            assert min(c.values()) >= 0
    assert shared_pool(m, state)


@settings(max_examples=50, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=15)))
def test_machine_nodes_of_is_the_per_cpu_lookup(ids):
    m = machine()
    cpus = CpuSet(ids)
    assert m.nodes_of(cpus) == tuple(sorted({m.node_of_cpu(c) for c in cpus}))
    assert m.cpus_of_nodes(m.nodes_of(cpus)).issuperset(cpus & m.usable_cpus)


def test_machine_nodes_of_a_cpu_the_topology_lacks_raises():
    with pytest.raises(KeyError):
        machine().nodes_of(CpuSet([999]))


def test_decisions_and_refusals_name_the_providers_that_pinned_and_refused():
    m = machine(policy="single-numa-node")
    assert decide(m, AgentState(), req("a", cpus=2, memory_bytes=1 << 30)).pinned == {"cpu", "memory"}
    assert decide(m, AgentState(), req("b", shared=True)).pinned == frozenset()
    assert decide(m, AgentState(), req("c", devices={"gpu": 1})).pinned == {"devices"}
    budget = Resources(cpus=4, memory_bytes=1 << 30)
    first = decide(m, AgentState(), req("m1", pod="p", pod_budget=budget))
    assert first.pinned == {"cpu", "memory"}  # the pod's budget, though the member shares it
    assert decide(m, first.state, req("m2", pod="p", cpus=2)).pinned == {"cpu"}

    with pytest.raises(Refusal) as merge:
        decide(m, AgentState(), req("d", cpus=12))
    assert (merge.value.code, merge.value.provider, merge.value.pinned) == ("topology_affinity_error", None,
                                                                             frozenset())
    with pytest.raises(Refusal) as memory:  # no merge restriction: the CPUs come, 20 GiB do not
        decide(m, AgentState(), req("e", cpus=2, memory_bytes=20 << 30, policy="none"))
    assert (memory.value.code, memory.value.provider, memory.value.pinned) == ("insufficient_memory", "memory",
                                                                               {"cpu"})
