"""Drive a CRI runtime the way the kubelet does, for one-container pods.

What the kubelet sends (its kuberuntime and QoS cgroup code, cgroupfs driver) and what is
kept here:
- a pod's cgroup parent is `/kubepods/pod<uid>` when it is Guaranteed and
  `/kubepods/besteffort/pod<uid>` when it is BestEffort;
- a container's Linux resources carry its CPU limit as a CFS quota over a 100 ms period,
  its CPU request as shares (1024 per CPU, at least 2) and its memory limit; a Guaranteed
  container's oom_score_adj is -997, a BestEffort one's 1000;
- the sandbox's resources are the sum of its containers' (one container here);
- a host-network pod has an empty hostname (its UTS namespace is the node's) and each
  container a PID namespace of its own;
- pods and containers carry the `io.kubernetes.*` labels that name them.
An in-place resize is UpdateContainerResources with the new quota, shares and limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import grpc

from tests.vm_e2e.cri import cri_api_pb2 as cri
from tests.vm_e2e.cri import cri_api_pb2_grpc as cri_grpc

CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CPU_PERIOD = 100_000  # µs: the kubelet's CFS period
MIN_SHARES = 2
OOM_GUARANTEED = -997
OOM_BESTEFFORT = 1000
CALL_TIMEOUT = 300.0  # s per call: the runtime is slow under emulation


@dataclass(frozen=True)
class Pod:
    """A pod of one container, as far as the runtime sees it. Guaranteed when it asks for
    whole CPUs and memory (requests equal limits), BestEffort when it asks for nothing."""

    name: str
    uid: str
    namespace: str = "default"
    container: str = "main"
    cpus: int = 0
    memory: int = 0  # bytes
    annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.cpus) != bool(self.memory) or self.cpus < 0 or self.memory < 0:
            raise ValueError(f"pod {self.name}: give CPUs and memory (Guaranteed) or neither (BestEffort)")

    @property
    def guaranteed(self) -> bool:
        return self.cpus > 0

    @property
    def cgroup_parent(self) -> str:
        return f"/kubepods/pod{self.uid}" if self.guaranteed else f"/kubepods/besteffort/pod{self.uid}"


def resources(cpus: int, memory: int) -> cri.LinuxContainerResources:
    """A container's Linux resources for `cpus` whole CPUs and `memory` bytes (0, 0: BestEffort)."""
    if not cpus:
        return cri.LinuxContainerResources(cpu_shares=MIN_SHARES, oom_score_adj=OOM_BESTEFFORT)
    return cri.LinuxContainerResources(cpu_period=CPU_PERIOD, cpu_quota=cpus * CPU_PERIOD,
                                       cpu_shares=max(MIN_SHARES, cpus * 1024),
                                       memory_limit_in_bytes=memory, oom_score_adj=OOM_GUARANTEED)


def _host_namespaces() -> cri.NamespaceOption:
    return cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)


def _pod_labels(pod: Pod) -> dict[str, str]:
    return {"io.kubernetes.pod.name": pod.name, "io.kubernetes.pod.namespace": pod.namespace,
            "io.kubernetes.pod.uid": pod.uid}


def sandbox_config(pod: Pod, log_directory: str = "") -> cri.PodSandboxConfig:
    linux = cri.LinuxPodSandboxConfig(
        cgroup_parent=pod.cgroup_parent,
        security_context=cri.LinuxSandboxSecurityContext(namespace_options=_host_namespaces()),
        resources=resources(pod.cpus, pod.memory))
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace),
        hostname="",  # host network: runc refuses a hostname without a UTS namespace of its own
        log_directory=log_directory, labels=_pod_labels(pod), annotations=pod.annotations, linux=linux)


def container_config(pod: Pod, image: str, command: list[str]) -> cri.ContainerConfig:
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=pod.container),
        image=cri.ImageSpec(image=image), command=command,
        labels={**_pod_labels(pod), "io.kubernetes.container.name": pod.container},
        annotations=pod.annotations, log_path=f"{pod.container}.log",
        linux=cri.LinuxContainerConfig(
            resources=resources(pod.cpus, pod.memory),
            security_context=cri.LinuxContainerSecurityContext(namespace_options=_host_namespaces())))


@dataclass(frozen=True)
class Exec:
    exit_code: int
    stdout: str
    stderr: str


class Cri:
    """RuntimeService over the runtime's unix socket; every call may raise grpc.RpcError."""

    def __init__(self, socket_path: str = CONTAINERD_SOCKET, timeout: float = CALL_TIMEOUT) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def version(self) -> cri.VersionResponse:
        return self.runtime.Version(cri.VersionRequest(), timeout=self.timeout)

    def run_pod(self, pod: Pod, log_directory: str = "") -> str:
        answer = self.runtime.RunPodSandbox(
            cri.RunPodSandboxRequest(config=sandbox_config(pod, log_directory)), timeout=self.timeout)
        return answer.pod_sandbox_id

    def create_container(self, sandbox_id: str, pod: Pod, image: str, command: list[str],
                         log_directory: str = "") -> str:
        answer = self.runtime.CreateContainer(
            cri.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=container_config(pod, image, command),
                                       sandbox_config=sandbox_config(pod, log_directory)),
            timeout=self.timeout)
        return answer.container_id

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(cri.StartContainerRequest(container_id=container_id), timeout=self.timeout)

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 120) -> Exec:
        answer = self.runtime.ExecSync(cri.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout),
                                       timeout=self.timeout)
        return Exec(answer.exit_code, answer.stdout.decode(errors="replace"), answer.stderr.decode(errors="replace"))

    def update_resources(self, container_id: str, cpus: int, memory: int) -> None:
        self.runtime.UpdateContainerResources(
            cri.UpdateContainerResourcesRequest(container_id=container_id, linux=resources(cpus, memory)),
            timeout=self.timeout)

    def stop_container(self, container_id: str, grace: int = 10) -> None:
        self.runtime.StopContainer(cri.StopContainerRequest(container_id=container_id, timeout=grace),
                                   timeout=self.timeout)

    def remove_container(self, container_id: str) -> None:
        self.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=container_id), timeout=self.timeout)

    def stop_pod(self, sandbox_id: str) -> None:
        self.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout)

    def remove_pod(self, sandbox_id: str) -> None:
        self.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout)

    def pods(self) -> list[str]:
        answer = self.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=self.timeout)
        return [item.id for item in answer.items]

    def containers(self) -> dict[str, int]:
        """container id -> its state (cri.CONTAINER_RUNNING, ...)."""
        answer = self.runtime.ListContainers(cri.ListContainersRequest(), timeout=self.timeout)
        return {item.id: item.state for item in answer.containers}

    def container_pid(self, container_id: str) -> int:
        """The container's first process, from the runtime's verbose status (containerd's `info`)."""
        answer = self.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id, verbose=True),
                                              timeout=self.timeout)
        return int(json.loads(answer.info.get("info", "{}")).get("pid", 0))


def rpc_error(exc: grpc.RpcError) -> str:
    """A CRI error in one line: its code and the runtime's message."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'error'}: {' '.join(str(details).split())}"
