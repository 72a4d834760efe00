"""prefer-closest-numa-nodes is on by default here (the kubelet's default is off):
on the SNC snapshot it keeps a 24-CPU workload in one package, and on every
snapshot it never widens a placement nor makes it farther."""

from dataclasses import replace

import pytest

from numa_agent.admission.admit import Refusal, Request, Resources, decide
from numa_agent.admission.machine import CLOSEST_BY_DEFAULT_UP_TO, MachineConfigError, PolicyConfig, build_machine
from numa_agent.discovery.sysfs import read_topology
from numa_agent.state.model import AgentState
from tests.conftest import SNAPSHOT_NAMES
from tests.support.synthetic import make_topology

SNC = "intel-clx-2s-ht-snc2-4numa"
KUBELET_DEFAULT = {"prefer-closest-numa-nodes": "false"}


def placed_nodes(machine, cpus):
    d = decide(machine, AgentState(), Request(name="w", owner_uid=0, resources=Resources(cpus=cpus)))
    return machine.nodes_of(d.workload.booking.cpus)


def test_on_the_snc_snapshot_24_cpus_stay_in_one_package(snapshot):
    topo = read_topology(snapshot(SNC)[0])
    # Nodes 0 and 2 are the two sub-NUMA clusters of package 0 (distance 11); 1 is across.
    assert topo.node(0).distances[2] == 11 and topo.node(0).distances[1] == 21
    ours = build_machine(topo, PolicyConfig())
    assert ours.tm_options.prefer_closest_numa_nodes
    assert placed_nodes(ours, 24) == (0, 2)
    kubelets = build_machine(topo, PolicyConfig(topology_options=KUBELET_DEFAULT))
    assert placed_nodes(kubelets, 24) == (0, 1)


def _outcome(machine, cpus):
    try:
        nodes = placed_nodes(machine, cpus)
    except (Refusal, ValueError) as exc:
        return type(exc).__name__, 0
    return len(nodes), sum(machine.distances[a][b] for a in nodes for b in nodes)


@pytest.mark.parametrize("name", SNAPSHOT_NAMES)
def test_the_default_never_widens_nor_lengthens_a_placement(snapshot, name):
    topo = read_topology(snapshot(name)[0])
    ours = build_machine(topo, PolicyConfig())
    kubelets = build_machine(topo, PolicyConfig(topology_options=KUBELET_DEFAULT))
    assert ours.tm_options.prefer_closest_numa_nodes == (len(ours.node_ids) <= CLOSEST_BY_DEFAULT_UP_TO)
    for cpus in range(1, len(ours.usable_cpus) + 1, 3):
        (width, distance), (k_width, k_distance) = _outcome(ours, cpus), _outcome(kubelets, cpus)
        assert width == k_width, cpus  # the same number of nodes (or the same refusal)
        assert distance <= k_distance, cpus  # and never farther apart


def test_larger_machines_keep_the_kubelets_default_unless_asked():
    topo = make_topology(sockets=4, nodes_per_socket=4, cores_per_node=2, threads_per_core=1)
    assert not build_machine(topo, PolicyConfig()).tm_options.prefer_closest_numa_nodes
    asked = PolicyConfig(topology_options={"prefer-closest-numa-nodes": "true"})
    assert build_machine(topo, asked).tm_options.prefer_closest_numa_nodes


def test_without_a_distance_matrix_the_default_is_off_and_asking_for_it_does_not_fit():
    topo = make_topology(sockets=2, nodes_per_socket=2)
    topo = replace(topo, numa_nodes=tuple(replace(n, distances={}) for n in topo.numa_nodes))
    assert not build_machine(topo, PolicyConfig()).tm_options.prefer_closest_numa_nodes
    with pytest.raises(MachineConfigError, match="topology_manager.options: prefer-closest-numa-nodes"):
        build_machine(topo, PolicyConfig(topology_options={"prefer-closest-numa-nodes": "true"}))
