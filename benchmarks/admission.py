"""Admission latency: the real pure pipeline `numa_agent.admission.admit.decide`
(hints + merge + allocation) on synthetic machines of 2..64 NUMA nodes, driven
by a seeded sequence of mixed requests that admits and releases so the machine
stays partly full. Baseline: the kubelet's exhaustive cross-product merge
(`reference_merge`) on the same provider hint sets, where it can finish.

Prints figures only; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from benchmarks.stats import fmt, percentile, table
from numa_agent.admission.admit import (
    Decision,
    Refusal,
    Request,
    Resources,
    decide,
    release,
)
from numa_agent.admission.machine import Machine, PolicyConfig, build_machine
from numa_agent.admission.registry import PROVIDERS as REGISTERED
from numa_agent.admission.topology_manager import merge_hints
from numa_agent.admission.view import AdmissionView
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint
from numa_agent.state.model import AgentState
from tests.support.reference_merge import reference_merge
from tests.support.synthetic import make_topology

DEFAULT_SIZES = (2, 8, 16, 32, 64)
POLICIES = ("best-effort", "single-numa-node")
GIB = 1 << 30
MIB = 1 << 20

GPU_SPEC = ("0x030200", "0x10de", "0x20b0", "nvidia")
NIC_SPEC = ("0x020000", "0x15b3", "0x101b", "mlx5_core")
DEVICE_RESOURCES = {"gpu": {"vendor": "0x10de", "class_prefixes": ["0x0302"]},
                    "nic": {"class_prefixes": ["0x0200"]}}
# cpu, memory (memory + hugepages-2048kB resources), gpu, nic
PROVIDERS = 4

# The current goals for p99 admission time on this machine.
TARGET_P99_MS = {8: 0.25, 64: 1.0}

# Share of usable CPUs the sequence keeps exclusively booked, roughly; the
# untimed prefill books at least PREFILL of them first.
TARGET_FILL = 0.7
PREFILL = 0.5


class BenchError(ValueError):
    """A bad command-line setting; the message says which and why."""


# ---------------------------------------------------------------------------
# machines and requests


def machine_shape(numa_nodes: int) -> dict[str, int]:
    """8 nodes = 256 CPUs, 64 nodes = 1024 CPUs: 32 CPUs per node up to 8
    nodes, 16 beyond, SMT 2. Two sockets up to 16 nodes, 8 nodes per socket
    beyond (sub-NUMA clustering inside a socket)."""
    if numa_nodes < 1:
        raise BenchError(f"machine size must be at least 1 NUMA node, got {numa_nodes}")
    cpus_per_node = 32 if numa_nodes <= 8 else 16
    sockets = 1 if numa_nodes == 1 else 2 if numa_nodes <= 16 else math.ceil(numa_nodes / 8)
    if numa_nodes % sockets:
        sockets = 1
    return {"sockets": sockets, "nodes_per_socket": numa_nodes // sockets,
            "cores_per_node": cpus_per_node // 2, "threads_per_core": 2}


def device_specs(numa_nodes: int) -> list[tuple[str, str, str, int, str]]:
    """Two GPUs on every even node, one NIC on every node: GPU requests have a
    reason to pull a workload toward some nodes and NICs toward others."""
    specs = []
    for node in range(numa_nodes):
        if node % 2 == 0:
            specs += [(GPU_SPEC[0], GPU_SPEC[1], GPU_SPEC[2], node, GPU_SPEC[3])] * 2
        specs.append((NIC_SPEC[0], NIC_SPEC[1], NIC_SPEC[2], node, NIC_SPEC[3]))
    return specs


def build(numa_nodes: int, policy: str) -> Machine:
    topo = make_topology(**machine_shape(numa_nodes), memory_per_node_bytes=64 * GIB,
                         hugepages_2m_per_node=1024, devices=device_specs(numa_nodes))
    return build_machine(topo, PolicyConfig(topology_policy=policy, devices=DEVICE_RESOURCES))


def random_resources(rng: random.Random) -> Resources:
    """Mostly small, sometimes up to 16 CPUs; memory often, hugepages and
    devices sometimes."""
    cpus = rng.choice((1, 2, 2, 4, 4, 4, 6, 8, 8, 12, 16))
    memory = rng.choice((512 * MIB, GIB, 2 * GIB, 4 * GIB, 8 * GIB, 16 * GIB)) if rng.random() < 0.6 else 0
    hugepages = {2048: rng.choice((64, 128, 256, 512))} if rng.random() < 0.3 else {}
    devices = {}
    if rng.random() < 0.25:
        devices["gpu"] = rng.choice((1, 1, 2))
    if rng.random() < 0.3:
        devices["nic"] = 1
    return Resources(cpus=cpus, memory_bytes=memory, hugepages=hugepages, devices=devices)


def request_sequence(count: int, seed: int) -> list[Resources]:
    rng = random.Random(seed)
    return [random_resources(rng) for _ in range(count)]


# ---------------------------------------------------------------------------
# the baseline: provider hints built as admit.py builds them, then the
# kubelet's cross product


def provider_hints(machine: Machine, state: AgentState, res: Resources) -> list[dict[str, HintSet]]:
    """The hints admit.py merges for a plain (unpinned) request: the
    registered providers', same order."""
    request = Request(name="bench", owner_uid=0, resources=res)
    view = AdmissionView(machine, state)
    return [dict(hints) for provider in REGISTERED if (hints := provider.hints(request, view)) is not None]


