"""KubernetesHandler over a fake AgentApi (the real admission core, tests/nri/fake_api.py):
what each of the runtime's calls books, releases and answers."""

from __future__ import annotations

import logging

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.nri import kubernetes as k8s
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri.handler import KubernetesHandler
from numa_agent.nri.plugin import NriRefusal
from tests.nri.fake_api import FakeApi, container, create, make_machine, resources, sandbox

GIB = 1 << 30


@pytest.fixture
def fake():
    return FakeApi()


@pytest.fixture
def handler(fake, monkeypatch):
    return KubernetesHandler(fake, clock=lambda: 1000.0)


def guaranteed(n, cpus=2, memory=GIB, pod=None, **kw):
    pod = pod or sandbox(n, **kw)
    return pod, container(n, pod, resources(cpus=cpus, memory=memory))


def besteffort(n):
    pod = sandbox(n, "besteffort")
    return pod, container(n, pod)


def cores(fake, cpus: CpuSet) -> set[int]:
    core_of = {cpu: core for core, members in fake.machine.cpu_topology.core_cpus.items() for cpu in members}
    return {core_of[c] for c in cpus}


def pool(fake) -> CpuSet:
    return fake.machine.usable_cpus - fake.state.exclusive_cpus()


def test_two_guaranteed_containers_get_two_distinct_whole_cores(handler, fake):
    a = handler.create_container(create(*guaranteed(1)))
    b = handler.create_container(create(*guaranteed(2)))
    cpus_a, cpus_b = (CpuSet.parse(r.adjust.linux.resources.cpu.cpus) for r in (a, b))
    assert len(cpus_a) == len(cpus_b) == 2 and cpus_a.isdisjoint(cpus_b)
    assert len(cores(fake, cpus_a)) == len(cores(fake, cpus_b)) == 1 and cores(fake, cpus_a) != cores(fake, cpus_b)
    assert a.adjust.linux.resources.cpu.mems in ("0", "1")  # that core's memory node
    w = fake.state.workload(k8s.workload_name(container(1, sandbox(1)).id))
    assert w.booking.memory_total("memory") == GIB
    ref = w.runtime
    assert (ref.runtime, ref.container_id, ref.sandbox_id, ref.namespace, ref.pod, ref.container) == \
        ("nri", container(1, sandbox(1)).id, sandbox(1).id, "default", "pod1", "app")
    assert w.request["request_id"] == container(1, sandbox(1)).id


def test_a_besteffort_container_gets_the_pool_without_the_exclusive_cpus(handler, fake):
    exclusive = CpuSet.parse(handler.create_container(create(*guaranteed(1))).adjust.linux.resources.cpu.cpus)
    shared = handler.create_container(create(*besteffort(2)))
    cpus = CpuSet.parse(shared.adjust.linux.resources.cpu.cpus)
    assert cpus == pool(fake) and cpus.isdisjoint(exclusive) and len(cpus) == 16 - 2
    assert shared.adjust.linux.resources.cpu.mems == ""  # left as the runtime has it
    assert shared.update == [] and fake.names("admit") and len(fake.names("admit")) == 1  # shared: not booked


def test_a_change_of_the_pool_updates_every_shared_container_in_the_same_answer(handler, fake):
    handler.create_container(create(*besteffort(1)))
    handler.create_container(create(*besteffort(2)))  # the same pool: no update
    answer = handler.create_container(create(*guaranteed(3)))
    assert sorted(u.container_id for u in answer.update) == sorted([container(1, sandbox(1)).id,
                                                                    container(2, sandbox(2)).id])
    assert {u.linux.resources.cpu.cpus for u in answer.update} == {pool(fake).format()}
    assert all(u.ignore_failure for u in answer.update)
    assert handler.create_container(create(*besteffort(4))).update == []  # pool unchanged since


def test_a_refusal_fails_the_creation_in_the_kubelets_words(fake, monkeypatch):
    fake.machine = make_machine(policy="single-numa-node")
    handler = KubernetesHandler(fake)
    with pytest.raises(NriRefusal) as refused:
        handler.create_container(create(*guaranteed(1, cpus=10)))  # a node has 8 CPUs
    line = str(refused.value)
    assert line.startswith("TopologyAffinityError: numa-agent refused container app of pod default/pod1 (ctr-")
    assert "[topology_affinity_error]" in line and "\n" not in line
    assert fake.state.workloads == ()


def test_a_bad_annotation_refuses_the_container_with_the_hooks_line(handler, fake):
    pod = sandbox(1, annotations={"numa-agent.io/policy": "nearest"})
    with pytest.raises(NriRefusal, match=r"^UnexpectedAdmissionError: .*annotation numa-agent.io/policy="):
        handler.create_container(create(pod, container(1, pod, resources(cpus=2, memory=GIB))))
    assert fake.calls == []


