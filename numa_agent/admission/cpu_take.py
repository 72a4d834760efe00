"""Choosing which free CPUs satisfy a request: the static policy's best fit.

Two algorithms, with the kubelet's behaviour (so a workload moved from a
Kubernetes node gets the same CPUs here):

- `take_by_topology` (packed): take whole NUMA nodes and whole sockets the
  request can use up (NUMA nodes first iff the header has at least as many
  sockets as NUMA nodes), then whole uncore (L3) groups when asked to, then
  whole cores, then single threads. Candidates are visited fullest first
  (fewest free CPUs), ties by lower id, so allocations pack together and large
  free blocks stay intact. `distribute-cpus-across-cores` skips the whole-core
  step and hands out threads socket by socket, spreading over cores.
- `take_by_topology_distributed`: spread the request evenly, in groups of
  `cpu_group_size` CPUs, over the fewest NUMA nodes that can hold it, picking
  the node set that leaves free CPUs best balanced across the machine.

Everything works on int bitmasks (CpuSet.bits) and sorts with explicit keys,
so results never depend on dict or set iteration order.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Iterable, Iterator, Mapping, Sequence

from numa_agent.admission.cpu_options import CpuManagerOptions
from numa_agent.admission.cpu_topology import CpuTopology
from numa_agent.admission.errors import CpuAllocationError
from numa_agent.core.cpuset import CpuSet

__all__ = ["CpuAllocationError", "MAX_COMBINATIONS", "take_by_topology", "take_by_topology_distributed"]

# n-choose-k NUMA combinations examined per size before the distributed
# search settles for the single most promising combination. The kubelet caps
# machines at 8 NUMA nodes; 64-node machines would otherwise never finish.
MAX_COMBINATIONS = 20_000


class _Accumulator:
    """Free CPUs being claimed one group at a time (the kubelet's accumulator)."""

    def __init__(self, topo: CpuTopology, available: CpuSet, count: int, spread: bool) -> None:
        self.topo = topo
        self.free = available.bits & topo.all_cpus.bits
        self.needed = count
        self.result = 0
        self.spread = spread
        groups = topo.group_bits  # computed once per topology, not per request
        self._numa = groups["numa"]
        self._socket = groups["socket"]
        self._core = groups["core"]
        self._uncore = groups["uncore"]

    # ---- state ------------------------------------------------------------
    def take(self, bits: int) -> None:
        self.result |= bits
        self.free &= ~bits
        self.needed -= bits.bit_count()

    def satisfied(self) -> bool:
        return self.needed < 1

    def failed(self) -> bool:
        return self.needed > self.free.bit_count()

    def free_in(self, bits: int) -> int:
        return (self.free & bits).bit_count()

    def free_of_numa(self, numa: int) -> CpuSet:
        """The free CPUs of one NUMA node."""
        return CpuSet.from_bits(self.free & self._numa[numa])

    # ---- orderings ----------------------------------------------------------
    # Each ordering sorts (free CPUs, id) pairs: fullest first, ties by lower
    # id, with no Python key function called per candidate.
    def _fullest_first(self, ids: Sequence[int], groups: dict[int, int]) -> list[int]:
        free = self.free
        keyed = [((free & groups[i]).bit_count(), i) for i in ids]
        keyed.sort()
        return [i for _, i in keyed]

    def _live_fullest_first(self, parent_bits: int, child_ids: Sequence[int], groups: dict[int, int],
                            free: int | None = None) -> list[int]:
        """Children that still have a free CPU inside `parent_bits`, fullest
        first (`free`: the free CPUs to read, default the current ones)."""
        if free is None:
            free = self.free
        live = free & parent_bits
        if not live:
            return []
        keyed = [((free & groups[c]).bit_count(), c) for c in child_ids if groups[c] & live]
        keyed.sort()
        return [c for _, c in keyed]

    @staticmethod
    def _dedupe(ids: list[int]) -> list[int]:
        # A group reached through two parents (a socket spanning two NUMA nodes
        # on the NUMA-first path) is visited once, at its first position.
        return list(dict.fromkeys(ids))

    def sorted_numas(self) -> list[int]:
        topo, free = self.topo, self.free
        if free:
            # Free CPUs on one node only (an allocation inside a one-node
            # affinity, the common case): that node is the whole order.
            only = topo.numa_of_cpu[(free & -free).bit_length() - 1]
            if not free & ~self._numa[only]:
                return [only]
        if topo.numa_first:
            live = [n for n in topo.numa_ids if self._numa[n] & self.free]
            return self._fullest_first(live, self._numa)
        out: list[int] = []
        for socket in self.sorted_sockets():
            out.extend(self._live_fullest_first(self._socket[socket], topo.numas_of_socket[socket], self._numa))
        return self._dedupe(out)

    def sorted_sockets(self) -> list[int]:
        topo = self.topo
        if not topo.numa_first:
            live = [s for s in topo.socket_ids if self._socket[s] & self.free]
            return self._fullest_first(live, self._socket)
        out: list[int] = []
        for numa in self.sorted_numas():
            out.extend(self._live_fullest_first(self._numa[numa], topo.sockets_of_numa[numa], self._socket))
        return self._dedupe(out)

    def _core_parents(self) -> tuple[list[int], dict[int, int], Mapping[int, Sequence[int]]]:
        """The groups cores are ordered within: (their ids in order, their bits,
        their cores): sockets on a NUMA-first machine, else NUMA nodes."""
        topo = self.topo
        if topo.numa_first:
            return self.sorted_sockets(), self._socket, topo.cores_of_socket
        return self.sorted_numas(), self._numa, topo.cores_of_numa

    def sorted_cores(self) -> Iterator[int]:
        """The cores with a free CPU, fullest first within each parent in the
        parents' order, each once; made parent by parent as they are read:
        single threads need the first few cores, not every core of the
        machine ordered. What is free is read before the first core comes,
        so the order is the one a list made at once would have."""
        free = self.free
        parents, parent_bits, kids_of = self._core_parents()
        seen: set[int] = set()  # a core reached through two parents comes at its first place
        for parent in parents:
            for c in self._live_fullest_first(parent_bits[parent], kids_of[parent], self._core, free):
                if c not in seen:
                    seen.add(c)
                    yield c

    def sorted_uncores(self) -> list[int]:
        out: list[int] = []
        for numa in self.sorted_numas():
            out.extend(self._live_fullest_first(self._numa[numa], self.topo.uncores_of_numa[numa], self._uncore))
        return self._dedupe(out)

    # ---- taking whole groups ----------------------------------------------
    def take_full_numas(self) -> None:
        if self.needed < self.topo.smallest_group["numa"]:
            return  # no node is small enough to be taken whole
        for numa in [n for n in self.sorted_numas() if self._numa[n] & ~self.free == 0]:
            bits = self._numa[numa]
            if self.needed >= bits.bit_count():
                self.take(bits)

    def take_full_sockets(self) -> None:
        if self.needed < self.topo.smallest_group["socket"]:
            return  # no socket is small enough to be taken whole
        per_socket = self.topo.cpus_per_socket
        for socket in [s for s in self.sorted_sockets() if self.free_in(self._socket[s]) == per_socket]:
            bits = self._socket[socket] & self.free
            if self.needed >= self._socket[socket].bit_count():
                self.take(bits)

    def take_first_level(self) -> None:
        if self.topo.numa_first:
            self.take_full_numas()
        else:
            self.take_full_sockets()

    def take_second_level(self) -> None:
        if self.topo.numa_first:
            self.take_full_sockets()
        else:
            self.take_full_numas()

    def take_full_uncores(self) -> None:
        for uncore in [u for u in self.sorted_uncores() if self._uncore[u] & ~self.free == 0]:
            bits = self._uncore[uncore]
            if self.needed >= bits.bit_count():
                self.take(bits)

    def take_partial_uncore(self, uncore: int) -> None:
        """Claim the request's remainder inside one uncore group, from its
        lowest-numbered free cores, or nothing if the group cannot hold it."""
        per_core = self.topo.cpus_per_core
        cores_needed = -(-self.needed // per_core)
        live = self.free & self._uncore[uncore]
        cores = [c for c in self.topo.cores_of_uncore[uncore] if self._core[c] & live][:cores_needed]
        bits = 0
        for c in cores:
            bits |= self._core[c] & self.free
        if self.needed % 2 and per_core > 1 and bits.bit_count() > self.needed:
            # An odd remainder needs one thread of the last core: drop the
            # highest-numbered CPU so the others stay whole cores.
            bits &= ~(1 << (bits.bit_length() - 1))
        if bits.bit_count() == self.needed:
            self.take(bits)

    def take_uncore_caches(self) -> None:
        per_uncore = self.topo.cpus_per_uncore
        for uncore in self.sorted_uncores():
            if self.needed >= per_uncore:
                self.take_full_uncores()
            if self.satisfied():
                return
            self.take_partial_uncore(uncore)
            if self.satisfied():
                return

    def take_full_cores(self) -> None:
        size = self.topo.core_size
        if not size:
            for core in [c for c in self.sorted_cores() if self._core[c] & ~self.free == 0]:
                bits = self._core[core]
                if self.needed >= bits.bit_count():
                    self.take(bits)
            return
        if self.needed < size:
            return
        # Cores all of one size: the wholly free ones share one key, so in
        # sorted_cores() they come by id within each parent, unsorted.
        for core in self._whole_cores_by_parent():
            if self.needed < size:
                return
            self.take(self._core[core])

    def _whole_cores_by_parent(self) -> Iterator[int]:
        """The wholly free cores, parent by parent in the parents' order, each
        once. Made as taken: a request needs the first few, not every free
        core of the machine; what is free is read before the first is taken,
        so the order is the one a list made at once would have."""
        free, groups = self.free, self._core
        parents, parent_bits, kids_of = self._core_parents()
        busy = ~free
        seen: set[int] = set()  # a core reached through two parents comes at its first place
        for parent in parents:
            if free & parent_bits[parent]:
                for c in kids_of[parent]:
                    if not groups[c] & busy and c not in seen:
                        seen.add(c)
                        yield c

    def take_remaining(self) -> None:
        """Single threads, lowest id first within each group of the order
        (cores fullest first; sockets when spreading), straight from the
        bits: no set of ids is made per group."""
        order: Iterable[int]
        if self.spread:
            groups, order = self._socket, self.sorted_sockets()
        else:
            groups, order = self._core, self.sorted_cores()
        free = self.free  # the order's snapshot: only what is taken below leaves it
        for group in order:
            bits = free & groups[group]
            while bits:
                if self.needed < 1:
                    return
                low = bits & -bits
                bits ^= low
                self.take(low)


def _not_enough(count: int, available: CpuSet) -> CpuAllocationError:
    return CpuAllocationError(
        f"not enough cpus available to satisfy request: requested={count}, available={len(available)}"
    )


def _check_count(count: int) -> None:
    if count < 0:
        raise CpuAllocationError(f"cannot allocate a negative number of cpus: requested={count}")


def take_by_topology(
    topo: CpuTopology,
    available: CpuSet,
    count: int,
    options: CpuManagerOptions | None = None,
) -> CpuSet:
    """The packed best fit. Reads `options.distribute_cpus_across_cores`
    (spread threads over cores) and `options.prefer_align_cpus_by_uncorecache`."""
    spread = bool(options and options.distribute_cpus_across_cores)
    by_uncore = bool(options and options.prefer_align_cpus_by_uncorecache)
    return _take_packed(topo, available, count, spread, by_uncore)


def _take_packed(topo: CpuTopology, available: CpuSet, count: int, spread: bool, by_uncore: bool) -> CpuSet:
    _check_count(count)
    acc = _Accumulator(topo, available, count, spread)
    if acc.satisfied():
        return CpuSet()
    if acc.failed():
        raise _not_enough(count, available)

    for step in (acc.take_first_level, acc.take_second_level):
        step()
        if acc.satisfied():
            return CpuSet.from_bits(acc.result)
    if by_uncore:
        acc.take_uncore_caches()
        if acc.satisfied():
            return CpuSet.from_bits(acc.result)
    if not spread:
        acc.take_full_cores()
        if acc.satisfied():
            return CpuSet.from_bits(acc.result)
    acc.take_remaining()
    if acc.satisfied():
        return CpuSet.from_bits(acc.result)
    raise CpuAllocationError(f"failed to allocate cpus: requested={count}, available={len(available)}")


# ---- NUMA-distributed ---------------------------------------------------------

def _balance(values: Sequence[int]) -> float:
    """Population standard deviation, rounded to 3 decimals (half away from
    zero) so float noise cannot decide between equally balanced choices."""
    n = len(values)
    if n == 0:
        return 0.0
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    return math.floor(sd * 1000 + 0.5) / 1000


def _spread_remainder(after: dict[int, int], subset: Sequence[int], remainder: int, group: int) -> bool:
    """Take `remainder` CPUs from `subset` in rounds of `group` CPUs per node,
    updating `after`; False when the subset cannot absorb it in whole groups."""
    while remainder > 0:
        progressed = False
        for numa in subset:
            if remainder == 0:
                break
            if after[numa] < group:
                continue
            after[numa] -= group
            remainder -= group
            progressed = True
        if not progressed:
            return False
    return True


def _combos(ids: Sequence[int], k: int, weight: dict[int, int]):
    """All k-subsets of `ids` in order, or, past MAX_COMBINATIONS, only the k
    members with the most weight (ties by position), kept in list order."""
    if math.comb(len(ids), k) <= MAX_COMBINATIONS:
        return combinations(ids, k)
    pos = {n: i for i, n in enumerate(ids)}
    best = sorted(ids, key=lambda n: (-weight[n], pos[n]))[:k]
    return iter([tuple(sorted(best, key=pos.__getitem__))])


def _score_combo(combo: tuple[int, ...], numas: Sequence[int], free_of: dict[int, int], count: int,
                 group: int) -> tuple[float, tuple[int, ...]] | None:
    """The balance an even share over `combo` leaves (and the nodes that take
    the remainder), or None when the combo cannot hold the request."""
    if sum(free_of[n] for n in combo) < count:
        return None
    if sum(free_of[n] // group for n in combo) * group < count:
        return None
    share = (count // len(combo) // group) * group
    if any(free_of[n] < share for n in combo):
        return None
    after = dict(free_of)
    for n in combo:
        after[n] -= share
    remainder = count - share * len(combo)
    if remainder == 0:
        return _balance([after[n] for n in numas]), ()
    return _best_remainder(after, combo, numas, remainder, group)


def _best_remainder(after: dict[int, int], combo: tuple[int, ...], numas: Sequence[int], remainder: int,
                    group: int) -> tuple[float, tuple[int, ...]]:
    """The nodes of `combo` that best take the remainder, largest sets first."""
    best, best_subset = math.inf, ()
    candidates = [n for n in combo if after[n] >= group]
    for size in range(len(candidates), 0, -1):
        for subset in _combos(candidates, size, after):
            if sum(after[n] for n in subset) < remainder:
                continue
            trial = dict(after)
            if not _spread_remainder(trial, subset, remainder, group):
                continue
            score = _balance([trial[n] for n in numas])
            if score < best:
                best, best_subset = score, subset
    return best, best_subset


def _best_combo(numas: Sequence[int], k: int, free_of: dict[int, int], count: int,
                group: int) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """The k-node set that leaves free CPUs best balanced, and its remainder nodes."""
    best_balance = math.inf
    best_combo: tuple[int, ...] | None = None
    best_remainder: tuple[int, ...] = ()
    for combo in _combos(numas, k, free_of):
        if best_balance == 0:
            break
        scored = _score_combo(combo, numas, free_of, count, group)
        if scored is not None and scored[0] < best_balance:
            best_balance, best_combo, best_remainder = scored[0], combo, scored[1]
    return best_combo, best_remainder


def _take_combo(acc: _Accumulator, combo: tuple[int, ...], remainder_nodes: tuple[int, ...], count: int,
                group: int) -> CpuSet:
    """Take the even share from every node of `combo`, then the remainder
    group by group from `remainder_nodes`."""
    topo, spread = acc.topo, acc.spread
    share = (count // len(combo) // group) * group
    for n in combo:
        acc.take(_take_packed(topo, acc.free_of_numa(n), share, spread, False).bits)
    remainder = count - share * len(combo)
    progressed = True
    while remainder > 0 and progressed:
        progressed = False
        for n in remainder_nodes:
            if remainder == 0:
                break
            node_free = acc.free_of_numa(n)
            if len(node_free) < group:
                continue
            acc.take(_take_packed(topo, node_free, group, spread, False).bits)
            remainder -= group
            progressed = True
    if acc.needed != 0:
        raise CpuAllocationError(
            f"accounting error distributing cpus: requested={count}, left unallocated={acc.needed}"
        )
    return CpuSet.from_bits(acc.result)


def take_by_topology_distributed(
    topo: CpuTopology,
    available: CpuSet,
    count: int,
    cpu_group_size: int = 1,
    options: CpuManagerOptions | None = None,
) -> CpuSet:
    """Spread `count` CPUs evenly over NUMA nodes in groups of
    `cpu_group_size`; falls back to the packed algorithm when the count is not
    a multiple of the group size or no node set can be balanced."""
    _check_count(count)
    if cpu_group_size < 1:
        raise CpuAllocationError(f"cpu group size must be >= 1, got {cpu_group_size}")
    spread = bool(options and options.distribute_cpus_across_cores)
    if count % cpu_group_size:
        return _take_packed(topo, available, count, spread, False)

    acc = _Accumulator(topo, available, count, spread)
    if acc.satisfied():
        return CpuSet()
    if acc.failed():
        raise _not_enough(count, available)

    numas = acc.sorted_numas()
    free_of = {n: len(acc.free_of_numa(n)) for n in numas}

    # Bounds on how many nodes the request can span.
    total_groups = (len(topo.all_cpus) - 1) // cpu_group_size + 1
    groups_per_node = (total_groups - 1) // len(topo.numa_ids) + 1
    groups_needed = (count - 1) // cpu_group_size + 1
    min_nodes = (groups_needed - 1) // groups_per_node + 1
    max_nodes = min(groups_needed, len(numas))

    for k in range(min_nodes, max_nodes + 1):
        combo, remainder_nodes = _best_combo(numas, k, free_of, count, cpu_group_size)
        if combo is not None:
            return _take_combo(acc, combo, remainder_nodes, count, cpu_group_size)
    return _take_packed(topo, available, count, spread, False)