@dataclass(frozen=True)
class CostModel:
    """Seconds per hint enumerated by HintSet.hints() (one fits() call) and
    per combination the cross product compares, measured in this process."""

    per_fit_s: float
    per_combo_s: float

    def enumeration_s(self, providers: Sequence[dict[str, HintSet]]) -> float:
        total = 0.0
        for provider in providers:
            for hs in provider.values():
                if hs.kind == "generated":
                    total += (2 ** hs.nodes.count()) * self.per_fit_s
        return total


def calibrate() -> CostModel:
    nodes = list(range(8))
    free = {n: 8 for n in nodes}

    def fits(mask: NumaMask) -> bool:
        return sum(free[n] for n in mask.nodes()) >= 12

    hs = HintSet.generated(NumaMask(nodes), fits, 2, monotone=True)
    t0 = time.perf_counter()
    for _ in range(20):
        hs.hints()
    per_fit = (time.perf_counter() - t0) / (20 * 255)
    # 3 resources x 30 hints: 27,000 combinations.
    masks = [NumaMask.from_bits(b) for b in range(1, 31)]
    providers = [{r: HintSet.explicit([TopologyHint(m, m.count() == 1) for m in masks])}
                 for r in ("a", "b", "c")]
    t0 = time.perf_counter()
    reference_merge(providers, list(range(5)), "best-effort")
    per_combo = (time.perf_counter() - t0) / 30 ** 3
    return CostModel(per_fit, per_combo)


def combinations(providers: Sequence[dict[str, HintSet]], policy: str) -> int:
    """How many combinations reference_merge will compare (its own filtering
    under single-numa-node included). Enumerates the hints: call only when
    the enumeration itself is affordable."""
    combos = 1
    for provider in providers or [{}]:
        for hs in (provider.values() if provider else [HintSet.no_preference()]):
            hints = hs.hints() or [TopologyHint(None, False)]
            if policy == "single-numa-node":
                hints = [h for h in hints if h.preferred and (h.mask is None or h.mask.count() == 1)]
            combos *= max(1, len(hints))
    return combos


# ---------------------------------------------------------------------------
# one row: one machine size under one policy


