"""The containers a runtime enforces (NRI), by their Kubernetes pod: an index the
state's memo keeps and follows through every change at the cost of the change,
so PodResources and the metrics name them without walking every workload. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from numa_agent.core.layered import Layered
from numa_agent.state.model import AgentState, FollowsWorkloads, Workload


def kubernetes_pod(w: Workload) -> tuple[str, str] | None:
    """(namespace, pod) of a container its runtime enforces, as Kubernetes
    names them; None for the agent's own workloads (and a reference naming no pod)."""
    ref = w.runtime
    return (ref.namespace, ref.pod) if ref is not None and ref.pod else None


@dataclass(frozen=True)
class RuntimePods(FollowsWorkloads):
    """(namespace, pod) -> the names of its containers its runtime enforces,
    sorted; followed through every update at the cost of the change."""

    pods: Layered[tuple[str, str], tuple[str, ...]]

    def after_workloads(self, removed: Sequence[Workload], added: Sequence[Workload]) -> "RuntimePods":
        changed: dict[tuple[str, str], set[str]] = {}
        for workloads, keep in ((removed, False), (added, True)):
            for w in workloads:
                key = kubernetes_pod(w)
                if key is None:
                    continue
                names = changed.setdefault(key, set(self.pods.get(key) or ()))
                (names.add if keep else names.discard)(w.name)
        if not changed:
            return self
        return RuntimePods(self.pods.updated({k: tuple(sorted(v)) for k, v in changed.items() if v},
                                             [k for k, v in changed.items() if not v]))


def runtime_pods(state: AgentState) -> RuntimePods:
    kept = state.memo.get("runtime_pods")
    if not isinstance(kept, RuntimePods):
        kept = state.memo["runtime_pods"] = RuntimePods(Layered()).after_workloads((), state.workloads)
    return kept
