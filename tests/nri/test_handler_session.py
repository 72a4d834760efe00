"""The Kubernetes handler behind a plugin session, driven by the fake runtime over
its socket: once with the fake AgentApi, once with the real AgentService on a
simulated machine and cgroup tree."""

from __future__ import annotations

import socket
import threading

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.nri import kubernetes as k8s
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri import plugin
from numa_agent.nri.handler import KubernetesHandler
from tests.nri.fake_api import FakeApi, container, create, make_machine, resources, sandbox
from tests.nri.fake_runtime import FakeRuntime
from tests.support.simulated_service import start

GIB = 1 << 30


def fake_api(tmp_path, monkeypatch):
    return FakeApi()


def real_service(tmp_path, monkeypatch):
    machine = make_machine()
    root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    return start(machine, tmp_path / "state", root)[0]


@pytest.fixture(params=[
    fake_api,
    real_service,
], ids=["fake-api", "agent-service"])
def agent(request, tmp_path, monkeypatch):
    return request.param(tmp_path, monkeypatch)


@pytest.fixture
def runtime(tmp_path, agent):
    rt = FakeRuntime(str(tmp_path / "nri.sock"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(rt.path)
    session = plugin.PluginSession(sock, KubernetesHandler(agent), "numa-agent", "10")
    thread = threading.Thread(target=session.run, daemon=True)
    thread.start()
    rt.accept()
    rt.expect_register()
    yield rt
    rt.close()
    thread.join(10)


def _call(rt, method, message, answer_type):
    code, text, answer = rt.call(method, message, answer_type)
    assert code == 0, text
    return answer


def test_guaranteed_containers_get_whole_cores_besteffort_the_rest_stop_releases(runtime, agent):
    machine, _ = agent.view()
    core_of = {cpu: core for core, cpus in machine.cpu_topology.core_cpus.items() for cpu in cpus}
    pods = [sandbox(1), sandbox(2), sandbox(3, "besteffort")]
    ctrs = [container(1, pods[0], resources(cpus=2, memory=GIB)), container(2, pods[1], resources(cpus=2, memory=GIB)),
            container(3, pods[2])]
    _call(runtime, "Synchronize", api.SynchronizeRequest(pods=[], containers=[]), api.SynchronizeResponse)

    exclusive = []
    for pod, ctr in zip(pods[:2], ctrs[:2], strict=True):
        answer = _call(runtime, "CreateContainer", create(pod, ctr), api.CreateContainerResponse)
        exclusive.append(CpuSet.parse(answer.adjust.linux.resources.cpu.cpus))
    assert [len(c) for c in exclusive] == [2, 2] and exclusive[0].isdisjoint(exclusive[1])
    assert [len({core_of[c] for c in cpus}) for cpus in exclusive] == [1, 1]

    shared = _call(runtime, "CreateContainer", create(pods[2], ctrs[2]), api.CreateContainerResponse)
    pool = CpuSet.parse(shared.adjust.linux.resources.cpu.cpus)
    assert pool == machine.usable_cpus - exclusive[0] - exclusive[1]

    stopped = _call(runtime, "StopContainer", api.StopContainerRequest(pod=pods[0], container=ctrs[0]),
                    api.StopContainerResponse)
    assert [(u.container_id, CpuSet.parse(u.linux.resources.cpu.cpus)) for u in stopped.update] == \
        [(ctrs[2].id, pool | exclusive[0])]
    _, state = agent.view()
    assert [w.name for w in state.workloads] == [k8s.workload_name(ctrs[1].id)]


def test_a_refused_container_fails_with_the_kubelets_reason_over_the_wire(runtime, agent):
    _call(runtime, "Synchronize", api.SynchronizeRequest(), api.SynchronizeResponse)
    pod = sandbox(1)
    code, text, _ = runtime.call("CreateContainer", create(pod, container(1, pod, resources(cpus=64, memory=GIB))),
                                 api.CreateContainerResponse)
    assert code != 0 and text.startswith("UnexpectedAdmissionError: numa-agent refused container app of pod "
                                         "default/pod1") and "[insufficient_cpus]" in text
