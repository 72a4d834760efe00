"""The topology manager: merges the providers' NUMA hints under a policy and
decides admission, with the kubelet's semantics but without its cross product.

Kubelet semantics (what ``reference_merge`` computes literally)
---------------------------------------------------------------
Every provider answers resource -> hint list; a missing/empty provider or a
``None`` list is ``[{any, preferred}]``, an empty list is ``[{any, not
preferred}]``. Every combination taking one hint per resource merges to
``{D & AND(masks), preferred iff every hint is preferred and every non-nil
mask is the same}`` (D = all NUMA nodes); empty merged masks are ignored. The
best merged hint wins: a preferred one over any non-preferred one; among
preferred, the narrowest mask (fewest nodes, then the smaller bitmask), or
with ``prefer-closest-numa-nodes`` among equally wide masks the lower average
distance first; among non-preferred, a mask whose width equals B (the widest
of the providers' narrowest hints) first, then narrower ones widest first,
then wider ones narrowest first, ties as above. Nothing mergeable -> ``{D, not
preferred}``. ``single-numa-node`` first keeps only ``{any, preferred}`` and
preferred single-node hints and reports a merged ``D`` as ``any``.
``restricted`` and ``single-numa-node`` admit iff the merged hint is preferred.

How ``merge`` avoids the cross product
--------------------------------------
Those rules define a total order on merged masks, so the answer is the best
*achievable* mask and the combination order does not matter.

* Explicit lists only: a dynamic programme over distinct partial states
  (intersection so far, "still preferred with common mask M"), deduplicated
  after each resource: at most (distinct masks x distinct preferred masks)
  states instead of the product of the list lengths.
* Generated hint sets (``HintSet.generated``):
  1. Preferred merged hints are masks every resource prefers (or has no
     preference about), so candidates are the preferred list of the most
     selective explicit resource, or else the subsets of the common nodes
     of the generated sets' preferred width, enumerated best-first; the
     first candidate every resource prefers is the answer.
  2. Otherwise the best non-preferred mask is searched width by width in the
     order above (B, B-1..1, B+1..), candidates best-first; a candidate X is
     achievable iff every resource has a hint containing X and the chosen
     hints intersect to exactly X. That is decided exactly: a resource
     holding X itself settles it; otherwise the explicit lists are combined
     by the same deduplicated programme and the monotone generated sets
     (``monotone=True``) must jointly exclude every remaining node, searched
     depth-first with pruning (a monotone set that cannot lose node v here
     cannot lose it with more nodes lost).

Guarantees: the result equals ``reference_merge`` whenever ``MergeResult.exact``
is true, which holds unless the search spends more than ``FITS_BUDGET`` fits()
calls; then the merge reports ``{all nodes, not preferred}`` (the kubelet's
"no alignment" answer) with ``exact=False``. Costs: explicit lists are
polynomial; the preferred phase costs at most C(n, k) fits() calls for the
common preferred width k (stopping at the first hit without
prefer-closest); the non-preferred phase typically ends at the first
candidates of width B. Non-monotone generated sets (memory) are enumerated
above each candidate (2^(n-|X|)), fine on small machines, bounded by the
budget on large ones. Precondition of generated sets, true for the
kubelet's providers (min_size is computed from capacity, fits() from what is
free): no mask narrower than ``min_size`` fits.

Policy ``none`` does not merge: the merged hint is ``{any, preferred}`` by
this project's convention (the kubelet returns a zero hint, ``{any, not
preferred}``; both always admit).

Scopes: ``SCOPES = ("container", "pod")``. With scope ``container`` the caller
merges once per container with that container's hints; with ``pod`` it merges
once with hints computed for the pod's summed request, and every container of
the pod is allocated inside the one merged hint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from numa_agent.core.hints import HintSet, NumaMask, TopologyHint
from numa_agent.core.policy import (
    POLICY_NAMES,
    SCOPE_NAMES,
    STRATEGY_NAMES,
    AllocationStrategy,
    TopologyPolicy,
    TopologyScope,
)

POLICIES = POLICY_NAMES
SCOPES = SCOPE_NAMES

# fits() calls one merge may spend before it gives up exactness (see module doc).
FITS_BUDGET = 200_000

_KNOWN_OPTIONS = ("prefer-closest-numa-nodes", "max-allowable-numa-nodes", "numa-allocation-strategy")


class TopologyConfigError(ValueError):
    """Unknown policy or option, bad option value, or a machine the options refuse."""


def check_policy(policy: str) -> TopologyPolicy:
    try:
        return TopologyPolicy.parse(policy)
    except ValueError as exc:
        raise TopologyConfigError(str(exc)) from None


def check_scope(scope: str) -> TopologyScope:
    try:
        return TopologyScope.parse(scope)
    except ValueError as exc:
        raise TopologyConfigError(str(exc)) from None


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise TopologyConfigError(f"topology manager option {name}: expected true or false, got {value!r}")


@dataclass(frozen=True, slots=True)
class TopologyManagerOptions:
    """The kubelet's topology manager policy options.

    ``max_allowable_numa_nodes`` defaults to 8 like the kubelet: a machine
    with more NUMA nodes is refused at configuration time (``check_machine``)
    unless the option is raised. Raising it (to 64 and beyond) is supported:
    this merge does not enumerate the cross product; see the module doc for
    what it costs and guarantees on large machines.
    """

    prefer_closest_numa_nodes: bool = False
    max_allowable_numa_nodes: int = 8
    numa_allocation_strategy: AllocationStrategy = AllocationStrategy.NONE

    def __post_init__(self) -> None:
        if isinstance(self.max_allowable_numa_nodes, bool) or not isinstance(self.max_allowable_numa_nodes, int) \
                or self.max_allowable_numa_nodes < 1:
            raise TopologyConfigError(
                "topology manager option max-allowable-numa-nodes: expected a positive integer, "
                f"got {self.max_allowable_numa_nodes!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> "TopologyManagerOptions":
        """Options as the kubelet spells them (string values accepted)."""
        mapping = dict(mapping or {})
        unknown = sorted(k for k in mapping if k not in _KNOWN_OPTIONS)
        if unknown:
            raise TopologyConfigError(
                f"unknown topology manager option(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(_KNOWN_OPTIONS)}")
        closest = _parse_bool("prefer-closest-numa-nodes", mapping.get("prefer-closest-numa-nodes", False))
        raw_max = mapping.get("max-allowable-numa-nodes", 8)
        try:
            max_nodes = int(raw_max) if not isinstance(raw_max, bool) else None
        except (TypeError, ValueError):
            max_nodes = None
        if max_nodes is None or (isinstance(raw_max, float) and raw_max != max_nodes):
            raise TopologyConfigError(
                f"topology manager option max-allowable-numa-nodes: expected a positive integer, got {raw_max!r}")
        raw_strategy = mapping.get("numa-allocation-strategy", AllocationStrategy.NONE.value)
        if raw_strategy not in STRATEGY_NAMES:
            raise TopologyConfigError(f"topology manager option numa-allocation-strategy: unknown value "
                                      f"{raw_strategy!r}; expected one of {', '.join(STRATEGY_NAMES)}")
        strategy = AllocationStrategy(raw_strategy)
        return cls(prefer_closest_numa_nodes=closest, max_allowable_numa_nodes=max_nodes,
                   numa_allocation_strategy=strategy)

    def to_mapping(self) -> dict[str, str]:
        """The options in effect, by their kubelet names (as the config writes them)."""
        return {"prefer-closest-numa-nodes": "true" if self.prefer_closest_numa_nodes else "false",
                "max-allowable-numa-nodes": str(self.max_allowable_numa_nodes),
                "numa-allocation-strategy": self.numa_allocation_strategy.value}

    def check_machine(self, policy: str, numa_node_count: int) -> None:
        """Refuse a machine with more NUMA nodes than allowed (policy none exempt)."""
        check_policy(policy)
        if policy != "none" and numa_node_count > self.max_allowable_numa_nodes:
            raise TopologyConfigError(
                f"this machine has {numa_node_count} NUMA nodes, more than max-allowable-numa-nodes="
                f"{self.max_allowable_numa_nodes}; raise the option to use policy {policy}")


# --------------------------------------------------------------------------
# Input normalisation: one entry per resource, in the kubelet's terms.

ProviderInput = Mapping[str, "HintSet | Sequence[TopologyHint] | None"] | None


def _as_hintset(value: Any) -> HintSet:
    if value is None:
        return HintSet.no_preference()
    if isinstance(value, HintSet):
        return value
    return HintSet.explicit(list(value))


def provider_resources(providers: Sequence[ProviderInput]) -> list[tuple[int, str, HintSet]]:
    """(provider index, resource, hint set) in a fixed order; an absent or
    empty provider is one 'no preference' resource, as for the kubelet."""
    out = []
    for index, provider in enumerate(providers):
        if not provider:
            out.append((index, "", HintSet.no_preference()))
            continue
        for name in sorted(provider):
            out.append((index, name, _as_hintset(provider[name])))
    return out


def missing_distance(distances: Mapping[int, Mapping[int, int]] | None, nodes: Sequence[int]) -> str | None:
    """Why prefer-closest-numa-nodes cannot order masks of `nodes` (None: it can)."""
    if distances is None:
        return "prefer-closest-numa-nodes needs the NUMA distance matrix"
    wanted = set(nodes)
    for n in nodes:
        row = distances.get(n)
        if row is None or not wanted <= row.keys():
            return f"prefer-closest-numa-nodes: no distance from NUMA node {n} to every node"
    return None


TieScore = Callable[[int], int]
"""A NUMA node set (bits) -> its numa-allocation-strategy rank among equally good
sets (smaller first; see admission/allocation_score.py)."""


class Closeness:
    """What prefer-closest-numa-nodes orders by, over one machine's distances:
    the distance sum of a node set, and every `width`-subset of a universe
    best first. Depends on the distances only, so one value serves every
    merge on a machine (kept on the Machine) and keeps its answers; the
    answers themselves never change."""

    # Subset orders kept: one per (universe, width) asked, small ones only.
    KEPT_ORDERS = 256
    KEPT_ORDER_LENGTH = 4096

    def __init__(self, distances: Mapping[int, Mapping[int, int]] | None, all_bits: int):
        nodes = NumaMask.nodes_of(all_bits)
        missing = missing_distance(distances, nodes)
        if missing:
            raise TopologyConfigError(missing)
        assert distances is not None
        self.all_bits = all_bits
        self._rows = {n: distances[n] for n in nodes}
        self._sums: dict[int, int] = {}
        self._orders: dict[tuple[int, int], tuple[int, ...]] = {}

    def distance_sum(self, bits: int) -> int:
        # Equal widths share the divisor of the kubelet's average, so sums compare the same.
        cached = self._sums.get(bits)
        if cached is None:
            nodes = NumaMask.nodes_of(bits)
            rows = self._rows
            cached = sum(rows[a][b] for a in nodes for b in nodes)
            self._sums[bits] = cached
        return cached

    def _key(self, bits: int) -> tuple[int, int]:
        return self.distance_sum(bits), bits

    def closest_first(self, universe: int, width: int) -> Iterable[int]:
        """Every `width`-subset of `universe` (a subset of all_bits), by
        distance sum, then lowest mask."""
        kept = self._orders.get((universe, width))
        if kept is not None:
            return kept
        positions = NumaMask.nodes_of(universe)
        if math.comb(len(positions), width) > self.KEPT_ORDER_LENGTH:
            return sorted(_gosper(positions, width), key=self._key)
        ordered = tuple(sorted(_gosper(positions, width), key=self._key))
        if len(self._orders) >= self.KEPT_ORDERS:
            self._orders.clear()
        self._orders[(universe, width)] = ordered
        return ordered


class _Order:
    """The kubelet's order on merged masks as sort keys (smaller is better):
    width, then distance under prefer-closest-numa-nodes, then the
    numa-allocation-strategy's rank (`tie`), then the lowest mask."""

    def __init__(self, closest: bool, distances: Mapping[int, Mapping[int, int]] | None, all_bits: int,
                 tie: TieScore | None = None, closeness: Closeness | None = None):
        """`closeness`: the machine's, when it covers `all_bits` (else one is
        made for this merge)."""
        self.closest = closest
        self.tie = tie
        self._tie_cache: dict[int, int] = {}
        self._closeness: Closeness | None = None
        if closest:
            if closeness is None or closeness.all_bits & all_bits != all_bits:
                closeness = Closeness(distances, all_bits)
            self._closeness = closeness

    def distance_sum(self, bits: int) -> int:
        assert self._closeness is not None, "distances are summed under prefer-closest-numa-nodes only"
        return self._closeness.distance_sum(bits)

    def rank(self, bits: int) -> int:
        if self.tie is None:
            return 0
        cached = self._tie_cache.get(bits)
        if cached is None:
            cached = self._tie_cache[bits] = self.tie(bits)
        return cached

    def key(self, bits: int) -> tuple[int, int, int, int]:
        return (bits.bit_count(), self.distance_sum(bits) if self.closest else 0, self.rank(bits), bits)

    def non_preferred_key(self, bits: int, best_count: int) -> tuple[int, int, int, int, int]:
        count = bits.bit_count()
        tie = self.distance_sum(bits) if self.closest else 0
        if count == best_count:
            return (0, 0, tie, self.rank(bits), bits)
        if count < best_count:
            return (1, -count, tie, self.rank(bits), bits)
        return (2, count, tie, self.rank(bits), bits)

    def subsets(self, universe: int, width: int, budget: "_Budget") -> Iterator[int]:
        """Every `width`-node subset of `universe`, best first for this order."""
        positions = NumaMask.nodes_of(universe)
        n = len(positions)
        if width < 1 or width > n:
            return
        if self.tie is None and self._closeness is not None:
            budget.spend(math.comb(n, width))
            yield from self._closeness.closest_first(universe, width)
        elif self.closest or self.tie is not None:
            budget.spend(math.comb(n, width))
            yield from sorted(_gosper(positions, width), key=self.key)
        else:
            yield from _gosper(positions, width)


