"""Conformance sections for the CPU manager: each runs one kubelet vector
case through the real code and returns None on success or one line saying
what differed."""

from __future__ import annotations

from typing import Callable

from numa_agent.admission.cpu_manager import CpuManagerOptions, cpu_hints
from numa_agent.admission.cpu_take import (
    CpuAllocationError,
    take_by_topology,
    take_by_topology_distributed,
)
from numa_agent.admission.cpu_topology import CpuTopology
from numa_agent.core.cpuset import CpuSet
from tests.support.cpu_topology import from_vectors

Section = Callable[[dict, dict], "str | None"]


def _topology(case: dict, doc: dict) -> CpuTopology:
    return from_vectors(doc["topologies"][case["topology"]])


def _take_options(case: dict) -> CpuManagerOptions:
    opts = case.get("options") or {}
    return CpuManagerOptions(
        distribute_cpus_across_cores=opts.get("cpu_sorting_strategy", "packed") == "spread",
        prefer_align_cpus_by_uncorecache=bool(opts.get("prefer_align_by_uncorecache", False)),
    )


def _compare_take(case: dict, run: Callable[[], CpuSet]) -> str | None:
    expected = CpuSet(case["expected"])
    try:
        got = run()
    except CpuAllocationError as exc:
        if case.get("expected_error"):
            return None
        return f"unexpected error: {exc}"
    if case.get("expected_error"):
        return f"expected error {case['expected_error']!r}, got cpus {got.format() or '(none)'}"
    if got != expected:
        return f"expected cpus {expected.format() or '(none)'}, got {got.format() or '(none)'}"
    return None


def run_packed(case: dict, doc: dict) -> str | None:
    topo = _topology(case, doc)
    return _compare_take(case, lambda: take_by_topology(
        topo, CpuSet(case["available"]), case["num_cpus"], _take_options(case)))


def run_distributed(case: dict, doc: dict) -> str | None:
    topo = _topology(case, doc)
    return _compare_take(case, lambda: take_by_topology_distributed(
        topo, CpuSet(case["available"]), case["num_cpus"], case["cpu_group_size"], _take_options(case)))


def _hint_key(h: dict) -> tuple:
    mask = h["mask"]
    return (None if mask is None else tuple(sorted(mask)), bool(h["preferred"]))


def _fmt_hints(keys) -> str:
    return "[" + ", ".join(
        f"{'any' if m is None else '{' + ','.join(map(str, m)) + '}'}{' preferred' if p else ''}"
        for m, p in keys
    ) + "]"


def run_hints(case: dict, doc: dict) -> str | None:
    topo = _topology(case, doc)
    allocated = case.get("already_allocated_to_this_container")
    try:
        options = CpuManagerOptions.from_mapping(case.get("policy_options") or {})
        hint_set = cpu_hints(
            topo,
            CpuSet(case["available"]),
            case["request"],
            options,
            reusable=CpuSet(case.get("reusable") or []),
            already_allocated=None if allocated is None else CpuSet(allocated),
        )
    except Exception as exc:  # a conformance failure, not a crash of the runner
        return f"raised {type(exc).__name__}: {exc}"
    got = sorted((_hint_key(h.to_json()) for h in hint_set.hints()), key=repr)
    expected = sorted((_hint_key(h) for h in case["expected_hints"]), key=repr)
    if case.get("order_insensitive", True):
        if got != expected:
            return f"expected hints {_fmt_hints(expected)}, got {_fmt_hints(got)}"
    else:
        got_ordered = [_hint_key(h.to_json()) for h in hint_set.hints()]
        want_ordered = [_hint_key(h) for h in case["expected_hints"]]
        if got_ordered != want_ordered:
            return f"expected hints {_fmt_hints(want_ordered)}, got {_fmt_hints(got_ordered)}"
    return None


SECTIONS: dict[str, Section] = {
    "cpu_take_by_topology_packed": run_packed,
    "cpu_take_by_topology_numa_distributed": run_distributed,
    "cpu_static_policy_topology_hints": run_hints,
}
