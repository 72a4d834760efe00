"""The topology manager's policies and scopes, their names and admit rules,
in one place: config, API, CLIs, the merge and the explanations read them here.

``TopologyPolicy`` is a ``StrEnum``, so a member compares equal to its kubelet
name and serialises as that name in JSON and the checkpoint.
"""

from __future__ import annotations

from enum import StrEnum

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import TypeVar

    _E = TypeVar("_E", bound=StrEnum)


def _parse(kind: type[_E], value: str, what: str) -> _E:
    """The member named `value`; ValueError listing the names otherwise."""
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise ValueError(f"unknown topology manager {what} {value!r}; expected one of {names}") from None


class TopologyPolicy(StrEnum):
    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"

    @classmethod
    def parse(cls, value: str) -> TopologyPolicy:
        return _parse(cls, value, "policy")

    @property
    def admits_any(self) -> bool:
        """none and best-effort admit whatever the merge says."""
        return self in (TopologyPolicy.NONE, TopologyPolicy.BEST_EFFORT)

    @property
    def single_node(self) -> bool:
        """single-numa-node considers only single-node hints (and 'any')."""
        return self is TopologyPolicy.SINGLE_NUMA_NODE

    def admits(self, preferred: bool) -> bool:
        """The kubelet's rule: restricted and single-numa-node admit only a
        preferred merged hint."""
        return self.admits_any or preferred

    @property
    def rule(self) -> str:
        """Why a refusal is a refusal, for explanations ("" when it never refuses)."""
        if self is TopologyPolicy.SINGLE_NUMA_NODE:
            return "policy single-numa-node admits only a preferred single-node hint"
        if self is TopologyPolicy.RESTRICTED:
            return "policy restricted admits only a preferred hint"
        return ""


class TopologyScope(StrEnum):
    CONTAINER = "container"
    POD = "pod"

    @classmethod
    def parse(cls, value: str) -> TopologyScope:
        return _parse(cls, value, "scope")


class AllocationStrategy(StrEnum):
    """The topology manager's numa-allocation-strategy (KEP-6007): how a tie
    between equally good NUMA node sets is broken. Ties are those of equal width
    (and, under prefer-closest-numa-nodes, equal distance); the strategy never
    makes a hint preferred or narrower."""

    NONE = "none"  # the lowest-numbered set, as ever
    LEAST_ALLOCATED = "least-allocated"  # the emptiest: spread out
    MOST_ALLOCATED = "most-allocated"  # the busiest: pack, leaving whole nodes free


POLICY_NAMES: tuple[str, ...] = tuple(p.value for p in TopologyPolicy)
STRATEGY_NAMES: tuple[str, ...] = tuple(s.value for s in AllocationStrategy)
SCOPE_NAMES: tuple[str, ...] = tuple(s.value for s in TopologyScope)