def _gosper(positions: Sequence[int], width: int) -> Iterator[int]:
    """`width`-subsets of `positions` in increasing bitmask order (the
    kubelet's tie order among equally wide masks)."""
    n = len(positions)
    combo = (1 << width) - 1
    limit = 1 << n
    while combo < limit:
        bits, rest = 0, combo
        while rest:
            low = rest & -rest
            bits |= 1 << positions[low.bit_length() - 1]
            rest ^= low
        yield bits
        low = combo & -combo
        ripple = combo + low
        combo = ripple | (((ripple ^ combo) // low) >> 2)


class _OverBudget(Exception):
    pass


class _Budget:
    def __init__(self, limit: int):
        self.left = limit

    def spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise _OverBudget


class _Gen:
    """A generated hint set with cached fits() calls."""

    def __init__(self, hs: HintSet, budget: _Budget, cache: dict[int, bool] | None = None):
        """`cache`: fits() answers shared with the other sets of the same fits
        function (a provider offers one for all its resources, as memory does)."""
        assert hs.fits is not None, "a generated hint set has fits()"
        self.nodes = hs.nodes.bits if hs.nodes is not None else 0
        self.min_size = hs.min_size
        self.monotone = hs.monotone
        self._fits = hs.fits
        self._also = hs.also_preferred
        self._contains = hs.contains_fit
        self._alone = hs.fits_alone
        self._alone_bits: int | None = None
        self._cache: dict[int, bool] = {} if cache is None else cache
        self._budget = budget

    def fits(self, bits: int) -> bool:
        if bits & ~self.nodes or not bits:
            return False
        hit = self._cache.get(bits)
        if hit is None:
            budget = self._budget  # Budget.spend() inline: this is the merge's inner loop
            budget.left -= 1
            if budget.left < 0:
                raise _OverBudget
            hit = bool(self._fits(NumaMask.from_bits(bits)))
            self._cache[bits] = hit
        return hit

    def answers_alone(self) -> bool:
        """Whether one-node masks can be answered all at once (fits_single)."""
        return self._alone is not None

    def fits_single(self, bit: int) -> bool:
        """fits() of the one-node mask `bit` (inside `nodes`), read from the
        hint set's fits_alone, asked once, rather than a fits() call per node;
        cached and counted against the budget as fits() is."""
        hit = self._cache.get(bit)
        if hit is None:
            budget = self._budget
            budget.left -= 1
            if budget.left < 0:
                raise _OverBudget
            alone = self._alone_bits
            if alone is None:
                assert self._alone is not None
                alone = self._alone_bits = self._alone() & self.nodes
            hit = self._cache[bit] = bool(alone & bit)
        return hit

    def spend(self) -> None:
        self._budget.spend()

    def has_also(self) -> bool:
        return self._also is not None

    def has_contains_fit(self) -> bool:
        return self._contains is not None

    def contains_fit(self, bits: int) -> bool:
        """Some fitting mask contains `bits` (needs ``has_contains_fit()``)."""
        assert self._contains is not None
        return bool(self._contains(NumaMask.from_bits(bits)))

    def prefers(self, bits: int) -> bool:
        if bits.bit_count() != self.min_size and self._also is None:
            return False  # not of the preferred width: whether it fits does not matter
        if not self.fits(bits):
            return False
        if bits.bit_count() == self.min_size:
            return True
        return self._also is not None and bool(self._also(NumaMask.from_bits(bits)))


Finite = tuple[tuple["int | None", bool], ...]  # (raw mask bits or None, preferred)


def _finite(hs: HintSet) -> Finite:
    if hs.kind == "none":
        return ((None, True),)
    if hs.kind == "impossible":
        return ((None, False),)
    hints = tuple((None if h.mask is None else h.mask.bits, bool(h.preferred)) for h in hs.explicit_hints)
    return hints or ((None, False),)


def _single_numa_filter(hs: HintSet, gen: _Gen | None) -> Finite:
    """The hints single-numa-node keeps: {any, preferred} and preferred single nodes."""
    if gen is None:
        return tuple(h for h in _finite(hs) if h[1] and (h[0] is None or h[0].bit_count() == 1))
    if gen.min_size == 1 and hs.fits_alone is not None:
        # Every fitting node is preferred at width 1: asked all at once.
        gen.spend()
        return tuple((1 << n, True) for n in NumaMask.nodes_of(hs.fits_alone() & gen.nodes))
    return tuple((1 << n, True) for n in NumaMask.nodes_of(gen.nodes) if gen.prefers(1 << n))


# --------------------------------------------------------------------------
# Exact merge of finite lists: deduplicated dynamic programme.

_ALL_NIL = -1   # preferred so far, every mask seen was nil
_NOT_PREF = -2  # some hint was not preferred or masks differed


def _merge_finite(lists: Sequence[Finite], all_bits: int, order: _Order) -> tuple[int, bool]:
    states = {(all_bits, _ALL_NIL)}
    for hints in lists:
        nxt = set()
        index = None
        for eff, pref in states:
            candidates: Sequence[tuple[int | None, bool]] = hints
            if not eff & (eff - 1) and len(hints) > _INDEX_FROM:
                # A one-node state merges only with the hints holding that node
                # (the others leave it empty): single-numa-node's common case.
                if index is None:
                    index = _by_node(hints)
                candidates = index[0].get(eff, index[1])
            for raw, preferred in candidates:
                merged = eff if raw is None else eff & raw
                if not merged:
                    continue  # an empty merged mask never wins and never recovers
                if pref == _NOT_PREF or not preferred:
                    new_pref = _NOT_PREF
                elif raw is None:
                    new_pref = pref
                elif pref == _ALL_NIL or pref == raw:
                    new_pref = raw
                else:
                    new_pref = _NOT_PREF
                nxt.add((merged, new_pref))
        states = nxt
        if not states:
            return all_bits, False
    preferred_masks = [eff for eff, pref in states if pref != _NOT_PREF]
    if preferred_masks:
        return min(preferred_masks, key=order.key), True
    best_count = _best_non_preferred_count(lists)
    return min((eff for eff, _ in states), key=lambda b: order.non_preferred_key(b, best_count)), False


def _merge_single_nodes(lists: Sequence[Finite], all_bits: int, order: _Order) -> tuple[int, bool]:
    """_merge_finite over lists of preferred hints that are each nil or one
    node (what _single_numa_filter keeps), without the state sets: a node
    merges to itself when every list names it or holds a nil and one names
    it; the nil alone survives when every list holds one."""
    common, named, every_nil = all_bits, 0, True
    for hints in lists:
        nodes, nil = 0, False
        for raw, preferred in hints:
            if not preferred or (raw is not None and raw & (raw - 1)):
                return _merge_finite(lists, all_bits, order)  # not of that form
            if raw is None:
                nil = True
            else:
                nodes |= raw
        if not nil:
            common &= nodes
            every_nil = False
        named |= nodes
    single = common & named
    if single:
        return min(NumaMask.single_bits(single), key=order.key), True
    return all_bits, every_nil


# Lists longer than this are indexed by node when a one-node state meets them.
_INDEX_FROM = 4


def _by_node(hints: Finite) -> tuple[dict[int, list[tuple[int | None, bool]]], list[tuple[int | None, bool]]]:
    """(node (its single-bit mask) -> the hints whose mask holds it, nil hints
    included; the nil hints alone, for a node no mask names)."""
    nils = [h for h in hints if h[0] is None]
    out: dict[int, list[tuple[int | None, bool]]] = {}
    for hint in hints:
        raw = hint[0]
        while raw:
            low = raw & -raw
            bucket = out.get(low)
            if bucket is None:
                bucket = out[low] = list(nils)
            bucket.append(hint)
            raw ^= low
    return out, nils


def _best_non_preferred_count(lists: Sequence[Finite]) -> int:
    """The widest of the resources' narrowest non-nil masks (raw widths)."""
    best = 0
    for hints in lists:
        widths = [raw.bit_count() for raw, _ in hints if raw is not None]
        if widths:
            best = max(best, min(widths))
    return best


# --------------------------------------------------------------------------
# Merge with generated sets.

def _preferred_phase(finite: list[Finite], gens: list[_Gen], all_bits: int, order: _Order,
                     budget: _Budget) -> int | None:
    """The best preferred merged mask, or None when no combination is preferred."""
    nil_ok = [any(raw is None and p for raw, p in hints) for hints in finite]
    restrictive = [hints for hints, ok in zip(finite, nil_ok, strict=True) if not ok]
    pref_sets = [{raw for raw, p in hints if p and raw is not None} for hints in finite]

    def everyone_prefers(raw: int) -> bool:
        if not raw & all_bits:
            return False
        for ok, prefs in zip(nil_ok, pref_sets, strict=True):
            if not ok and raw not in prefs:
                return False
        return all(g.prefers(raw) for g in gens)

    if not gens and not restrictive:
        candidates = {all_bits} | {raw & all_bits for prefs in pref_sets for raw in prefs if raw & all_bits}
        return min(candidates, key=order.key)
    if restrictive:
        smallest = min((s for s, ok in zip(pref_sets, nil_ok, strict=True) if not ok), key=len)
        hits = [raw & all_bits for raw in smallest if everyone_prefers(raw)]
        return min(hits, key=order.key) if hits else None

    common = all_bits
    for g in gens:
        common &= g.nodes
    strict = {g.min_size for g in gens if not g.has_also()}
    if len(strict) > 1:
        return None
    start = max(max(g.min_size for g in gens), 1)
    widths: Iterable[int]
    if strict:
        widths = [w for w in strict if w >= start]
    else:
        widths = range(start, common.bit_count() + 1)
    # One node wide, a set of width 1 prefers exactly the nodes that fit alone.
    singles = all(g.min_size == 1 and g.answers_alone() for g in gens)
    for width in widths:
        if width == 1 and singles:
            found = _first_single_node(common, gens, order, budget)
            if found is not None:
                return found
            continue
        for bits in order.subsets(common, width, budget):
            budget.spend()
            if all(g.prefers(bits) for g in gens):
                return bits  # subsets come best first
    return None


def _first_single_node(common: int, gens: list[_Gen], order: _Order, budget: _Budget) -> int | None:
    """The best one-node mask of `common` that every set (each of min_size 1)
    fits alone, walked in the order's sequence; None when there is none."""
    for bits in order.subsets(common, 1, budget):
        budget.spend()
        for g in gens:
            if not g.fits_single(bits):
                break
        else:
            return bits
    return None


def _narrowest_fit(gen: _Gen, budget: _Budget) -> int | None:
    """Width of the generated set's narrowest fitting mask (None: no mask fits)."""
    if gen.monotone and not gen.fits(gen.nodes):
        return None
    for width in range(max(gen.min_size, 1), gen.nodes.bit_count() + 1):
        for bits in _gosper(NumaMask.nodes_of(gen.nodes), width):
            if gen.fits(bits):
                return width
    return None


def _any_superset(gen: _Gen, x: int, budget: _Budget) -> bool:
    if gen.monotone:
        return True  # caller checked x <= nodes; the whole node set fits
    if gen.fits(x) or gen.fits(gen.nodes):
        return True
    if gen.has_contains_fit():
        budget.spend()
        return gen.contains_fit(x)
    return any(True for _ in _supersets(gen, x, budget))


def _supersets(gen: _Gen, x: int, budget: _Budget) -> Iterator[int]:
    """The minimal traces (fitting superset minus x) of a non-monotone set.
    Callers intersect traces and ask whether the rest can be excluded, which
    only gets easier with fewer nodes, so a trace that contains another adds
    nothing and is not tried."""
    free = NumaMask.nodes_of(gen.nodes & ~x)
    found: list[int] = []
    for k in range(len(free) + 1):
        for extra in (_gosper(free, k) if k else iter((0,))):
            budget.spend()
            if any(extra & t == t for t in found):
                continue
            if gen.fits(x | extra):
                found.append(extra)
                yield extra


def _can_exclude(state: int, monos: list[_Gen], x: int, budget: _Budget) -> bool:
    """Can the monotone sets pick fitting masks (each containing x) whose
    intersection misses every node of `state`? Each node must be left out by
    at least one set; a set leaves out for free the nodes it does not span."""
    todo = state
    for g in monos:
        todo &= g.nodes
    if not todo:
        return True
    if not monos:
        return False
    nodes = NumaMask.nodes_of(todo)
    dropped = [0] * len(monos)

    def assign(i: int) -> bool:
        if i == len(nodes):
            return True
        bit = 1 << nodes[i]
        for j, g in enumerate(monos):
            budget.spend()
            trial = dropped[j] | bit
            if g.fits(g.nodes & ~trial):
                dropped[j] = trial
                if assign(i + 1):
                    return True
                dropped[j] = trial & ~bit
        return False

    return assign(0)


def _achievable(x: int, finite: list[Finite], gens: list[_Gen], all_bits: int, budget: _Budget) -> bool:
    """Do some hints, one per resource, intersect (within all nodes) to exactly x?"""
    rest = all_bits & ~x
    traces: list[set[int]] = []
    exact_somewhere = False
    for hints in finite:
        found = set()
        for raw, _ in hints:
            eff = all_bits if raw is None else raw & all_bits
            if eff & x == x:
                found.add(eff & rest)
        if not found:
            return False
        exact_somewhere = exact_somewhere or 0 in found
        traces.append(found)
    for g in gens:
        if x & ~g.nodes:
            return False
        if g.fits(x):
            exact_somewhere = True
    if exact_somewhere:
        return all(_any_superset(g, x, budget) for g in gens if not g.fits(x))
    monos = [g for g in gens if g.monotone]
    for g in gens:
        if not g.monotone:
            if not _any_superset(g, x, budget):
                return False  # cheap with an oracle: spares the enumeration below
            found = set(_supersets(g, x, budget))
            if not found:
                return False
            traces.append(found)
    states = {rest}
    for found in traces:
        states = {s & t for s in states for t in found}
        budget.spend(len(states))
    return any(_can_exclude(s, monos, x, budget) for s in sorted(states, key=lambda b: (b.bit_count(), b)))


def _non_preferred_phase(finite: list[Finite], gens: list[_Gen], all_bits: int, order: _Order,
                         budget: _Budget) -> int | None:
    best_count = _best_non_preferred_count(finite)
    live = []
    for g in gens:
        width = _narrowest_fit(g, budget)
        if width is None:
            finite = finite + [((None, False),)]  # nothing fits: "cannot satisfy"
        else:
            best_count = max(best_count, width)
            live.append(g)
    universe = all_bits
    for g in live:
        universe &= g.nodes
    for hints in finite:
        spanned, nil = 0, False  # a nil hint spans every node
        for raw, _ in hints:
            if raw is None:
                nil = True
                break
            spanned |= raw
        if not nil:
            universe &= spanned
    size = universe.bit_count()
    widths = ([best_count] if 1 <= best_count <= size else []) \
        + list(range(min(best_count - 1, size), 0, -1)) + list(range(best_count + 1, size + 1))
    for width in widths:
        for bits in order.subsets(universe, width, budget):
            budget.spend()
            if _achievable(bits, finite, live, all_bits, budget):
                return bits
    return None


def _merge(providers: Sequence[ProviderInput], numa_nodes: Sequence[int] | NumaMask, policy: str,
           options: TopologyManagerOptions | None, distances, budget_limit: int = FITS_BUDGET,
           tie: TieScore | None = None, closeness: Closeness | None = None) -> tuple[TopologyHint, bool]:
    check_policy(policy)
    options = options or TopologyManagerOptions()
    if policy == "none":
        return TopologyHint(None, True), True
    all_bits = NumaMask.bits_of(numa_nodes)
    if not all_bits:
        raise ValueError("merge needs at least one NUMA node")
    order = _Order(options.prefer_closest_numa_nodes and policy != "single-numa-node", distances, all_bits, tie,
                   closeness)
    budget = _Budget(budget_limit)
    finite: list[Finite] = []
    gens: list[_Gen] = []
    # One fits() cache per fits function (kept alive by its hint set during the merge).
    caches: dict[int, dict[int, bool]] = {}
    for index, name, hs in provider_resources(providers):
        if hs.kind == "generated":
            gen = _Gen(hs, budget, caches.setdefault(id(hs.fits), {}))
            if gen.nodes & ~all_bits:
                raise ValueError(
                    f"provider {index} resource {name!r}: generated hints span NUMA nodes "
                    f"{list(NumaMask.nodes_of(gen.nodes & ~all_bits))} that are not among the machine's {list(numa_nodes)}")
            gens.append(gen)
            if policy == "single-numa-node":
                finite.append(_single_numa_filter(hs, gen))
        elif policy == "single-numa-node":
            finite.append(_single_numa_filter(hs, None))
        else:
            finite.append(_finite(hs))
    try:
        if policy == "single-numa-node":
            bits, preferred = _merge_single_nodes(finite, all_bits, order)
            mask = None if bits == all_bits else NumaMask.from_bits(bits)
            return TopologyHint(mask, preferred), True
        if not gens:
            bits, preferred = _merge_finite(finite, all_bits, order)
            return TopologyHint(NumaMask.from_bits(bits), preferred), True
        preferred_bits = _preferred_phase(finite, gens, all_bits, order, budget)
        if preferred_bits is not None:
            return TopologyHint(NumaMask.from_bits(preferred_bits), True), True
        other_bits = _non_preferred_phase(finite, gens, all_bits, order, budget)
        return TopologyHint(NumaMask.from_bits(all_bits if other_bits is None else other_bits), False), True
    except _OverBudget:
        mask = None if policy == "single-numa-node" else NumaMask.from_bits(all_bits)
        return TopologyHint(mask, False), False


def merge(providers: Sequence[ProviderInput], numa_nodes: Sequence[int] | NumaMask, policy: str,
          options: TopologyManagerOptions | None = None,
          distances: Mapping[int, Mapping[int, int]] | None = None, tie: TieScore | None = None) -> TopologyHint:
    """The merged hint for the providers' hints (see the module doc); `tie`: the
    numa-allocation-strategy's rank of equally good sets (None: the lowest mask)."""
    return _merge(providers, numa_nodes, policy, options, distances, tie=tie)[0]


def admit(policy: str, merged: TopologyHint) -> bool:
    """best-effort and none always admit; restricted and single-numa-node
    admit only a preferred merged hint."""
    return check_policy(policy).admits(bool(merged.preferred))


# What the merge says of the alignment, apart from the admission's outcome
# (best-effort admits "not-aligned"; a request aligned here can still be
# refused by a provider's allocation).
ALIGNED, NOT_ALIGNED, NOT_CHECKED = "aligned", "not-aligned", "not-checked"


def verdict(policy: str, merged: TopologyHint) -> str:
    """"aligned" when the merged hint is preferred, "not-aligned" when not,
    "not-checked" under policy none, which merges nothing."""
    if policy == "none":
        return NOT_CHECKED
    return ALIGNED if merged.preferred else NOT_ALIGNED


# --------------------------------------------------------------------------
# Decisions with explanations.

SUMMARY_LIMIT = 4  # hints listed per resource; the rest are counted
# Up to this many nodes a summary lists and counts every hint (2^N masks);
# beyond, only a few preferred examples, so explaining never costs more than
# deciding.
FULL_SUMMARY_NODES = 4


@dataclass(frozen=True, slots=True)
class HintSummary:
    """A short account of one provider's hints for one resource;
    ``dict(summary)`` gives provider, resource, hints, more."""

    provider: int
    resource: str
    hints: tuple[str, ...]
    more: int          # hints not listed (-1: not counted, too many to enumerate)

    def __iter__(self):
        yield "provider", self.provider
        yield "resource", self.resource
        yield "hints", list(self.hints)
        yield "more", self.more

    def text(self) -> str:
        listed = ", ".join(self.hints)
        if self.more > 0:
            listed += f", +{self.more} more"
        elif self.more < 0:
            listed += ", + wider masks"
        return f"[{listed}]"


def _summarize(index: int, name: str, hs: HintSet) -> HintSummary:
    label = name or "(no resources)"
    if hs.kind == "none":
        return HintSummary(index, label, ("any preferred",), 0)
    if hs.kind == "impossible":
        return HintSummary(index, label, ("none: cannot satisfy",), 0)
    if hs.kind == "explicit":
        hints = sorted(hs.explicit_hints, key=lambda h: (not h.preferred, h.mask is not None,
                                                         h.mask.sort_key() if h.mask else (0, 0)))
        shown = tuple(str(h) for h in hints[:SUMMARY_LIMIT])
        return HintSummary(index, label, shown, len(hints) - len(shown))
    nodes = hs.nodes.nodes() if hs.nodes is not None else ()
    if len(nodes) <= FULL_SUMMARY_NODES:
        hints = sorted(hs.hints(), key=_generated_hint_key)
        if not hints:
            return HintSummary(index, label, ("none: no NUMA node set fits",), 0)
        shown = tuple(str(h) for h in hints[:SUMMARY_LIMIT])
        return HintSummary(index, label, shown, len(hints) - len(shown))
    # Large machine: a few preferred examples only, never an enumeration.
    fits = hs.fits
    assert fits is not None, "a generated hint set has fits()"
    examples: list[str] = []
    tried = 0
    if hs.min_size == 1 and hs.fits_alone is not None and hs.nodes is not None:
        # One-node masks come in node order: the first nodes that fit alone,
        # all answered at once (the walk below would try at most 64 masks).
        alone = NumaMask.nodes_of(hs.fits_alone() & hs.nodes.bits)[:SUMMARY_LIMIT]
        examples = [f"{TopologyHint(NumaMask.from_bits(1 << n), True)}" for n in alone]
    elif hs.min_size >= 1:
        for bits in _gosper(list(nodes), hs.min_size):
            tried += 1
            if tried > 2000 or len(examples) >= SUMMARY_LIMIT:
                break
            mask = NumaMask.from_bits(bits)
            if fits(mask):
                examples.append(f"{TopologyHint(mask, True)}")
    return HintSummary(index, label, tuple(examples) or (f"no {hs.min_size}-node set fits",), -1)


def _generated_hint_key(h: TopologyHint) -> tuple[bool, tuple[int, int]]:
    # A generated hint always has a mask; (0, 0) only keeps the key total.
    return (not h.preferred, h.mask.sort_key() if h.mask is not None else (0, 0))


@dataclass(frozen=True, slots=True)
class MergeResult:
    merged: TopologyHint
    admit: bool
    policy: str
    providers: Sequence[ProviderInput] = field(default=(), compare=False, repr=False)
    exact: bool = True  # False: the search budget ran out (see module doc)

    @property
    def verdict(self) -> str:
        return verdict(self.policy, self.merged)

    @property
    def provider_summaries(self) -> tuple[HintSummary, ...]:
        """Every provider's hints, summarised: made on demand (for a refusal or an
        explanation), as an admission needs only the merged hint."""
        return tuple(_summarize(i, name, hs) for i, name, hs in provider_resources(self.providers))

    def explanation(self) -> str:
        hints = ", ".join(f"{s.resource} hints {s.text()}" for s in self.provider_summaries) or "no hints"
        merged = "any" if self.merged.mask is None else "{" + self.merged.mask.format() + "}"
        state = "preferred" if self.merged.preferred else "not preferred"
        if self.admit:
            return f"admitted by policy {self.policy}: {hints}; merged {merged} {state}"
        rule = TopologyPolicy(self.policy).rule
        return f"TopologyAffinityError: {hints}; merged {merged} {state}; {rule}"


def merge_hints(providers: Sequence[ProviderInput], numa_nodes: Sequence[int] | NumaMask, policy: str,
           options: TopologyManagerOptions | None = None,
           distances: Mapping[int, Mapping[int, int]] | None = None, tie: TieScore | None = None,
           closeness: Closeness | None = None) -> MergeResult:
    """Merge and admit; the result summarises every provider's hints when asked.
    `closeness`: the machine's Closeness over `distances`, kept across merges."""
    merged, exact = _merge(providers, numa_nodes, policy, options, distances, tie=tie, closeness=closeness)
    return MergeResult(merged, admit(policy, merged), policy, providers, exact)


__all__ = [
    "POLICIES", "SCOPES", "FITS_BUDGET", "Closeness", "TopologyConfigError", "TopologyManagerOptions", "missing_distance",
    "HintSummary", "MergeResult", "merge", "admit", "verdict", "merge_hints", "provider_resources",
    "ALIGNED", "NOT_ALIGNED", "NOT_CHECKED",
    "check_policy", "check_scope",
]