@dataclass
class Row:
    numa_nodes: int
    policy: str
    cpus: int = 0
    providers: int = PROVIDERS
    requests: int = 0
    admitted: int = 0
    refused: int = 0
    mean_resources: float = 0.0
    mean_fill: float = 0.0
    ours_ms: list[float] = field(default_factory=list)
    merge_ms: list[float] = field(default_factory=list)
    baseline_ms: list[float] = field(default_factory=list)
    ours_on_baseline_ms: list[float] = field(default_factory=list)
    merge_on_baseline_ms: list[float] = field(default_factory=list)
    baseline_disagreements: int = 0
    baseline_note: str = ""

    def to_json(self) -> dict[str, Any]:
        b50, b99 = percentile(self.baseline_ms, 50), percentile(self.baseline_ms, 99)
        o50 = percentile(self.ours_on_baseline_ms, 50)
        m50 = percentile(self.merge_on_baseline_ms, 50)
        p99 = percentile(self.ours_ms, 99)
        target = TARGET_P99_MS.get(self.numa_nodes)
        return {
            "numa_nodes": self.numa_nodes, "policy": self.policy, "cpus": self.cpus,
            "providers": self.providers, "mean_resources": round(self.mean_resources, 2),
            "requests": self.requests, "admitted": self.admitted, "refused": self.refused,
            "mean_cpu_fill": round(self.mean_fill, 3),
            "p50_ms": percentile(self.ours_ms, 50), "p99_ms": p99,
            "max_ms": max(self.ours_ms) if self.ours_ms else None,
            # hints + our merge only (no allocation): the like-for-like figure
            "merge_p50_ms": percentile(self.merge_ms, 50), "merge_p99_ms": percentile(self.merge_ms, 99),
            "baseline_p50_ms": b50, "baseline_p99_ms": b99,
            "baseline_requests": len(self.baseline_ms),
            # On the requests the baseline ran on: its p50 over ours.
            "ratio": (b50 / o50) if b50 is not None and o50 else None,
            "merge_ratio": (b50 / m50) if b50 is not None and m50 else None,
            "baseline_disagreements": self.baseline_disagreements if self.baseline_ms else None,
            "baseline_note": self.baseline_note,
            "target_p99_ms": target,
            "meets_target": None if target is None or p99 is None else p99 < target,
        }


def run_row(numa_nodes: int, policy: str, sequence: Sequence[Resources], seed: int,
            cost: CostModel | None, bound_s: float, baseline_budget_s: float,
            profiler: cProfile.Profile | None = None) -> Row:
    """Drive `sequence` through decide(), timing each call, after an untimed
    prefill that books PREFILL of the CPUs. With `cost`, also time the
    baseline on every request whose estimated cost is within `bound_s`,
    until `baseline_budget_s` is spent on this row. A `profiler` is enabled
    around the timed decide() calls only."""
    machine = build(numa_nodes, policy)
    usable = len(machine.usable_cpus) - len(machine.reserved_cpus)
    row = Row(numa_nodes, policy, cpus=len(machine.usable_cpus))
    rng = random.Random(seed * 1000 + numa_nodes)
    state, names = _prefill(machine, usable, rng)

    resources_total = fill_total = 0.0
    baseline_spent = 0.0
    skipped: list[str] = []
    for i, res in enumerate(sequence):
        # Keep the machine partly full: release until under the target, and
        # churn a little even when there is room.
        while names and (len(state.exclusive_cpus()) + res.cpus > TARGET_FILL * usable
                         or rng.random() < 0.2):
            state, _, _ = release(state, names.pop(rng.randrange(len(names))))
        req = Request(name=f"w{i}", owner_uid=1000, resources=res)

        t0 = time.perf_counter_ns()
        providers = provider_hints(machine, state, res)
        ours = merge_hints(providers, machine.node_ids, policy, machine.tm_options, machine.distances)
        merge_ms = (time.perf_counter_ns() - t0) / 1e6

        baseline = None
        if cost is not None:
            baseline, reason = _baseline(machine, state, res, providers, policy, cost, bound_s,
                                         baseline_budget_s - baseline_spent)
            if baseline is None:
                skipped.append(reason)
            else:
                baseline_spent += baseline[0]

        decision, elapsed_ms = _timed_decide(machine, state, req, profiler)

        row.ours_ms.append(elapsed_ms)
        row.merge_ms.append(merge_ms)
        resources_total += sum(len(p) for p in providers)
        fill_total += len(state.exclusive_cpus()) / usable
        if baseline is not None:
            row.baseline_ms.append(baseline[0] * 1000)
            row.ours_on_baseline_ms.append(elapsed_ms)
            row.merge_on_baseline_ms.append(merge_ms)
            if ours.merged != baseline[1]:
                row.baseline_disagreements += 1
        if decision is None:
            row.refused += 1
        else:
            row.admitted += 1
            state, names = decision.state, names + [req.name]
    row.requests = len(row.ours_ms)
    row.mean_resources = resources_total / max(1, row.requests)
    row.mean_fill = fill_total / max(1, row.requests)
    if cost is None:
        row.baseline_note = "not requested (--no-baseline)"
    elif skipped:
        row.baseline_note = _skip_note(skipped, row.requests, bound_s, baseline_budget_s)
    return row


