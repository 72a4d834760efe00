"""The naming rules every layer shares, each written once.

Workload and pod names become cgroup directory names, so the rule is a
lowercase DNS-label-like word: never "/", "..", NUL or a control character.
Device resource names follow the kubelet's extended resources: a name,
optionally qualified by a lowercase domain ("gpu", "nvidia.com/gpu").
"""

from __future__ import annotations

# Where the agent listens unless told otherwise (numa-run, numa-agent, config).
DEFAULT_SOCKET = "/run/numa-agent/agent.sock"

# The environment numa-run gives a workload's command; recovery in the
# affinity fallback reads it back from /proc/PID/environ.
ENV_WORKLOAD = "NUMA_AGENT_WORKLOAD"
ENV_CPUS = "NUMA_AGENT_CPUS"
ENV_MEMS = "NUMA_AGENT_MEMS"
ENV_DEVICES = "NUMA_AGENT_DEVICES"
ENV_EXCLUSIVE = "NUMA_AGENT_EXCLUSIVE"
# The agent's proof that it issued the mark for that process (numa_agent.core.mark).
ENV_MARK = "NUMA_AGENT_MARK"

# A NUMA node's kind, as `topology --json` and /v1/allocatable give it (stable keys);
# here rather than in core.topology, which numa-run does not import.
CPU_NODE = "cpu"
MEMORY_ONLY = "memory-only"

NAME_MAX = 63
NAME_RULE = (f"1-{NAME_MAX} characters: lowercase letters, digits, '-', '_', '.'; "
             "starting and ending with a letter or digit")
_NAME = r"[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?"

RESOURCE_RULE = (f"at most {NAME_MAX} characters: lowercase letters, digits, '-', '.', starting and ending "
                 "with a letter or digit, optionally after a domain and '/' (gpu, nvidia.com/gpu)")
_RESOURCE = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?"

# PCI addresses as sysfs and the kernel's uevents spell them: domain:bus:slot.function.
_PCI_ADDRESS = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"


def is_engine_cgroup(path: str) -> bool:
    """An engine's cgroup (a container's, a Slurm task's) as /proc/PID/cgroup names
    it: absolute below the cgroup2 mount. The agent's own cgroups are relative to
    its root ("wl-db", "shared/web")."""
    return path.startswith("/")


def engine_cgroup_parent(path: str) -> str:
    """The cgroup whose grant bounds an engine's cgroup: "/libpod_parent/libpod-1"
    -> "/libpod_parent"; "/" for a child of the top."""
    return "/" + path.strip("/").rpartition("/")[0]


def is_workload_name(value: object) -> bool:
    """A valid workload or pod name (it is also a safe path component)."""
    return isinstance(value, str) and _fullmatch(_NAME, value) and ".." not in value


# Names an engine derives, which no other user may take first (a Slurm job id is
# sequential, a container id is shown by `podman ps`): numa-run's in a Slurm task,
# `slurm-<job>-<step>-<task>-u<uid>`, carries the job's user, and only that uid may take it;
# the OCI hook's, a container's `ctr-<12 hex>` and its sandbox's pods
# `sbx-<12 hex>-<name>`, only root (the hook) may take.
_SLURM_FORM = r"slurm-[0-9]+-.*"
_CONTAINER_FORM = r"ctr-[0-9a-f]{12}"
_SANDBOX_FORM = r"sbx-[0-9a-f]{12}(-.*)?"
SANDBOX_POD_PREFIX = "sbx-"


def sandbox_pod_name(sandbox12: str, name: str) -> str:
    """The agent's name of pod `name` of the engine's sandbox (pod) whose id begins
    `sandbox12`: a container can name only a pod of its own sandbox."""
    return f"{SANDBOX_POD_PREFIX}{sandbox12}-{name}"


def owner_suffix(uid: int) -> str:
    """What an engine-derived name ends with to say whose it is: `-u1000`."""
    return f"-u{uid}"


def engine_name_refusal(name: str, uid: int) -> str | None:
    """Why `uid` may not take `name`, which has a form an engine derives, or None.
    Root may take any name; a free-form name is anyone's first."""
    if uid == 0:
        return None
    if _fullmatch(_CONTAINER_FORM, name):
        return (f"{name!r} has the form of a container's name (ctr- and 12 hex digits), which only "
                "the OCI hook (root) takes; choose another --name")
    if _fullmatch(_SANDBOX_FORM, name):
        return (f"{name!r} has the form of a container sandbox's pod (sbx- and 12 hex digits), which "
                "only the OCI hook (root) takes; choose another name")
    if _fullmatch(_SLURM_FORM, name) and not name.endswith(owner_suffix(uid)):
        return (f"{name!r} has the form of a Slurm task's name (slurm-JOB-...), which only the job's "
                f"user takes, ending in {owner_suffix(uid)!r} for uid {uid}; choose another --name")
    return None


def is_resource_name(value: object) -> bool:
    """A valid device resource name, as the config and the API accept it."""
    return isinstance(value, str) and len(value) <= NAME_MAX and _fullmatch(_RESOURCE, value)


def is_pci_address(value: object) -> bool:
    """A PCI address like 0000:3b:00.0 (lowercase hex, as the kernel writes it)."""
    return isinstance(value, str) and _fullmatch(_PCI_ADDRESS, value.lower())


def _fullmatch(pattern: str, value: str) -> bool:
    # re is imported at the first check, not by numa-run's launch, which makes none; the
    # pattern is compiled once, in re's own cache.
    import re

    return re.fullmatch(pattern, value) is not None
