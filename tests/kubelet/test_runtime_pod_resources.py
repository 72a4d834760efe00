"""PodResources reports a container its runtime enforces (NRI) as Kubernetes
knows it: under its namespace and pod name, by its container name, several
containers of one pod in one PodResources pod; the List answer kept per pod
still equals the one built afresh as such containers come and go."""

from __future__ import annotations

import random

from numa_agent.admission.admit import InvalidRequest, Refusal, decide, release
from numa_agent.admission.request import Request, Resources
from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet.grpc_server import PodResourcesServer
from numa_agent.kubelet.pod_resources import ListEncoder, runtime_pod
from numa_agent.state.model import AgentState, RuntimeRef, replace
from tests.kubelet.test_state_files import machine
from tests.support.pod_resources import list_response


def ref(ns: str, pod: str, container: str) -> RuntimeRef:
    return RuntimeRef(runtime="nri", container_id=f"id-{ns}-{pod}-{container}", sandbox_id=f"sb-{pod}",
                      namespace=ns, pod=pod, pod_uid=f"uid-{pod}", container=container)


def runtime_admitted(m, state: AgentState, name: str, r: RuntimeRef, cpus: int = 1) -> AgentState:
    decision = decide(m, state, Request(name=name, owner_uid=0, resources=Resources(cpus=cpus)))
    return decision.state.with_workload(replace(decision.workload, runtime=r, pid=None))


def test_containers_of_one_kubernetes_pod_are_one_pod_under_its_namespace():
    m = machine()
    state = AgentState(policy_fingerprint=m.policy.fingerprint())
    state = runtime_admitted(m, state, "ctr-1", ref("prod", "web-0", "app"), cpus=2)
    state = runtime_admitted(m, state, "ctr-2", ref("prod", "web-0", "sidecar"))
    state = runtime_admitted(m, state, "ctr-3", ref("dev", "web-0", "app"))
    state = decide(m, state, Request(name="plain", owner_uid=0, resources=Resources(cpus=1))).state
    listed = pb.ListPodResourcesResponse.FromString(ListEncoder("node-tools").update(m, state))
    pods = {(p.namespace, p.name): p for p in listed.pod_resources}
    assert sorted(pods) == [("dev", "web-0"), ("node-tools", "plain"), ("prod", "web-0")]
    web = pods[("prod", "web-0")]
    assert [c.name for c in web.containers] == ["app", "sidecar"]
    assert [len(c.cpu_ids) for c in web.containers] == [2, 1]
    assert [c.name for c in pods[("node-tools", "plain")].containers] == ["plain"]
    server = PodResourcesServer("/nonexistent/pr.sock", "node-tools")
    got = pb.GetPodResourcesResponse.FromString(
        server._get((m, state), pb.GetPodResourcesRequest(pod_name="web-0", pod_namespace="prod")))
    assert got.pod_resources == web
    assert runtime_pod(m, state, "node-tools", "web-0") is None


def test_kept_list_answer_follows_runtime_containers_exactly():
    m = machine()
    rng = random.Random(11)
    state = AgentState(policy_fingerprint=m.policy.fingerprint())
    listed = ListEncoder("ns")
    live: list[str] = []
    for step in range(150):
        name = f"w{step}"
        try:
            if live and rng.random() < 0.4:
                state = release(state, live.pop(rng.randrange(len(live))))[0]
            elif rng.random() < 0.7:
                r = ref(rng.choice(["a", "b"]), f"kp{rng.randrange(3)}", f"c{step}")
                state = runtime_admitted(m, state, name, r, cpus=rng.choice((1, 2)))
                live.append(name)
            else:
                state = decide(m, state, Request(name=name, owner_uid=0, resources=Resources(cpus=1))).state
                live.append(name)
        except (Refusal, InvalidRequest):
            pass
        kept = pb.ListPodResourcesResponse.FromString(listed.update(m, state))
        key = lambda p: (p.namespace, p.name)  # noqa: E731
        assert sorted(kept.pod_resources, key=key) == \
            sorted(list_response(m, state, "ns").pod_resources, key=key), step


def test_the_runtime_index_follows_each_change_as_a_fresh_one_reads():
    """Both groupings (by Kubernetes pod, by sandbox) kept through admissions and
    releases equal the ones built afresh from the state's workloads."""
    from numa_agent.core.layered import Layered
    from numa_agent.state.runtime_pods import RuntimePods, runtime_pods

    m = machine()
    rng = random.Random(5)
    state = AgentState(policy_fingerprint=m.policy.fingerprint())
    live: list[str] = []
    runtime_pods(state)
    for step in range(120):
        try:
            if live and rng.random() < 0.4:
                state = release(state, live.pop(rng.randrange(len(live))))[0]
            else:
                r = ref(rng.choice(["a", "b"]), f"kp{rng.randrange(3)}", f"c{step}")
                state = runtime_admitted(m, state, f"w{step}", r)
                live.append(f"w{step}")
        except (Refusal, InvalidRequest):
            pass
        kept = runtime_pods(state)
        fresh = RuntimePods(Layered(), Layered()).after_workloads((), state.workloads)
        assert dict(kept.pods.items()) == dict(fresh.pods.items()), step
        assert dict(kept.sandboxes.items()) == dict(fresh.sandboxes.items()), step
    assert any(kept.sandboxes.items())
