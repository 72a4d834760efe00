"""A PodResources server for the connection tests (tests/kubelet/test_grpc_*), and
the one question they ask of it: does a List get an answer? Also the whole List
answer built at once, which the tests compare the kept parts against."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Iterator

import grpc

from numa_agent.kubelet import grpc_server
from numa_agent.kubelet import podresources_pb2 as pb
from numa_agent.kubelet import podresources_pb2_grpc as pb_grpc
from numa_agent.kubelet.pod_resources import container, pod
from numa_agent.kubelet.state_files import pod_of
from numa_agent.state.runtime_pods import kubernetes_pod

PATIENCE = 30.0  # how long a List may take to be answered: a bound, not a measure


class Starting:
    def view(self):
        return None  # answered UNAVAILABLE "the agent is starting": an answer all the same


@contextlib.contextmanager
def running_server(*, dir_mode: int | None = None, **options: Any) -> Iterator[grpc_server.PodResourcesServer]:
    """A started server on `pr.sock` in a fresh directory under /tmp (a socket's path
    is short); `dir_mode` lets other users reach it. Stopped and removed after."""
    where = tempfile.mkdtemp(prefix="na-pr-", dir="/tmp")
    if dir_mode is not None:
        os.chmod(where, dir_mode)
    srv = grpc_server.PodResourcesServer(os.path.join(where, "pr.sock"), **options).bind()
    srv.attach(Starting())
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(where)


def answers(path: str) -> bool:
    """A List on `path` is answered (within PATIENCE)."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        try:
            pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=PATIENCE)
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.UNAVAILABLE and exc.details() == "the agent is starting"
    return False


def list_response(machine, state, namespace: str) -> pb.ListPodResourcesResponse:
    """The List answer of `state`, every pod encoded afresh; the Kubernetes pods
    of runtime-enforced containers (NRI) grouped by a scan, not by the index."""
    pods: dict[str, None] = {}
    kubernetes: dict[tuple[str, str], list] = {}
    for w in state.workloads:
        found = kubernetes_pod(w)
        if found is None:
            pods.setdefault(pod_of(w), None)
        else:
            kubernetes.setdefault(found, []).append(w)
    out = []
    for name in pods:
        p = pod(machine, state, name, namespace)
        if p is not None:
            out.append(p)
    for (ns, name), members in kubernetes.items():
        out.append(pb.PodResources(name=name, namespace=ns,
                                   containers=[container(machine, state, w) for w in members]))
    return pb.ListPodResourcesResponse(pod_resources=out)
