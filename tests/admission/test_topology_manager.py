"""Unit tests for the topology manager: options, policies, explanations,
large machines, the budget fallback."""

from __future__ import annotations

import pytest

from numa_agent.admission.topology_manager import (
    SCOPES,
    TopologyConfigError,
    TopologyManagerOptions,
    _merge,
    admit,
    check_policy,
    check_scope,
    merge,
    merge_hints,
)
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint
from tests.support.reference_merge import reference_merge


def H(nodes, preferred=True):
    return TopologyHint(None if nodes is None else NumaMask(nodes), preferred)


def cpu_like(free_per_node: dict[int, int], request: int, per_node_capacity: int) -> HintSet:
    """A generated set as a CPU provider builds it: fits when the mask's free
    CPUs cover the request; preferred width from capacity."""
    nodes = NumaMask(sorted(free_per_node))
    min_size = -(-request // per_node_capacity)

    def fits(mask):
        return sum(free_per_node[n] for n in mask.nodes()) >= request

    return HintSet.generated(nodes, fits, min_size, monotone=True)


# ---- configuration ------------------------------------------------------

def test_unknown_policy_is_refused_with_the_known_ones():
    with pytest.raises(TopologyConfigError, match="unknown topology manager policy 'strict'.*single-numa-node"):
        check_policy("strict")
    with pytest.raises(TopologyConfigError, match="unknown topology manager policy"):
        merge([], [0], "strict")


def test_scopes_and_unknown_scope():
    assert SCOPES == ("container", "pod")
    assert check_scope("pod") == "pod"
    with pytest.raises(TopologyConfigError, match="unknown topology manager scope 'node'"):
        check_scope("node")


def test_options_from_kubelet_spelling():
    opts = TopologyManagerOptions.from_mapping({"prefer-closest-numa-nodes": "true",
                                                "max-allowable-numa-nodes": "64"})
    assert opts == TopologyManagerOptions(True, 64)
    assert TopologyManagerOptions.from_mapping(None) == TopologyManagerOptions(False, 8)


def test_unknown_option_is_refused_with_the_known_ones():
    with pytest.raises(TopologyConfigError, match="unknown topology manager option.*'prefer-closest'.*"
                                                  "known: prefer-closest-numa-nodes"):
        TopologyManagerOptions.from_mapping({"prefer-closest": "true"})


@pytest.mark.parametrize("mapping, message", [
    ({"prefer-closest-numa-nodes": "yes"}, "prefer-closest-numa-nodes: expected true or false, got 'yes'"),
    ({"max-allowable-numa-nodes": "many"}, "max-allowable-numa-nodes: expected a positive integer, got 'many'"),
    ({"max-allowable-numa-nodes": 0}, "max-allowable-numa-nodes: expected a positive integer, got 0"),
    ({"max-allowable-numa-nodes": True}, "max-allowable-numa-nodes: expected a positive integer"),
])
def test_bad_option_values_are_refused(mapping, message):
    with pytest.raises(TopologyConfigError, match=message):
        TopologyManagerOptions.from_mapping(mapping)


def test_config_errors_are_value_errors_for_callers_that_catch_those():
    assert issubclass(TopologyConfigError, ValueError)


def test_machine_with_more_nodes_than_allowed_is_refused_unless_raised():
    with pytest.raises(TopologyConfigError, match="16 NUMA nodes, more than max-allowable-numa-nodes=8"):
        TopologyManagerOptions().check_machine("restricted", 16)
    TopologyManagerOptions(max_allowable_numa_nodes=64).check_machine("restricted", 16)
    TopologyManagerOptions().check_machine("none", 16)  # the none policy never merges


def test_prefer_closest_needs_distances():
    opts = TopologyManagerOptions(prefer_closest_numa_nodes=True)
    with pytest.raises(TopologyConfigError, match="needs the NUMA distance matrix"):
        merge([{"cpu": HintSet.explicit([H([0])])}], [0, 1], "best-effort", opts, None)
    with pytest.raises(TopologyConfigError, match="no distance from NUMA node 1"):
        merge([{"cpu": HintSet.explicit([H([0])])}], [0, 1], "best-effort", opts, {0: {0: 10, 1: 20}, 1: {1: 10}})


def test_generated_hints_outside_the_machine_are_refused():
    hs = HintSet.generated(NumaMask([0, 5]), lambda m: True, 1)
    with pytest.raises(ValueError, match=r"generated hints span NUMA nodes \[5\] that are not among"):
        merge([{"cpu": hs}], [0, 1], "best-effort")


def test_no_numa_node_is_refused():
    with pytest.raises(ValueError, match="at least one NUMA node"):
        merge([], [], "restricted")


# ---- policies --------------------------------------------------------------

def test_none_policy_does_not_merge_and_admits():
    result = merge_hints([{"cpu": HintSet.impossible()}], [0, 1], "none")
    assert result.merged == H(None, True) and result.admit


def test_admit_rules():
    assert admit("best-effort", H([0], False)) and admit("none", H(None, False))
    assert not admit("restricted", H([0, 1], False)) and admit("restricted", H([0, 1], True))
    assert not admit("single-numa-node", H(None, False))


def test_single_numa_node_reports_all_nodes_as_any():
    # One node machine: the only merged hint is the whole machine -> "any".
    assert merge([{"cpu": HintSet.explicit([H([0])])}], [0], "single-numa-node") == H(None, True)


def test_generated_and_explicit_providers_merge_like_the_kubelet():
    cpu = cpu_like({0: 2, 1: 8, 2: 8, 3: 0}, request=6, per_node_capacity=8)
    devices = {"gpu": HintSet.explicit([H([1]), H([2]), H([1, 2], False)])}
    providers = [{"cpu": cpu}, devices]
    for policy in ("best-effort", "restricted", "single-numa-node"):
        assert merge(providers, [0, 1, 2, 3], policy) == reference_merge(providers, [0, 1, 2, 3], policy)
    assert merge(providers, [0, 1, 2, 3], "restricted") == H([1], True)


def test_disagreeing_generated_sets_fall_back_to_the_best_non_preferred_mask():
    # CPUs need two nodes (only 4 free per node), devices sit on node 2 only.
    cpu = cpu_like({0: 4, 1: 4, 2: 4, 3: 4}, request=6, per_node_capacity=8)
    gpu = HintSet.generated(NumaMask([0, 1, 2, 3]), lambda m: 2 in m, 1, monotone=True)
    providers = [{"cpu": cpu}, {"gpu": gpu}]
    got = merge(providers, [0, 1, 2, 3], "best-effort")
    # The kubelet's rule: width B=2 first, and {0,1} = cpu {0,1} & gpu {0,1,2}.
    assert got == reference_merge(providers, [0, 1, 2, 3], "best-effort") == H([0, 1], False)
    assert not merge_hints(providers, [0, 1, 2, 3], "restricted").admit


def test_two_monotone_sets_can_meet_on_a_mask_neither_offers():
    # {0,1} is no one's hint, yet {0,1,2} & {0,1,3} merge to it and it ranks first.
    def supersets_of(*seeds):
        return lambda m: any(NumaMask(s).issubset(m) for s in seeds)

    nodes = NumaMask(range(5))
    a = HintSet.generated(nodes, supersets_of([0, 1, 2], [3, 4]), 2, monotone=True)
    b = HintSet.generated(nodes, supersets_of([0, 1, 3], [3, 4]), 1, monotone=True)
    providers = [{"a": a}, {"b": b}]
    assert merge(providers, range(5), "best-effort") == H([0, 1], False)
    assert reference_merge(providers, range(5), "best-effort") == H([0, 1], False)


def test_prefer_closest_breaks_width_ties_by_distance():
    dist = {a: {b: 10 if a == b else (11 if a // 2 == b // 2 else 30) for b in range(4)} for a in range(4)}
    hints = [H([0, 2]), H([2, 3])]
    providers = [{"a": HintSet.explicit(hints)}, {"b": HintSet.explicit(hints)}]
    closest = TopologyManagerOptions(prefer_closest_numa_nodes=True)
    assert merge(providers, range(4), "best-effort") == H([0, 2], True)
    assert merge(providers, range(4), "best-effort", closest, dist) == H([2, 3], True)


# ---- explanations ----------------------------------------------------------

def test_refusal_explains_each_providers_hints_and_the_rule():
    providers = [{"cpu": HintSet.explicit([H([1]), H([0, 1], False)])},
                 {"memory": HintSet.explicit([H([0, 1], False)])}]
    result = merge_hints(providers, [0, 1], "single-numa-node")
    assert not result.admit
    text = result.explanation()
    assert text.startswith("TopologyAffinityError: cpu hints [{1} preferred, {0,1}], "
                           "memory hints [{0,1}]; merged any not preferred")
    assert text.endswith("policy single-numa-node admits only a preferred single-node hint")
    assert dict(result.provider_summaries[0]) == {"provider": 0, "resource": "cpu",
                                                   "hints": ["{1} preferred", "{0,1}"], "more": 0}


def test_summaries_stay_short_on_64_nodes():
    nodes = list(range(64))
    cpu = cpu_like({n: 16 for n in nodes}, request=20, per_node_capacity=16)
    result = merge_hints([{"cpu": cpu}, {"memory": HintSet.explicit([H([n]) for n in nodes])}], nodes,
                    "restricted", TopologyManagerOptions(max_allowable_numa_nodes=64))
    cpu_summary, mem_summary = result.provider_summaries
    assert len(cpu_summary.hints) <= 4 and cpu_summary.more == -1
    assert len(mem_summary.hints) == 4 and mem_summary.more == 60
    assert len(result.explanation()) < 400


# ---- large machines and the budget ----------------------------------------

def _four_providers(nodes, free, busy_nodes=()):
    per = {n: (0 if n in busy_nodes else free) for n in nodes}
    return [
        {"cpu": cpu_like(per, request=24, per_node_capacity=16)},
        {"memory": cpu_like(per, request=20, per_node_capacity=16)},
        {"hugepages": cpu_like(per, request=30, per_node_capacity=16)},
        {"gpu": cpu_like(per, request=17, per_node_capacity=16)},
    ]


def test_64_node_merge_finds_the_first_aligned_pair():
    nodes = list(range(64))
    providers = _four_providers(nodes, free=16, busy_nodes=(0, 1))
    merged, exact = _merge(providers, nodes, "restricted", None, None)
    assert exact and merged == H([2, 3], True)


def test_64_node_merge_without_preferred_alignment_is_exact():
    nodes = list(range(64))
    per = {n: 12 for n in nodes}
    providers = [{"cpu": cpu_like(per, request=24, per_node_capacity=16)},  # prefers 2, needs 2
                 {"gpu": HintSet.generated(NumaMask(nodes), lambda m: 40 in m, 1, monotone=True)}]
    merged, exact = _merge(providers, nodes, "best-effort", None, None)
    # As the kubelet: cpu {0,1} & gpu {0,1,40} has the width B=2 and the lowest bits.
    assert exact and merged == H([0, 1], False)
    small = [0, 1, 2, 3]
    small_providers = [{"cpu": cpu_like({n: 12 for n in small}, 24, 16)},
                       {"gpu": HintSet.generated(NumaMask(small), lambda m: 3 in m, 1, monotone=True)}]
    assert merge(small_providers, small, "best-effort") == reference_merge(small_providers, small, "best-effort") \
        == H([0, 1], False)


def test_exhausted_budget_reports_no_alignment_and_says_so():
    nodes = list(range(64))
    providers = _four_providers(nodes, free=16, busy_nodes=(0, 1))
    merged, exact = _merge(providers, nodes, "best-effort", None, None, budget_limit=3)
    assert not exact and merged == H(nodes, False)
