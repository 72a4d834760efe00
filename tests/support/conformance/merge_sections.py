"""Conformance section for the topology manager: one kubelet vector case
(providers' hints, NUMA nodes, policies) through the real merge and admission;
None on success, else one line saying what differed."""

from __future__ import annotations

from typing import Any, Callable

from numa_agent.admission.allocation_score import tie_rank
from numa_agent.admission.topology_manager import TopologyManagerOptions, merge_hints
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint

Section = Callable[[dict, dict], "str | None"]

# Keys of a case's policy_options that describe the vector, not kubelet options.
_VECTOR_ONLY_OPTIONS = ("numa_distances",)


def _hint(raw: dict) -> TopologyHint:
    mask = raw.get("mask")
    return TopologyHint(None if mask is None else NumaMask(mask), bool(raw["preferred"]))


def _providers(case: dict) -> list[dict[str, HintSet] | None]:
    out: list[dict[str, HintSet] | None] = []
    for provider in case["providers"]:
        if provider is None:
            out.append(None)
            continue
        out.append({name: HintSet.explicit(None if hints is None else [_hint(h) for h in hints])
                    for name, hints in provider.items()})
    return out


def _distances(case: dict, doc: dict) -> dict[int, dict[int, int]] | None:
    name = (case.get("policy_options") or {}).get("numa_distances")
    if name is None:
        return None
    matrix = doc["numa_distances"][name]
    nodes = case["numa_nodes"]
    return {a: {b: matrix[i][j] for j, b in enumerate(nodes)} for i, a in enumerate(nodes)}


def _expected(case: dict) -> TopologyHint:
    raw = case["expected"]
    mask: Any = raw["mask"]
    if mask == "ALL":
        mask = case["numa_nodes"]
    return TopologyHint(None if mask is None else NumaMask(mask), bool(raw["preferred"]))


def _allocation(case: dict) -> list[list[dict[int, tuple[int, int]]]]:
    """The scored providers' figures: per provider, per resource, node -> (assigned, allocatable)."""
    return [[{int(node): (int(pair[0]), int(pair[1])) for node, pair in resource.items()} for resource in provider]
            for provider in case.get("allocation") or []]


def run_merge(case: dict, doc: dict) -> str | None:
    opts = {k: v for k, v in (case.get("policy_options") or {}).items() if k not in _VECTOR_ONLY_OPTIONS}
    options = TopologyManagerOptions.from_mapping(opts)
    providers = _providers(case)
    distances = _distances(case, doc)
    expected = _expected(case)
    tie = tie_rank(options.numa_allocation_strategy, _allocation(case))
    problems = []
    for policy in case["policies"]:
        result = merge_hints(providers, case["numa_nodes"], policy, options, distances, tie=tie)
        if result.merged != expected:
            problems.append(f"{policy}: merged {result.merged}, expected {expected}")
        want_admit = case["expected_admit"][policy]
        if result.admit != want_admit:
            problems.append(f"{policy}: admit {result.admit}, expected {want_admit}")
    return "; ".join(problems) or None


SECTIONS: dict[str, Section] = {
    "topology_manager_merge": run_merge,
    # the same merge with numa-allocation-strategy and each scored provider's figures ("allocation")
    "numa_allocation_strategy_merge": run_merge,
}
