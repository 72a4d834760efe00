"""The kubelet's topology merge done literally, for tests and benchmarks only:
every combination of the providers' hints, one per resource, compared
pairwise in the kubelet's order. Exponential in the number of NUMA nodes; the
agent's own merge (numa_agent.admission.topology_manager) must agree with it
wherever it is exact, and the property tests check that it does."""

from __future__ import annotations

from itertools import product
from typing import Callable, Mapping, Sequence

from numa_agent.admission.topology_manager import (
    ProviderInput,
    TopologyManagerOptions,
    check_policy,
    provider_resources,
)
from numa_agent.core.hints import NumaMask, TopologyHint


def kubelet_lists(providers: Sequence[ProviderInput]) -> list[list[TopologyHint]]:
    lists = []
    for _, _, hs in provider_resources(providers):
        hints = hs.hints()
        lists.append(hints if hints else [TopologyHint(None, False)])
    return lists


def _reference_better(current: TopologyHint | None, candidate: TopologyHint, best_count: int,
                      pick: Callable[[NumaMask, NumaMask], NumaMask]) -> TopologyHint | None:
    """One step of the kubelet's pairwise comparison, case by case. Both
    hints are combinations (``_reference_combine``): their masks are set."""
    cand_mask = candidate.mask
    assert cand_mask is not None, "a combined hint has a mask"
    if cand_mask.count() == 0:
        return current
    if current is None:
        return candidate
    cur_mask = current.mask
    assert cur_mask is not None, "a combined hint has a mask"

    def fitter() -> TopologyHint:
        if cand_mask == cur_mask:
            return current
        return current if pick(cur_mask, cand_mask) == cur_mask else candidate

    if current.preferred != candidate.preferred:
        return candidate if candidate.preferred else current
    if current.preferred:
        return fitter()
    cur, cand = cur_mask.count(), cand_mask.count()
    if cur > best_count:
        return fitter()
    if cur == best_count:
        return fitter() if cand == best_count else current
    if cand > best_count:
        return current
    if cand == best_count:
        return candidate
    if cand != cur:
        return candidate if cand > cur else current
    return fitter()


def _reference_best_count(lists: Sequence[Sequence[TopologyHint]]) -> int:
    """The widest of the lists' narrowest masks."""
    best_count = 0
    for hints in lists:
        masks = [h.mask for h in hints if h.mask is not None]
        if masks:
            best_count = max(best_count, min(masks, key=NumaMask.sort_key).count())
    return best_count


def _reference_pick(closest: bool, distances: Mapping[int, Mapping[int, int]] | None,
                    ) -> Callable[[NumaMask, NumaMask], NumaMask]:
    """The kubelet's choice between two masks (narrower, or closer with
    prefer-closest-numa-nodes among equally wide ones)."""

    def average(mask: NumaMask) -> float:
        assert distances is not None, "prefer-closest-numa-nodes needs the distance matrix"
        nodes = mask.nodes()
        return sum(distances[a][b] for a in nodes for b in nodes) / (len(nodes) ** 2)

    def pick(a: NumaMask, b: NumaMask) -> NumaMask:
        if closest and a.count() == b.count():
            da, db = average(a), average(b)
            if da != db:
                return a if da < db else b
            return a if a.bits < b.bits else b
        return a if a.sort_key() < b.sort_key() else b  # narrower, then lower bits

    return pick


def _reference_combine(combo: Sequence[TopologyHint], all_mask: NumaMask) -> TopologyHint:
    """One combination merged: the masks' intersection, preferred iff every
    hint is and every non-nil mask is the same."""
    mask, preferred, first = all_mask, True, None
    for hint in combo:
        if hint.mask is not None:
            mask = mask & hint.mask
            first = hint.mask if first is None else first
            if hint.mask != first:
                preferred = False
        if not hint.preferred:
            preferred = False
    return TopologyHint(mask, preferred)


def reference_merge(providers: Sequence[ProviderInput], numa_nodes: Sequence[int], policy: str,
                    options: TopologyManagerOptions | None = None,
                    distances: Mapping[int, Mapping[int, int]] | None = None) -> TopologyHint:
    """The kubelet's merge done literally: every combination of hints, one per
    resource, compared pairwise in order. Exponential; small machines only."""
    check_policy(policy)
    options = options or TopologyManagerOptions()
    if policy == "none":
        return TopologyHint(None, True)
    all_mask = NumaMask(numa_nodes)
    lists = kubelet_lists(providers)
    if policy == "single-numa-node":
        lists = [[h for h in hints if h.preferred and (h.mask is None or h.mask.count() == 1)]
                 for hints in lists]
    best_count = _reference_best_count(lists)
    pick = _reference_pick(options.prefer_closest_numa_nodes and policy != "single-numa-node", distances)
    best = None
    for combo in product(*lists):
        best = _reference_better(best, _reference_combine(combo, all_mask), best_count, pick)
    if best is None:
        best = TopologyHint(all_mask, False)
    if policy == "single-numa-node" and best.mask == all_mask:
        best = TopologyHint(None, best.preferred)
    return best