def test_exclusive_cpus_asked_by_annotation_of_a_burstable_pod_refuse_it(handler, fake):
    pod = sandbox(1, "burstable", annotations={"numa-agent.io/cpus": "2"})
    with pytest.raises(NriRefusal, match="^UnexpectedAdmissionError: .*asks for exclusive CPUs.*Burstable"):
        handler.create_container(create(pod, container(1, pod, resources(cpus=2, shares=512))))


def test_placement_annotations_place_an_exclusive_container(handler, fake):
    pod = sandbox(1, annotations={"numa-agent.io/membind": "1", "numa-agent.io/policy": "single-numa-node"})
    answer = handler.create_container(create(pod, container(1, pod, resources(cpus=2, memory=GIB))))
    assert answer.adjust.linux.resources.cpu.mems == "1"
    assert CpuSet.parse(answer.adjust.linux.resources.cpu.cpus).issubset(fake.machine.cpus_of_nodes((1,)))
    assert (fake.names("admit")[0].membind, fake.names("admit")[0].policy) == ([1], "single-numa-node")


def test_ignored_annotations_are_said_in_a_log_line(handler, caplog):
    pod = sandbox(1, "besteffort", annotations={"numa-agent.io/memory": "1Gi"})
    with caplog.at_level(logging.INFO, "numa_agent.nri"):
        handler.create_container(create(pod, container(1, pod)))
    assert "ignored annotations: numa-agent.io/memory" in caplog.text


def test_a_retried_creation_books_once(handler, fake):
    first = handler.create_container(create(*guaranteed(1)))
    again = handler.create_container(create(*guaranteed(1)))
    assert again.adjust == first.adjust and len(fake.state.workloads) == 1


def test_an_in_place_resize_of_an_exclusive_container_is_a_resize(handler, fake):
    pod, ctr = guaranteed(1)
    handler.create_container(create(pod, ctr))
    handler.create_container(create(*besteffort(2)))
    answer = handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr,
                                                                 linux_resources=resources(cpus=4, memory=2 * GIB)))
    assert fake.names("resize") == [(k8s.workload_name(ctr.id), 4, 2 * GIB)]
    own, *followers = answer.update
    assert own.container_id == ctr.id and len(CpuSet.parse(own.linux.resources.cpu.cpus)) == 4
    assert [u.container_id for u in followers] == [container(2, sandbox(2)).id]
    # the same size again: nothing to resize
    same = handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr,
                                                               linux_resources=resources(cpus=4, memory=2 * GIB)))
    assert same.update == [] and len(fake.names("resize")) == 1


def test_a_resize_off_whole_cpus_is_refused(handler, fake):
    pod, ctr = guaranteed(1)
    handler.create_container(create(pod, ctr))
    with pytest.raises(NriRefusal, match="^UnexpectedAdmissionError: .*fractional CPU limit"):
        handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr,
                                                            linux_resources=resources(cpus=1.5, memory=GIB)))
    assert len(fake.state.workloads) == 1 and fake.names("resize") == []


def test_a_shared_containers_update_follows_the_pool(handler, fake):
    pod, ctr = besteffort(1)
    handler.create_container(create(pod, ctr))
    answer = handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr,
                                                                 linux_resources=resources(cpus=1, shares=512)))
    assert answer.update == [] and fake.names("resize") == [] and fake.names("admit") == []


def test_stop_releases_and_hands_the_cpus_to_the_shared_containers(handler, fake):
    pod, ctr = guaranteed(1)
    handler.create_container(create(pod, ctr))
    handler.create_container(create(*besteffort(2)))
    answer = handler.stop_container(api.StopContainerRequest(pod=pod, container=ctr))
    assert fake.state.workloads == () and fake.names("release") == [k8s.workload_name(ctr.id)]
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in answer.update] == \
        [(container(2, sandbox(2)).id, fake.machine.usable_cpus.format())]
    # again, and the removal after it: nothing more to release, no error
    assert handler.stop_container(api.StopContainerRequest(pod=pod, container=ctr)).update == []
    handler.state_change(api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=pod, container=ctr))
    assert fake.names("release") == [k8s.workload_name(ctr.id)]


def test_events_for_containers_never_placed_release_nothing(handler, fake, caplog):
    pod, ctr = guaranteed(1)
    handler.create_container(create(pod, ctr))
    # Another container whose id begins with the same 12 hex: the same name, not its booking.
    other = container(1, pod, resources(cpus=2, memory=GIB))
    other.id = ctr.id[:12] + "f" * 52
    with caplog.at_level(logging.INFO, "numa_agent.nri"):
        handler.stop_container(api.StopContainerRequest(pod=pod, container=other))
        handler.state_change(api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=pod, container=other))
        answer = handler.update_container(api.UpdateContainerRequest(pod=pod, container=other,
                                                                     linux_resources=resources(cpus=4)))
    assert len(fake.state.workloads) == 1 and fake.names("release") == [] and fake.names("resize") == []
    assert answer.update == []
    assert "holds nothing of numa-agent's" in caplog.text and "neither booked nor placed" in caplog.text


