"""Benchmark (prints figures, asserts nothing): merge time with 4 CPU-like
generated providers at 8..64 NUMA nodes, fast merge vs the kubelet's cross
product where that finishes. Run: python benchmarks/topology_manager_micro.py"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numa_agent.admission.topology_manager import _merge  # noqa: E402
from numa_agent.core.hints import HintSet, NumaMask  # noqa: E402
from tests.support.reference_merge import kubelet_lists, reference_merge  # noqa: E402


def cpu_like(free, request, capacity):
    def fits(mask):
        return sum(free[n] for n in mask.nodes()) >= request
    return HintSet.generated(NumaMask(sorted(free)), fits, -(-request // capacity), monotone=True)


def scenario(n, kind):
    nodes = list(range(n))
    free = {i: (0 if i < 2 else 16) for i in nodes}  # the first two nodes are busy
    if kind == "aligned":  # every provider prefers 2 nodes: a preferred pair exists
        reqs = [24, 20, 30, 17]
    else:  # gpu prefers 1 node, the others 2: no preferred merge, best non-preferred search
        reqs = [24, 20, 30, 3]
    return nodes, [{name: cpu_like(free, r, 16)} for name, r in zip(("cpu", "memory", "hugepages", "gpu"), reqs, strict=True)]


def timed(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main():
    print(f"{'nodes':>5} {'scenario':>13} {'fast ms':>9} {'reference ms':>13} result")
    for n in (4, 6, 8, 16, 32, 64):
        for kind in ("aligned", "non-preferred"):
            nodes, providers = scenario(n, kind)
            fast_s, (hint, exact) = timed(partial(_merge, providers, nodes, "best-effort", None, None), 5)
            combos = 1
            for hints in kubelet_lists(providers) if n <= 8 else ():
                combos *= len(hints)
            if n <= 8 and combos <= 6_000_000:
                ref_s, ref = timed(partial(reference_merge, providers, nodes, "best-effort"), 1)
                ref_text = f"{ref_s * 1000:13.1f}"
                assert ref == hint, (n, kind, ref, hint)
            else:
                ref_text = f"{'(2^' + str(4 * n) + ')':>13}" if n > 8 else f"{'(' + str(combos) + ')':>13}"
            print(f"{n:>5} {kind:>13} {fast_s * 1000:9.2f} {ref_text} {hint}{'' if exact else ' INEXACT'}")


def extra():
    """Costlier shapes at 64 nodes: prefer-closest (sorts every candidate
    pair) and a request that needs 4 nodes (C(64,4) candidates at worst)."""
    from numa_agent.admission.topology_manager import TopologyManagerOptions
    nodes = list(range(64))
    dist = {a: {b: 10 if a == b else 12 + abs(a // 8 - b // 8) for b in nodes} for a in nodes}
    _, providers = scenario(64, "aligned")
    closest = TopologyManagerOptions(prefer_closest_numa_nodes=True, max_allowable_numa_nodes=64)
    t, (hint, exact) = timed(lambda: _merge(providers, nodes, "best-effort", closest, dist), 3)
    print(f"   64 closest-aligned {t * 1000:9.2f} {'':>13} {hint}{'' if exact else ' INEXACT'}")
    free = {i: (0 if i < 2 else 16) for i in nodes}
    wide = [{k: cpu_like(free, 60, 16)} for k in ("cpu", "memory", "hugepages", "gpu")]
    t, (hint, exact) = timed(lambda: _merge(wide, nodes, "best-effort", None, None), 3)
    print(f"   64  4-node-aligned {t * 1000:9.2f} {'':>13} {hint}{'' if exact else ' INEXACT'}")


if __name__ == "__main__":
    main()
    extra()
