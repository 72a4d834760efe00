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
    "13-restart-inflight",
    "14-scale",
    "15-observe",
    "16-isolation",
    "17-kubelet",
    "19-release-sticks",
    "20-resize",
    "21-tasks",
    "18-memhot",  # last: its DIMM stays plugged
)

# The guest booted by systemd runs the agent as an installed service instead
# (tests/vm_e2e/systemd_scenarios.py).
SYSTEMD_SCENARIOS = (
    "systemd-service",
    "systemd-session",
    "systemd-restart",
    "systemd-kill",
    "systemd-watchdog",
    "systemd-journal",
    "systemd-allowedcpus",
    "systemd-memory",
    "systemd-otheruser",
    "systemd-configerror",
)

# The engines, each in a 2node guest of its own (tests/vm_e2e/podman_scenarios.py,
# tests/vm_e2e/slurm_scenarios.py): the engine's daemons and files stay out of the
# standard guest's scenarios.
PODMAN_SCENARIOS: tuple[str, ...] = (
    "podman-aligned",
    "podman-excluded",
    "podman-release",
    "podman-refusal",
    "podman-concurrent",
    "podman-restart",
)
SLURM_SCENARIOS: tuple[str, ...] = (
    "slurm-node",
    "slurm-one-task",
    "slurm-three-tasks",
    "slurm-epilog",
    "slurm-affinity",  # restarts the daemons with task/affinity
    "slurm-confined",  # restarts them with task/cgroup
    "slurm-combined",  # restarts them with task/cgroup,task/affinity
    "slurm-gres",  # restarts them with the devices as GRES
    "slurm-shared-cgroup",  # last: restarts them without per-task cgroups
)
# containerd 1.7.24 with NRI, driven through CRI as the kubelet does
# (tests/vm_e2e/containerd_scenarios.py): the agent as its NRI plugin.
CONTAINERD_SCENARIOS: tuple[str, ...] = (
    "containerd-guaranteed",
    "containerd-besteffort",
    "containerd-second",
    "containerd-resize",
    "containerd-single-numa",  # restarts the agent under single-numa-node
    "containerd-release",
    "containerd-runtime-restart",
    "containerd-agent-restart",
)
# Two guests, one Slurm cluster (tests/vm_e2e/slurm_cluster_scenarios.py).
SLURM_CLUSTER_SCENARIOS: tuple[str, ...] = (
    "cluster-srun",
    "cluster-batch",
    "cluster-agent-kill",
)

# shape -> (module run inside its guest, the scenarios it reports on); the rest
# run tests.vm_e2e.scenarios.
GUEST_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "systemd": ("tests.vm_e2e.systemd_scenarios", SYSTEMD_SCENARIOS),
    "podman": ("tests.vm_e2e.podman_scenarios", PODMAN_SCENARIOS),
    "slurm": ("tests.vm_e2e.slurm_scenarios", SLURM_SCENARIOS),
    "containerd": ("tests.vm_e2e.containerd_scenarios", CONTAINERD_SCENARIOS),
    "slurm2": ("tests.vm_e2e.slurm_cluster_scenarios", SLURM_CLUSTER_SCENARIOS),
}

# Shapes not named here run nothing (every scenario is a SKIP).
PLAN: dict[str, tuple[str, ...]] = {
    "2node": SCENARIOS,
    "4node": ("1-pin-core", "2-exclusive", "3-single-numa", "6-release", "13-restart-inflight"),
    "cpuless": ("1-pin-core", "5-memory"),
    "snc": ("1-pin-core", "2-exclusive", "3-single-numa", "6-release"),
    "systemd": SYSTEMD_SCENARIOS,
    "podman": PODMAN_SCENARIOS,
    "slurm": SLURM_SCENARIOS,
    "containerd": CONTAINERD_SCENARIOS,
    "slurm2": SLURM_CLUSTER_SCENARIOS,
}

DEFAULT_SHAPES = ("2node", "4node", "cpuless", "systemd", "podman", "slurm", "containerd", "slurm2")


def scenarios_of(shape: str) -> tuple[str, ...]:
    """The scenarios a shape's guest reports on (PASS, FAIL or SKIP), in order."""
    return GUEST_MODULES[shape][1] if shape in GUEST_MODULES else SCENARIOS


def guest_module(shape: str) -> str:
    """The module that runs a shape's scenarios inside its guest."""
    return GUEST_MODULES[shape][0] if shape in GUEST_MODULES else "tests.vm_e2e.scenarios"


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