def _prefill(machine: Machine, usable: int, rng: random.Random) -> tuple[AgentState, list[str]]:
    """The untimed prefill (it also warms the interpreter's caches): admit
    random requests until PREFILL of the usable CPUs are booked."""
    state = AgentState()
    names: list[str] = []
    for i in range(10 * usable):
        if len(state.exclusive_cpus()) >= PREFILL * usable:
            break
        try:
            state = decide(machine, state, Request(f"pre{i}", 1000, random_resources(rng))).state
            names.append(f"pre{i}")
        except Refusal:
            pass
    return state, names


def _timed_decide(machine: Machine, state: AgentState, req: Request,
                  profiler: cProfile.Profile | None) -> tuple[Decision | None, float]:
    """decide() timed (ms), with the profiler enabled around it only; None for a refusal."""
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter_ns()
    try:
        decision: Decision | None = decide(machine, state, req)
    except Refusal:
        decision = None
    elapsed_ms = (time.perf_counter_ns() - t0) / 1e6
    if profiler is not None:
        profiler.disable()
    return decision, elapsed_ms


BUDGET_SPENT = "the row's baseline time budget was spent"


def _baseline(machine: Machine, state: AgentState, res: Resources, providers, policy: str,
              cost: CostModel, bound_s: float, budget_left_s: float):
    """((seconds, merged hint), "") of hints + cross product for one request,
    or (None, why it was not run): over the bound, or BUDGET_SPENT."""
    enumeration = cost.enumeration_s(providers)
    if enumeration > bound_s:
        return None, (f"enumerating the hints alone (2^{len(machine.node_ids)} masks per resource) "
                      f"would take ~{enumeration:.3g} s")
    if enumeration > budget_left_s:
        return None, BUDGET_SPENT
    combos = combinations(providers, policy)
    estimate = enumeration + combos * cost.per_combo_s
    if estimate > bound_s:
        return None, f"{combos:.3g} combinations would take ~{estimate:.3g} s"
    if estimate > budget_left_s:
        return None, BUDGET_SPENT
    t0 = time.perf_counter()
    fresh = provider_hints(machine, state, res)  # hint generation is part of the baseline's work
    hint = reference_merge(fresh, machine.node_ids, policy, machine.tm_options, machine.distances)
    return (time.perf_counter() - t0, hint), ""


def _skip_note(reasons: list[str], requests: int, bound_s: float, budget_s: float) -> str:
    """One line: how many requests went without a baseline and why, with the
    largest estimate among those over the bound."""
    over = [r for r in reasons if r != BUDGET_SPENT]
    parts = []
    if over:
        def seconds(text: str) -> float:
            return float(text.rsplit("~", 1)[1].split(" s", 1)[0])
        parts.append(f"{len(over)} over the {bound_s:g} s bound (worst: {max(over, key=seconds)})")
    spent = len(reasons) - len(over)
    if spent:
        parts.append(f"{spent} after the row's {budget_s:g} s baseline budget was spent")
    return f"skipped on {len(reasons)} of {requests} requests: " + "; ".join(parts)


