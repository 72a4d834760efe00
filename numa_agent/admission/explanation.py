"""A decision's explanation: an immutable value the admission builds part by
part (the topology manager's verdict, the merge, every provider's hints, the
allocation's alignment, a refusal's details), and its one JSON form,
`as_json()`, which the API answers and `numa-agent explain` print.

A part not known (not reached, or not asked for: the costly hints only on a
refusal or with `explain`) is None and absent from the JSON. While the service
is being split the value also reads as a `Mapping` of that JSON (read-only),
so its readers there need not change at once; new code reads the fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping

import msgspec

from numa_agent.admission.topology_manager import HintSummary
from numa_agent.core.hints import TopologyHint


class Topology(msgspec.Struct, frozen=True):
    """The topology manager's part: its policy and scope, and what its merge
    said of the alignment ("aligned", "not-aligned", "not-checked"), which is
    not the outcome: that is the explanation's `admit`."""

    policy: str
    scope: str
    verdict: str

    def as_json(self) -> dict[str, str]:
        return {"policy": self.policy, "scope": self.scope, "verdict": self.verdict}


class ProviderHints(msgspec.Struct, frozen=True):
    """One provider's hints for one resource, as the merge was given them."""

    provider: str
    summary: HintSummary

    def as_json(self) -> dict[str, Any]:
        return {**dict(self.summary), "provider": self.provider}


class PodPart(msgspec.Struct, frozen=True):
    """A pod member's pod: its budget, its CPUs, and the shared ones before it came."""

    pod: str
    budget: Mapping[str, Any]
    cpus: str
    shared_cpus_before: str


class ResizePart(msgspec.Struct, frozen=True):
    """A resize's figures: what the workload held, what it holds after (empty
    on a refusal) and, on a refusal, what was asked."""

    before: Mapping[str, Any]
    after: Mapping[str, Any]
    asked: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        out = {"from": dict(self.before), "to": dict(self.after)}
        if self.asked is not None:
            out["asked"] = dict(self.asked)
        return out


if TYPE_CHECKING:
    _AsMapping = Mapping[str, Any]
else:
    class _AsMapping:  # a Struct cannot inherit the ABC: registered below
        __slots__ = ()


class Explanation(msgspec.Struct, _AsMapping, frozen=True):  # type: ignore[misc]  # ABCMeta, for mypy only
    admit: bool
    topology: Topology | None = None  # with it, "merged" (None: no merge yet)
    merged: TopologyHint | None = None
    requested: Mapping[str, Any] | None = None
    fenced_nodes: tuple[int, ...] | None = None
    tie_break: Mapping[str, Any] | None = None
    reason: str | None = None  # a refusal's, where the message alone does not say it all
    hugepages_short: tuple[Mapping[str, int], ...] | None = None
    free: Mapping[str, Any] | None = None  # per node, before the decision
    providers: tuple[ProviderHints, ...] | None = None
    pod: PodPart | None = None
    alignment: Mapping[str, bool] | None = None
    resize: ResizePart | None = None
    # A resize's refusal: the decision of the resized request (its "admit" left out).
    decided: Explanation | None = None
    quota: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"admit": self.admit}
        if self.topology is not None:
            out["topology"] = self.topology.as_json()
            out["merged"] = None if self.merged is None else self.merged.to_json()
        for key in ("requested", "tie_break", "alignment", "quota"):
            value = getattr(self, key)
            if value is not None:
                out[key] = dict(value)
        if self.fenced_nodes is not None:
            out["fenced_nodes"] = list(self.fenced_nodes)
        if self.reason is not None:
            out["reason"] = self.reason
        if self.hugepages_short is not None:
            out["hugepages_short"] = [dict(s) for s in self.hugepages_short]
        if self.free is not None:
            out["free"] = self.free
        if self.providers is not None:
            out["providers"] = [p.as_json() for p in self.providers]
        if self.pod is not None:
            out.update(pod=self.pod.pod, pod_budget=dict(self.pod.budget), pod_cpus=self.pod.cpus,
                       pod_shared_cpus_before=self.pod.shared_cpus_before)
        if self.resize is not None:
            out["resize"] = self.resize.as_json()
        if self.decided is not None:
            out["decided"] = {k: v for k, v in self.decided.as_json().items() if k != "admit"}
        return out

    def but(self, **changes: Any) -> Explanation:
        """A copy with `changes` (field: value)."""
        return msgspec.structs.replace(self, **changes)

    def refused(self) -> Explanation:
        return self if not self.admit else self.but(admit=False)

    # Read-only Mapping access to the JSON, for the service's readers meanwhile
    # (registered as a Mapping below: a Struct cannot inherit the ABC).
    def __getitem__(self, key: str) -> Any:
        return self.as_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_json().get(key, default)

    def keys(self) -> Any:
        return self.as_json().keys()

    def items(self) -> Any:
        return self.as_json().items()

    def values(self) -> Any:
        return self.as_json().values()

    def __contains__(self, key: object) -> bool:
        return key in self.as_json()

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_json())

    def __len__(self) -> int:
        return len(self.as_json())

    def __eq__(self, other: object) -> bool:
        """Equal to another explanation, or a mapping, with the same JSON."""
        if isinstance(other, Explanation):
            return self.as_json() == other.as_json()
        if isinstance(other, Mapping):
            return self.as_json() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


Mapping.register(Explanation)



__all__ = ["Explanation", "PodPart", "ProviderHints", "ResizePart", "Topology"]
