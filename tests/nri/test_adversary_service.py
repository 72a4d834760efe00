"""KubernetesHandler over the real service (an agent on a simulated machine, as
the daemon starts it): a power cut between the checkpoint and the answer, and
a local user reaching for the runtime's bookings through the service."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from numa_agent.core.caller import Caller
from numa_agent.nri import kubernetes as k8s
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri.handler import KubernetesHandler
from numa_agent.service.refusals import NotPermitted, RequestIdTaken
from numa_agent.service.requests import AdmitRequest
from tests.nri.fake_api import container, create, resources, sandbox
from tests.service.test_engine_cgroup import CONTAINER, Machine

GIB = 1 << 30


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    m.agent.stop()
    m.cfg = replace(m.cfg, policy=replace(m.cfg.policy, topology_scope="pod"))
    m.agent = type(m.agent)(m.cfg).start()
    yield m
    m.close()


def test_a_creation_retried_after_the_agent_restarted_replays_its_booking(machine):
    pod = sandbox(1, pod_resources=resources(cpus=4, memory=2 * GIB))
    ctr = container(1, pod, resources(cpus=2, memory=GIB))
    first = KubernetesHandler(machine.service).create_container(create(pod, ctr))
    machine.restart()  # checkpointed, then down before the answer reached the runtime
    again = KubernetesHandler(machine.service).create_container(create(pod, ctr))
    assert again.adjust.linux.resources.cpu == first.adjust.linux.resources.cpu
    state = machine.service.state
    assert [w.name for w in state.workloads] == [k8s.workload_name(ctr.id)]
    assert [p.name for p in state.pods] == [k8s.pod_name(pod.id)]


def test_a_local_user_can_neither_replay_nor_release_nor_resize_a_runtime_booking(machine):
    pod = sandbox(1)
    ctr = container(1, pod, resources(cpus=2, memory=GIB))
    KubernetesHandler(machine.service).create_container(create(pod, ctr))
    name, user = k8s.workload_name(ctr.id), Caller(pid=os.getpid(), uid=1000, gid=1000)
    with pytest.raises(RequestIdTaken):  # the container's id is its request id: not the user's to replay
        machine.service.admit(AdmitRequest(name="mine", cpus=2, request_id=k8s.request_id(ctr.id)), user)
    with pytest.raises(NotPermitted):
        machine.service.release(name, user, request_id=k8s.request_id(ctr.id))
    with pytest.raises(NotPermitted):
        machine.service.release(name, user)
    with pytest.raises(NotPermitted):
        machine.service.resize(name, user, cpus=4)
    with pytest.raises(NotPermitted):  # nor book one of their own
        machine.service.admit(AdmitRequest(name="mine", cpus=2, runtime={"runtime": "nri", "container_id": "x",
                                                                           "sandbox_id": "y"}), user)
    assert [w.name for w in machine.service.state.workloads] == [name]


def test_the_runtime_cannot_release_a_podman_containers_booking_of_the_same_name(machine):
    machine.container()
    podman_id = "0123456789ab" + "cd" * 26
    machine.service.admit(AdmitRequest(name="ctr-0123456789ab", cpus=2, cgroup=CONTAINER,
                                       request_id=podman_id), Caller(pid=os.getpid(), uid=0, gid=0))
    handler = KubernetesHandler(machine.service)
    pod = sandbox(1)
    for cid in (podman_id, "0123456789ab" + "ef" * 26):  # its very id, and one of the same 12 hex
        ctr = container(1, pod, resources(cpus=2, memory=GIB))
        ctr.id = cid
        handler.stop_container(api.StopContainerRequest(pod=pod, container=ctr))
        handler.state_change(api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=pod, container=ctr))
        handler.update_container(api.UpdateContainerRequest(pod=pod, container=ctr,
                                                            linux_resources=resources(cpus=4, memory=GIB)))
        handler.state_change(api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=pod))
        handler.synchronize([pod], [])  # the runtime has no container at all
    w = machine.service.state.workload("ctr-0123456789ab")
    assert w is not None and w.runtime is None and len(w.booking.cpus) == 2