def test_removing_a_pod_sandbox_releases_what_its_containers_hold(handler, fake):
    pod = sandbox(1)
    for n in (1, 2):
        handler.create_container(create(pod, container(n, pod, resources(cpus=2, memory=GIB), name=f"c{n}")))
    handler.create_container(create(*guaranteed(3)))
    handler.state_change(api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=pod))
    assert [w.name for w in fake.state.workloads] == [k8s.workload_name(container(3, sandbox(3)).id)]


def test_pod_scope_books_the_pods_budget_at_its_first_exclusive_container(fake, monkeypatch):
    fake.machine = make_machine(scope="pod")
    handler = KubernetesHandler(fake)
    pod = sandbox(1, pod_resources=resources(cpus=4, memory=2 * GIB))
    for n in (1, 2):
        handler.create_container(create(pod, container(n, pod, resources(cpus=2, memory=GIB), name=f"c{n}")))
    first, second = fake.names("admit")
    assert first.pod == second.pod == k8s.pod_name(pod.id)
    assert first.pod_budget is not None and first.pod_budget.cpus == 4 and second.pod_budget is None
    assert [p.name for p in fake.state.pods] == [k8s.pod_name(pod.id)]
    # without the pod's totals: container scope
    other = sandbox(2)
    handler.create_container(create(other, container(3, other, resources(cpus=2, memory=GIB))))
    assert fake.names("admit")[2].pod is None


def test_synchronize_keeps_what_runs_releases_what_is_gone_and_books_what_was_missed(handler, fake):
    kept_pod, kept = guaranteed(1)
    gone_pod, gone = guaranteed(2)
    stopped_pod, stopped = guaranteed(3)
    kept_cpus = handler.create_container(create(kept_pod, kept)).adjust.linux.resources.cpu.cpus
    for pod, ctr in ((gone_pod, gone), (stopped_pod, stopped)):
        handler.create_container(create(pod, ctr))
    fake.calls.clear()
    restarted = KubernetesHandler(fake)  # the agent restarted: the handler knows nothing
    missed_pod, missed = guaranteed(4)
    shared_pod, shared = besteffort(5)
    stopped.state = api.CONTAINER_STOPPED
    kept.linux.resources.cpu.cpus = kept_cpus
    updates = restarted.synchronize([kept_pod, stopped_pod, missed_pod, shared_pod],
                                    [kept, stopped, missed, shared])
    assert sorted(fake.names("release")) == sorted(k8s.workload_name(c.id) for c in (gone, stopped))
    assert [r.name for r in fake.names("admit")] == [k8s.workload_name(missed.id)]
    assert sorted(w.name for w in fake.state.workloads) == sorted(k8s.workload_name(c.id) for c in (kept, missed))
    by_id = {u.container_id: u.linux.resources.cpu.cpus for u in updates}
    assert kept.id not in by_id  # its cpuset is its booking already
    assert by_id[missed.id] == fake.state.workload(k8s.workload_name(missed.id)).booking.cpus.format()
    assert by_id[shared.id] == pool(fake).format()
    # again: nothing booked twice, nothing released
    fake.calls.clear()
    restarted.synchronize([kept_pod, missed_pod, shared_pod], [kept, missed, shared])
    assert fake.calls == []


def test_a_container_missed_that_cannot_be_booked_stays_on_the_pool(handler, fake, caplog):
    big_pod, big = guaranteed(1, cpus=64)
    with caplog.at_level(logging.WARNING, "numa_agent.nri"):
        updates = handler.synchronize([big_pod], [big])
    assert fake.state.workloads == ()
    assert [u.container_id for u in updates] == [big.id]
    assert "stays on the shared pool" in caplog.text


def test_an_agent_without_state_refuses_in_one_line(handler, fake):
    fake.ready = False
    with pytest.raises(NriRefusal, match="^UnexpectedAdmissionError: numa-agent is starting"):
        handler.create_container(create(*besteffort(1)))


def test_a_resize_compares_with_what_was_asked_not_what_the_memory_policy_booked(fake, monkeypatch):
    fake.machine = make_machine(memory_policy="none")
    handler = KubernetesHandler(fake)
    pod, ctr = guaranteed(1)
    handler.create_container(create(pod, ctr))
    assert fake.state.workloads[0].booking.memory_total("memory") == 0  # memory not booked under "none"
    handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=resources(
        cpus=2, memory=GIB)))
    handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=resources(cpus=2)))
    assert fake.names("resize") == []  # the same limit, then none: nothing to resize


def test_an_update_that_says_nothing_of_cpus_keeps_them(handler, fake):
    pod, ctr = guaranteed(1)
    handler.create_container(create(pod, ctr))
    handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=api.LinuxResources()))
    memory_only = api.LinuxResources()
    memory_only.memory.limit.value = 2 * GIB
    handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=memory_only))
    assert fake.names("resize") == [(k8s.workload_name(ctr.id), None, 2 * GIB)]
