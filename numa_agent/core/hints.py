"""NUMA masks and topology hints: the vocabulary shared by every hint provider
and the topology manager.

A NumaMask is a set of NUMA node ids kept as an int bitmask (node ids are the
kernel's and may be sparse, e.g. 0, 8, 250..255). Ordering follows the
kubelet's: a mask is *narrower* than another if it has fewer nodes, and among
equally wide masks the numerically smaller bitmask (lower node ids) wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Callable, Iterable, Iterator, Literal, Mapping

from numa_agent.core.cpuset import bits_of_ids

MaskPredicate = Callable[["NumaMask"], bool]


@lru_cache(maxsize=1 << 16)
def _nodes_of_bits(bits: int) -> tuple[int, ...]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return tuple(out)


class NumaMask:
    """The bit helpers (``nodes_of``, ``lowest_node``, ``bits_of``,
    ``single_bits``, ``is_subset_bits``) work on raw int bitmasks too, for the
    hot loops of the managers and the topology manager that keep masks as ints."""

    __slots__ = ("bits",)
    bits: int  # the slot, set once at construction

    def __init__(self, nodes: Iterable[int] = ()) -> None:
        object.__setattr__(self, "bits", bits_of_ids(nodes, "NUMA node"))

    @classmethod
    def from_bits(cls, bits: int) -> "NumaMask":
        m = _new_object(cls)
        _set_mask_bits(m, bits)  # the slot's own setter: cheaper than object.__setattr__
        return m

    def __setattr__(self, name, value):  # immutable
        raise AttributeError("NumaMask is immutable")

    def __reduce__(self):
        return NumaMask.from_bits, (self.bits,)  # copy and pickle build it anew

    # ---- bit helpers on raw bitmasks -------------------------------------
    @staticmethod
    def bits_of(nodes: "NumaMask | Iterable[int]") -> int:
        """The bitmask of a mask or of node ids."""
        return nodes.bits if isinstance(nodes, NumaMask) else NumaMask(nodes).bits

    # The node ids of a bitmask, ascending (cached: masks recur). The cached
    # function itself, not a wrapper around it: it sits in the inner loops.
    nodes_of = staticmethod(_nodes_of_bits)

    @staticmethod
    def lowest_node(bits: int) -> int:
        """The lowest node id of a non-empty bitmask."""
        return (bits & -bits).bit_length() - 1

    @staticmethod
    def single_bits(bits: int) -> Iterator[int]:
        """The one-bit masks of a bitmask, lowest first."""
        while bits:
            low = bits & -bits
            yield low
            bits ^= low

    @staticmethod
    def is_subset_bits(bits: int, of: int) -> bool:
        return bits & ~of == 0

    # ---- the mask as a value ----------------------------------------------
    def nodes(self) -> tuple[int, ...]:
        return _nodes_of_bits(self.bits)

    def lowest(self) -> int | None:
        bits = self.bits
        return None if not bits else (bits & -bits).bit_length() - 1

    def __iter__(self) -> Iterator[int]:
        return iter(self.nodes())

    def count(self) -> int:
        return self.bits.bit_count()

    __len__ = count

    def __bool__(self) -> bool:
        return self.bits != 0

    def __contains__(self, node: object) -> bool:
        return isinstance(node, int) and node >= 0 and bool(self.bits >> node & 1)

    def __and__(self, other: "NumaMask") -> "NumaMask":
        return NumaMask.from_bits(self.bits & other.bits)

    def __or__(self, other: "NumaMask") -> "NumaMask":
        return NumaMask.from_bits(self.bits | other.bits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NumaMask) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash(("NumaMask", self.bits))

    def issubset(self, other: "NumaMask") -> bool:
        return self.bits & ~other.bits == 0

    def sort_key(self) -> tuple[int, int]:
        """Key that sorts narrowest-first, the kubelet's order."""
        return (self.count(), self.bits)

    def __repr__(self) -> str:
        return f"NumaMask({list(self.nodes())})"

    def format(self) -> str:
        return ",".join(str(n) for n in self.nodes())


_new_object = object.__new__
# The slot's descriptor (the class attribute itself reads as an int to type checkers).
_set_mask_bits: Callable[[NumaMask, int], None] = NumaMask.__dict__["bits"].__set__


def masks_of(nodes: Iterable[int]) -> Iterator[NumaMask]:
    """Every non-empty subset of `nodes`, narrowest first, then by bitmask:
    the order in which the kubelet's providers iterate masks."""
    ids = sorted(set(nodes))
    for k in range(1, len(ids) + 1):
        for combo in combinations(ids, k):
            yield NumaMask(combo)


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """A provider's statement: 'I can satisfy the request on `mask`'.
    mask None means 'no NUMA preference'."""

    mask: NumaMask | None
    preferred: bool

    def to_json(self) -> dict:
        return {"mask": None if self.mask is None else list(self.mask.nodes()),
                "preferred": self.preferred}

    @classmethod
    def from_json(cls, data: Mapping) -> "TopologyHint":
        mask = data.get("mask")
        return cls(None if mask is None else NumaMask(mask), bool(data.get("preferred")))

    def __str__(self) -> str:
        m = "any" if self.mask is None else "{" + self.mask.format() + "}"
        return f"{m}{' preferred' if self.preferred else ''}"


