"""A resize is decided as an admission of the workload's own request is: every
constraint it was admitted with holds after it (-N, -C/within_cpus, the CPU
manager's options, the policy), a shrink gives back and drops the nodes it no
longer uses, and a request the machine cannot express is `not_resizable`."""

import pytest

from numa_agent.admission.admit import Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.resize import resize
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

GiB = 1 << 30


def machine(policy="best-effort", threads=2, **options):
    # 2 nodes x 4 cores x `threads`; CPU 0 reserved
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=threads, memory_per_node_bytes=8 * GiB)
    return build_machine(topo, PolicyConfig(topology_policy=policy, cpu_options=options))


def admitted(m, name="web", cpus=2, memory=0, state=None, **kw):
    d = decide(m, state or AgentState(),
               Request(name=name, owner_uid=1000, resources=Resources(cpus=cpus, memory_bytes=memory), **kw))
    return d.state, d.workload


def test_a_workload_bound_to_its_nodes_does_not_grow_off_them():
    m = machine()
    state, w = admitted(m, cpus=6, cpunodebind=(0,))
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=9)  # node 0 gives 7: -N 0 says no further
    assert refused.value.code == "insufficient_cpus"
    assert "cannot grow web from 6 to 9 CPUs" in refused.value.message
    grown = resize(m, state, "web", cpus=7).workload.booking.cpus
    assert m.nodes_of(grown) == (0,) and w.booking.cpus.issubset(grown)


def test_a_workload_grows_only_inside_the_cpus_it_was_granted():
    m = machine()
    granted = CpuSet.parse("1-5")
    state, w = admitted(m, cpus=2, within_cpus=granted)
    grown = resize(m, state, "web", cpus=5).workload.booking.cpus
    assert grown == granted
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=6)
    assert refused.value.code == "insufficient_cpus"


@pytest.mark.parametrize("cpus", [3, 1])
def test_full_pcpus_only_keeps_whole_cores_through_a_resize(cpus):
    m = machine(**{"full-pcpus-only": "true"})
    state, _ = admitted(m, cpus=2 if cpus == 3 else 4)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=cpus)
    assert refused.value.code == "smt_alignment_error"
    assert resize(m, state, "web", cpus=6 if cpus == 3 else 2).workload.booking.cpus


def test_a_shrink_drops_the_nodes_it_no_longer_uses():
    m = machine()
    state, w = admitted(m, cpus=6)
    grown = resize(m, state, "web", cpus=9)
    assert grown.workload.booking.numa_nodes == (0, 1)
    back = resize(m, grown.state, "web", cpus=6).workload.booking
    assert back.cpus == w.booking.cpus and back.numa_nodes == (0,)


def test_a_growth_stays_aligned_with_the_memory_it_holds_under_single_numa_node():
    m = machine("single-numa-node")
    state, w = admitted(m, cpus=2, memory=1 * GiB)
    # Its memory is booked on node 0: a growth that node 0 cannot hold is refused, not split.
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=9)
    assert refused.value.code == "topology_affinity_error"


def test_growing_named_cpus_is_not_resizable():
    m = machine()
    state, _ = admitted(m, cpus=0, physcpubind=CpuSet.parse("2-3"))
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=4)
    assert refused.value.code == "not_resizable"


def test_memory_for_a_workload_without_a_memory_booking_is_not_resizable():
    m = machine()
    state, w = admitted(m, cpus=2)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", memory_bytes=GiB)  # booked afresh, its mems could move
    assert refused.value.code == "not_resizable"


def test_a_grown_workload_keeps_its_memory_nodes_in_mems():
    m = machine()
    state, w = admitted(m, cpus=2, memory=1 * GiB, membind=(0,))
    d = resize(m, state, "web", memory_bytes=2 * GiB)
    assert d.workload.booking.mems == (0,) and set(d.workload.booking.memory) == {0}
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", memory_bytes=9 * GiB)  # -m 0 holds 8 GiB
    assert refused.value.code == "insufficient_memory"


def test_a_resize_keeps_its_devices_and_their_node():
    from tests.admission.test_admit import machine as with_devices

    m = with_devices("single-numa-node")
    state = decide(m, AgentState(), Request(name="web", owner_uid=1000,
                                            resources=Resources(cpus=2, devices={"gpu": 1}))).state
    w = state.workload("web")
    grown = resize(m, state, "web", cpus=4)
    assert grown.workload.booking.devices == w.booking.devices
    assert grown.workload.booking.numa_nodes == w.booking.numa_nodes == (1,)  # the GPU's node
    back = resize(m, grown.state, "web", cpus=2).workload.booking
    assert back.cpus == w.booking.cpus and back.devices == w.booking.devices and back.numa_nodes == (1,)
    assert grown.state.devices_in_use() == state.devices_in_use()  # held once


def test_a_resize_keeps_its_hugepages_whatever_the_kernel_counters_say():
    from numa_agent.admission.memory_manager import KernelHugepages

    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 * GiB,
                         hugepages_2m_per_node=64)
    m = build_machine(topo, PolicyConfig(topology_policy="single-numa-node"))
    state = decide(m, AgentState(), Request(name="web", owner_uid=1000,
                                            resources=Resources(cpus=2, hugepages={2048: 64}))).state
    node = next(iter(state.workload("web").booking.memory))
    # All 64 pages of its node are in use: its own, faulted in.
    kernel = KernelHugepages(free=((node, 2048, 0),), in_use=((node, 2048, 64 * (2 << 20)),))
    d = resize(m, state, "web", cpus=4, kernel=kernel)
    assert d.workload.booking.memory == state.workload("web").booking.memory
