"""Which scenarios run on which machine shape. Standard library only: the host-side
runner imports it without the project's virtualenv."""

from __future__ import annotations

# In the order they run inside one guest.
SCENARIOS = (
    "1-pin-core",
    "2-exclusive",
    "3-single-numa",
    "4-devices",
    "5-memory",
    "6-release",
    "7-restart",
    "8-pods",
    "9-metrics",
    "10-hotplug",
    "11-partitions",
    "12-recovery",
    "14-scale",
)

# Shapes not named here run nothing (every scenario is a SKIP).
PLAN: dict[str, tuple[str, ...]] = {
    "2node": SCENARIOS,
    "4node": ("1-pin-core", "2-exclusive", "3-single-numa", "6-release"),
    "cpuless": ("1-pin-core", "5-memory"),
    "snc": ("1-pin-core", "2-exclusive", "3-single-numa", "6-release"),
}

DEFAULT_SHAPES = ("2node", "4node", "cpuless")


def planned(shape: str) -> tuple[str, ...]:
    return PLAN.get(shape, ())


def skip_reason(shape: str) -> str:
    runs = planned(shape)
    if not runs:
        return f"no scenarios are planned for the {shape} shape"
    return f"not planned for {shape} (it runs {', '.join(runs)})"


def result_line(status: str, scenario: str, shape: str, reason: str = "") -> str:
    """`PASS 1-pin-core 2node`, `FAIL 3-single-numa 2node: <reason>`, `SKIP ...: <why>`."""
    line = f"{status} {scenario} {shape}"
    if reason:
        # One line per scenario, whatever the reason holds.
        line += ": " + " ".join(reason.split())
    return line