HintKind = Literal["none", "impossible", "generated", "explicit"]


def count_fits(counts: Mapping[int, int], need: int,
               required: int = 0) -> tuple[MaskPredicate, Callable[[], int]]:
    """`fits` and `fits_alone` for HintSet.generated where a mask fits when its
    nodes together hold `need` of something counted per node (`counts`: node's
    single-bit mask -> how many) and it covers every node in `required` (bits).
    fits() walks only the set bits of the mask it is asked about, inline: it is
    the merge's inner loop."""
    count_of = counts.get

    def fits(mask: NumaMask) -> bool:
        bits = mask.bits
        if required & ~bits:
            return False
        total = 0
        while bits:
            low = bits & -bits
            total += count_of(low, 0)
            if total >= need:
                return True
            bits ^= low
        return False

    def fits_alone() -> int:
        if required & (required - 1):
            return 0  # required nodes are two or more: no one node covers them
        out = 0
        for low, count in counts.items():
            if count >= need and not required & ~low:
                out |= low
        return out

    return fits, fits_alone


@dataclass(frozen=True, slots=True)
class HintSet:
    """One provider's hints for one resource.

    The kubelet's providers list a hint for every NUMA mask that can hold the
    request (2^N masks on N nodes), preferred iff the mask is as narrow as
    the narrowest mask that could ever hold it. Listing them is exponential,
    so a HintSet can instead carry the rule that generates them:

    - ``no_preference()``: the resource does not care ({nil, preferred}).
    - ``impossible()``: the resource cannot be satisfied ([] in kubelet terms).
    - ``generated(nodes, fits, min_size)``: a hint for every mask M over
      ``nodes`` with ``fits(M)``; preferred iff ``M.count() == min_size``.
    - ``explicit(hints)``: a literal list (conformance vectors, tests).

    ``hints()`` enumerates the kubelet's list; it is exponential in the node
    count and meant for small machines, explanations and tests.
    """

    kind: HintKind
    nodes: NumaMask | None = None
    fits: MaskPredicate | None = None
    min_size: int = 0
    explicit_hints: tuple[TopologyHint, ...] = ()
    # True when every superset (within `nodes`) of a fitting mask fits too,
    # as for CPUs and devices; lets the topology manager skip enumeration.
    monotone: bool = False
    # Masks wider than min_size that are preferred all the same (the CPU
    # manager's align-by-socket option).
    also_preferred: MaskPredicate | None = None
    # "Some fitting mask contains this one", answered without enumerating
    # supersets (the memory manager's group rule makes its hints
    # non-monotone, but this question stays cheap).
    contains_fit: MaskPredicate | None = None
    # The nodes (bits) whose one-node mask fits, all answered at once: what
    # single-numa-node asks of every node, without a fits() call per node.
    fits_alone: Callable[[], int] | None = None

    @classmethod
    def no_preference(cls) -> "HintSet":
        return cls("none")

    @classmethod
    def impossible(cls) -> "HintSet":
        return cls("impossible")

    @classmethod
    def generated(cls, nodes: NumaMask, fits: MaskPredicate, min_size: int,
                  also_preferred: MaskPredicate | None = None, monotone: bool = False,
                  contains_fit: MaskPredicate | None = None,
                  fits_alone: Callable[[], int] | None = None) -> "HintSet":
        return cls("generated", nodes=nodes, fits=fits, min_size=min_size,
                   also_preferred=also_preferred, monotone=monotone, contains_fit=contains_fit,
                   fits_alone=fits_alone)

    def is_preferred(self, mask: NumaMask) -> bool:
        """Preference of a generated hint on `mask` (which must fit)."""
        if mask.count() == self.min_size:
            return True
        return self.also_preferred is not None and self.also_preferred(mask)

    @classmethod
    def explicit(cls, hints: Iterable[TopologyHint] | None) -> "HintSet":
        if hints is None:
            return cls.no_preference()
        hints = tuple(hints)
        return cls("explicit", explicit_hints=hints) if hints else cls.impossible()

    def hints(self) -> list[TopologyHint]:
        if self.kind == "none":
            return [TopologyHint(None, True)]
        if self.kind == "impossible":
            return []
        if self.kind == "explicit":
            return list(self.explicit_hints)
        assert self.nodes is not None and self.fits is not None
        fits = self.fits
        return [TopologyHint(m, self.is_preferred(m)) for m in masks_of(self.nodes.nodes()) if fits(m)]
