"""KubernetesHandler against a runtime that lies or collides: ids sharing their
first 12 hex digits, pods whose budgets are another's, events for containers
booked elsewhere. Over the fake AgentApi (tests/nri/fake_api.py), whose
admission core is the real one."""

from __future__ import annotations

import pytest

from numa_agent.nri import kubernetes as k8s
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri.handler import KubernetesHandler
from numa_agent.nri.plugin import NriRefusal
from tests.nri.fake_api import FakeApi, container, create, make_machine, resources, sandbox

GIB = 1 << 30


def colliding(pod: api.PodSandbox, n: int) -> api.PodSandbox:
    """A pod whose id shares `pod`'s first 12 hex digits (so its `sbx-` name)."""
    other = sandbox(n, pod_resources=pod.linux.pod_resources)
    other.id = pod.id[:12] + f"{n:02x}" * 26
    return other


def test_a_pod_whose_id_shares_another_pods_12_hex_never_takes_from_its_budget():
    fake = FakeApi(machine=make_machine(scope="pod"))
    handler = KubernetesHandler(fake)
    first = sandbox(1, pod_resources=resources(cpus=4, memory=2 * GIB))
    handler.create_container(create(first, container(1, first, resources(cpus=2, memory=GIB))))
    budget = fake.state.pod(k8s.pod_name(first.id))
    assert budget is not None and len(budget.booking.cpus) == 4

    second = colliding(first, 2)
    assert k8s.pod_name(second.id) == budget.name
    handler.create_container(create(second, container(2, second, resources(cpus=2, memory=GIB))))
    w = fake.state.workload(k8s.workload_name(container(2, second).id))
    assert w is not None and w.runtime is not None and w.runtime.sandbox_id == second.id
    # Booked, but not out of the first pod's budget: that one still has room for its own.
    assert w.pod != budget.name and not w.booking.cpus & budget.booking.cpus
    assert fake.state.members_of(budget.name)[0].runtime.sandbox_id == first.id
    assert len(fake.state.members_of(budget.name)) == 1
    handler.create_container(create(first, container(3, first, resources(cpus=2, memory=GIB), name="c3")))
    assert len(fake.state.members_of(budget.name)) == 2

    # The second pod's removal releases its own container only, not the first pod's.
    handler.state_change(api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=second))
    assert fake.state.workload(k8s.workload_name(container(2, second).id)) is None
    assert len(fake.state.members_of(budget.name)) == 2


def _updated(response) -> set[str]:
    return {u.container_id for u in response.update}


def test_a_container_created_again_the_same_way_gets_the_same_booking():
    fake = FakeApi()
    handler = KubernetesHandler(fake)
    pod = sandbox(1)
    ctr = container(1, pod, resources(cpus=2, memory=GIB))
    first = handler.create_container(create(pod, ctr)).adjust.linux.resources.cpu.cpus
    again = handler.create_container(create(pod, ctr)).adjust.linux.resources.cpu.cpus
    assert first == again and len(fake.state.workloads) == 1


@pytest.mark.parametrize("exclusive_first", [True, False])
def test_a_container_created_again_as_another_kind_is_refused_and_keeps_what_it_had(exclusive_first):
    fake = FakeApi()
    handler = KubernetesHandler(fake)
    guaranteed, shared = sandbox(1), sandbox(2, "besteffort")
    as_exclusive = container(1, guaranteed, resources(cpus=2, memory=GIB))
    as_shared = container(1, shared)  # the same container id
    first, second = (guaranteed, as_exclusive), (shared, as_shared)
    if not exclusive_first:
        first, second = second, first
    handler.create_container(create(*first))
    booked = [(w.name, w.booking.cpus) for w in fake.state.workloads]
    with pytest.raises(NriRefusal, match="already"):
        handler.create_container(create(*second))
    assert [(w.name, w.booking.cpus) for w in fake.state.workloads] == booked
    # A change of the pool updates the shared containers: this one only if it was created shared.
    other = sandbox(3)
    grown = handler.create_container(create(other, container(3, other, resources(cpus=2, memory=GIB))))
    assert (as_exclusive.id in _updated(grown)) == (not exclusive_first)


