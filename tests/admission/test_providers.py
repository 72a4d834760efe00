"""The provider seam: every registered provider satisfies HintProvider, and a
fifth provider defined here, handed to decide() through the same mechanism,
steers the merge and lands in the Booking without any change to admit.py."""

import inspect
from dataclasses import dataclass

import pytest

from numa_agent.admission import errors
from numa_agent.admission.admit import PROVIDERS, Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.provider import NOTHING, Allocation, HintProvider
from numa_agent.admission.registry import PROVIDERS as REGISTERED
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint
from numa_agent.state.model import AgentState
from tests.support.synthetic import make_topology

ACCEL = "example.com/accel"


def machine(policy="best-effort"):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    return build_machine(topo, PolicyConfig(topology_policy=policy))


def req(name, cpus=2, **kw):
    return Request(name=name, owner_uid=1000, resources=Resources(cpus=cpus), **kw)


class AccelRefused(errors.AllocationError):
    reason = "insufficient_accel"


@dataclass(frozen=True)
class AccelProvider:
    """A made-up resource that only node `node` has."""

    node: int = 1
    name: str = "accel"
    fail: bool = False
    seen: list | None = None

    def hints(self, request, view):
        return {ACCEL: HintSet.explicit([TopologyHint(NumaMask([self.node]), True)])}

    def allocate(self, request, view, affinity):
        if self.seen is not None:
            self.seen.append((view.pod.name if view.pod is not None else None, affinity))
        if self.fail:
            raise AccelRefused(f"{ACCEL}: none left on node {self.node}")
        return Allocation(devices=((ACCEL, f"accel-{self.node}"),), numa_nodes=(self.node,))

    def refusal_reason(self, request, view):
        return f"{ACCEL} exists on node {self.node} only"


def test_the_registered_providers_satisfy_the_protocol_in_order():
    assert PROVIDERS is REGISTERED
    assert [p.name for p in REGISTERED] == ["cpu", "memory", "devices"]
    methods = ("hints", "allocate", "refusal_reason")
    for provider in REGISTERED:
        assert isinstance(provider, HintProvider)
        for method in methods:
            want = list(inspect.signature(getattr(HintProvider, method)).parameters)[1:]
            assert list(inspect.signature(getattr(provider, method)).parameters) == want, (provider, method)
        hash(provider)  # immutable values


def test_decide_defaults_to_the_registered_providers():
    assert inspect.signature(decide).parameters["providers"].default is REGISTERED


def test_the_fake_provider_satisfies_the_protocol():
    assert isinstance(AccelProvider(), HintProvider)


def test_a_fifth_provider_steers_the_merge_and_ends_up_in_the_booking():
    m = machine()
    plain = decide(m, AgentState(), req("a"))
    assert m.nodes_of(plain.workload.booking.cpus) == (0,)

    d = decide(m, AgentState(), req("a"), providers=(*PROVIDERS, AccelProvider(node=1)), explain=True)
    booking = d.workload.booking
    assert m.nodes_of(booking.cpus) == (1,)
    assert booking.devices == ((ACCEL, "accel-1"),)
    assert booking.numa_nodes == (1,) and booking.mems == (1,)
    assert [p["provider"] for p in d.explanation["providers"]] == ["cpu", "accel"]
    assert d.explanation["merged"] == {"mask": [1], "preferred": True}


def test_a_fifth_provider_that_disagrees_is_named_in_the_topology_refusal():
    m = machine("single-numa-node")
    state = decide(m, AgentState(), req("big", cpus=8)).state  # all of node 1 (node 0 keeps a reserved CPU)
    assert m.nodes_of(decide(m, state, req("a", cpus=4)).workload.booking.cpus) == (0,)
    with pytest.raises(Refusal) as info:
        decide(m, state, req("a", cpus=4), providers=(*PROVIDERS, AccelProvider(node=1)))
    assert info.value.code == "topology_affinity_error"
    assert f"{ACCEL} exists on node 1 only" in info.value.message


def test_a_fifth_providers_error_reason_becomes_the_refusal_code():
    with pytest.raises(Refusal) as info:
        decide(machine(), AgentState(), req("a"), providers=(*PROVIDERS, AccelProvider(fail=True)))
    assert info.value.code == "insufficient_accel"
    assert info.value.message == f"{ACCEL}: none left on node 1"


def test_pod_members_are_allocated_by_the_same_providers_from_the_budget():
    m = machine()
    seen: list = []
    providers = (*PROVIDERS, AccelProvider(node=1, seen=seen))
    first = decide(m, AgentState(), req("a", cpus=1, pod="p", pod_budget=Resources(cpus=4)),
                   providers=providers)
    assert m.nodes_of(first.pod_created.booking.cpus) == (1,)
    assert seen == [(None, NumaMask([1])), ("p", None)]
    assert first.workload.booking.devices == ((ACCEL, "accel-1"),)
    assert first.workload.booking.numa_nodes == first.pod_created.booking.numa_nodes


def test_allocation_error_classes_carry_their_reason():
    assert errors.CpuAllocationError.reason == "insufficient_cpus"
    assert errors.SMTAlignmentError.reason == "smt_alignment_error"
    assert errors.MemoryAllocationError.reason == "insufficient_memory"
    assert errors.DeviceAllocationError.reason == "insufficient_devices"
    assert errors.CpusBusyError.reason == "cpus_busy"
    assert errors.SharedPoolEmptyError.reason == "shared_pool_empty"
    assert errors.PodSharedPartEmptyError.reason == "pod_shared_part_empty"
    assert NOTHING == Allocation()