# ---------------------------------------------------------------------------
# command line


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise BenchError(f"--sizes: {text!r} is not a comma-separated list of NUMA node counts") from None
    if not sizes or any(s < 1 or s > 64 for s in sizes):
        raise BenchError(f"--sizes: {text!r}: every size must be between 1 and 64 NUMA nodes")
    return sizes


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-admission", description=(
        "Admission time (hints + merge + allocation) through numa_agent.admission.admit.decide on "
        "synthetic machines, p50/p99 per size and policy, against the kubelet's cross-product "
        "merge where that finishes. Prints figures, asserts nothing."))
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="NUMA node counts, comma-separated (default %(default)s)")
    p.add_argument("--requests", type=int, default=200, help="timed requests per row (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="request sequence seed (default %(default)s)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="topology policies, comma-separated (default %(default)s)")
    p.add_argument("--baseline-bound", type=float, default=2.0, metavar="SECONDS",
                   help="run the baseline on a request only if estimated under this (default %(default)s)")
    p.add_argument("--baseline-budget", type=float, default=30.0, metavar="SECONDS",
                   help="baseline time per row at most (default %(default)s)")
    p.add_argument("--no-baseline", action="store_true", help="skip the cross-product baseline")
    p.add_argument("--profile", type=int, metavar="NODES",
                   help="also cProfile decide() on this size (first policy) and print the hot spots")
    args = p.parse_args(argv)
    args.sizes = parse_sizes(args.sizes)
    args.policies = tuple(s.strip() for s in args.policies.split(",") if s.strip())
    for policy in args.policies:
        if policy not in ("none", "best-effort", "restricted", "single-numa-node"):
            raise BenchError(f"--policies: unknown topology policy {policy!r}")
    if args.requests < 1:
        raise BenchError(f"--requests must be at least 1, got {args.requests}")
    if args.profile is not None:
        parse_sizes(str(args.profile))
    return args


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = ["nodes", "cpus", "policy", "req", "refused", "fill", "p50 ms", "p99 ms",
               "merge p50", "base p50", "base p99", "base n", "ratio", "m.ratio", "target p99"]
    body = []
    for r in rows:
        target = "" if r["target_p99_ms"] is None else (
            f"<{r['target_p99_ms']:g} {'met' if r['meets_target'] else 'MISSED'}")
        body.append([str(r["numa_nodes"]), str(r["cpus"]), r["policy"], str(r["requests"]),
                     str(r["refused"]), f"{r['mean_cpu_fill']:.2f}", fmt(r["p50_ms"]), fmt(r["p99_ms"]),
                     fmt(r["merge_p50_ms"]), fmt(r["baseline_p50_ms"]), fmt(r["baseline_p99_ms"]),
                     str(r["baseline_requests"]), fmt(r["ratio"], 1),
                     fmt(r["merge_ratio"], 1), target])
    notes = [f"  {r['numa_nodes']:>2} nodes {r['policy']}: baseline {r['baseline_note']}"
             for r in rows if r["baseline_note"]]
    legend = ("ours = decide(): hints + merge + allocation; merge = hints + topology_manager.merge_hints "
              "(our merge; the hint summaries are made only for refusals and dry runs); "
              "base = hints + the kubelet's cross-product merge.\n"
              "ratio = base p50 / ours p50, m.ratio = base p50 / merge p50, both on the requests "
              "the baseline ran on (base n); fill = mean share of CPUs exclusively booked")
    return "\n".join([table(headers, body), legend] + (["baseline notes:"] + notes if notes else []))


def profile(numa_nodes: int, policy: str, sequence: Sequence[Resources], seed: int, top: int = 15) -> str:
    """cProfile of the timed decide() calls of one row: top functions by
    cumulative and by own time."""
    profiler = cProfile.Profile()
    run_row(numa_nodes, policy, sequence, seed, None, 0, 0, profiler)
    out = io.StringIO()
    print(f"cProfile of decide() on {numa_nodes} NUMA nodes, {policy}, {len(sequence)} requests",
          file=out)
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except BenchError as exc:
        print(f"bench-admission: {exc}", file=sys.stderr)
        return 2
    sequence = request_sequence(args.requests, args.seed)
    cost = None if args.no_baseline else calibrate()
    rows = []
    for size in args.sizes:
        for policy in args.policies:
            rows.append(run_row(size, policy, sequence, args.seed, cost,
                                args.baseline_bound, args.baseline_budget).to_json())
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(render_table(rows))
    if args.profile is not None:
        print(profile(args.profile, args.policies[0], sequence, args.seed), file=sys.stderr)
    return 0