def test_a_resize_whose_answer_was_lost_gives_the_booked_cpus_when_retried():
    fake = FakeApi()
    handler = KubernetesHandler(fake)
    pod = sandbox(1)
    ctr = container(1, pod, resources(cpus=2, memory=GIB))
    ctr.linux.resources.cpu.cpus = handler.create_container(create(pod, ctr)).adjust.linux.resources.cpu.cpus
    grow = api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=resources(cpus=4, memory=GIB))
    handler.update_container(grow)  # resized; the answer is lost (too late, or the runtime restarted)
    booked = fake.state.workload(k8s.workload_name(ctr.id)).booking.cpus
    assert len(booked) == 4
    # The kubelet retries: the container still has its 2 CPUs, the booking its 4.
    retried = handler.update_container(grow)
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in retried.update] == [(ctr.id, booked.format())]
    assert len(fake.names("resize")) == 1


def test_a_container_whose_id_shares_another_bookings_12_hex_is_refused_saying_so():
    fake = FakeApi()
    handler = KubernetesHandler(fake)
    pod = sandbox(1)
    first = container(1, pod, resources(cpus=2, memory=GIB))
    handler.create_container(create(pod, first))
    second = container(2, pod, resources(cpus=2, memory=GIB), name="other")
    second.id = first.id[:12] + "ee" * 26
    with pytest.raises(NriRefusal) as refused:
        handler.create_container(create(pod, second))
    line = str(refused.value)
    assert "first 12 hex digits" in line and "--name" not in line and "\n" not in line
    assert [w.runtime.container_id for w in fake.state.workloads] == [first.id]
    # Its stop or removal releases nothing of the other's.
    handler.stop_container(api.StopContainerRequest(pod=pod, container=second))
    handler.state_change(api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=pod, container=second))
    assert [w.runtime.container_id for w in fake.state.workloads] == [first.id]


def test_after_a_lost_answer_the_next_one_gives_the_pool_to_every_shared_container():
    fake = FakeApi()
    handler = KubernetesHandler(fake)
    shared = sandbox(1, "besteffort")
    follower = container(1, shared)
    handler.create_container(create(shared, follower))
    pod = sandbox(2)
    ctr = container(2, pod, resources(cpus=2, memory=GIB))
    handler.create_container(create(pod, ctr))
    # A resize that shrinks the pool; its answer (with the follower's update) never reaches the runtime.
    handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr,
                                                        linux_resources=resources(cpus=4, memory=GIB)))
    handler.answer_lost("UpdateContainer")
    other = sandbox(3, "besteffort")
    answer = handler.create_container(create(other, container(3, other)))
    assert follower.id in _updated(answer)


def test_a_synchronize_listing_a_container_twice_books_it_once_and_updates_it_once():
    fake = FakeApi()
    handler = KubernetesHandler(fake)
    pod, shared = sandbox(1), sandbox(2, "besteffort")
    exclusive = container(1, pod, resources(cpus=2, memory=GIB))
    follower = container(2, shared)
    updates = handler.synchronize([pod, shared, pod], [exclusive, follower, exclusive, follower])
    assert [w.runtime.container_id for w in fake.state.workloads] == [exclusive.id]
    assert sorted(u.container_id for u in updates) == sorted([exclusive.id, follower.id])


def test_a_shared_container_whose_pod_is_named_only_by_its_own_field_may_be_created_again():
    handler = KubernetesHandler(FakeApi())
    pod = sandbox(1, "besteffort")
    ctr = container(1, pod)
    anonymous = api.PodSandbox()
    anonymous.CopyFrom(pod)
    anonymous.id = ""  # the runtime gave the pod without its id; the container names it
    first = handler.create_container(create(anonymous, ctr))
    again = handler.create_container(create(anonymous, ctr))
    assert again.adjust == first.adjust
