"""The containers a runtime enforces (NRI), by their Kubernetes pod and by their
pod sandbox: an index the state's memo keeps and follows through every change at
the cost of the change, so PodResources, the metrics and the NRI handler find
them without walking every workload. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from numa_agent.core.layered import Layered
from numa_agent.state.model import AgentState, FollowsWorkloads, Workload

K = TypeVar("K")


def kubernetes_pod(w: Workload) -> tuple[str, str] | None:
    """(namespace, pod) of a container its runtime enforces, as Kubernetes
    names them; None for the agent's own workloads (and a reference naming no pod)."""
    ref = w.runtime
    return (ref.namespace, ref.pod) if ref is not None and ref.pod else None


def sandbox_of(w: Workload) -> str | None:
    """The pod sandbox id of a container its runtime enforces; None for the agent's own."""
    return w.runtime.sandbox_id if w.runtime is not None else None


@dataclass(frozen=True)
class RuntimePods(FollowsWorkloads):
    """The names of the containers a runtime enforces, sorted, grouped two ways:
    `pods` by (namespace, pod) as Kubernetes names them, `sandboxes` by pod
    sandbox id; followed through every update at the cost of the change."""

    pods: Layered[tuple[str, str], tuple[str, ...]]
    sandboxes: Layered[str, tuple[str, ...]]

    def after_workloads(self, removed: Sequence[Workload], added: Sequence[Workload]) -> "RuntimePods":
        pods = _regrouped(self.pods, removed, added, kubernetes_pod)
        sandboxes = _regrouped(self.sandboxes, removed, added, sandbox_of)
        if pods is self.pods and sandboxes is self.sandboxes:
            return self
        return RuntimePods(pods, sandboxes)


def _regrouped(groups: Layered[K, tuple[str, ...]], removed: Sequence[Workload], added: Sequence[Workload],
               key: Callable[[Workload], K | None]) -> Layered[K, tuple[str, ...]]:
    """`groups` (key -> names) after `removed` left and `added` came; itself when no group changed."""
    changed: dict[K, set[str]] = {}
    for workloads, keep in ((removed, False), (added, True)):
        for w in workloads:
            k = key(w)
            if k is None:
                continue
            names = changed.setdefault(k, set(groups.get(k) or ()))
            (names.add if keep else names.discard)(w.name)
    if not changed:
        return groups
    return groups.updated({k: tuple(sorted(v)) for k, v in changed.items() if v},
                          [k for k, v in changed.items() if not v])


def runtime_pods(state: AgentState) -> RuntimePods:
    kept = state.memo.get("runtime_pods")
    if not isinstance(kept, RuntimePods):
        kept = state.memo["runtime_pods"] = RuntimePods(Layered(), Layered()).after_workloads((), state.workloads)
    return kept
