"""numactl's memory policies on top of a booking (pure).

numa-run's -i/--interleave, -p/--preferred, -l/--localalloc and
-w/--weighted-interleave choose a set_mempolicy(2) mode and node mask for the
command. The rules, in one place:

- at most one of them (numactl sets one policy per process);
- which memory nodes the request asks the agent for (`request_membind`): an
  explicit -m always; else the nodes -i, -w or -p name, since memory on those
  nodes is what numactl's user means (so -p books its node, and the fallback
  numactl's -p allows stays inside the booking: give -m for a wider one);
- the nodes must lie within the booked memory nodes, the answer's `mems`
  (`effective_policy`), else the request is refused before exec.

`show_lines` formats what ``numactl --show`` prints from the values the
caller read.
"""

from __future__ import annotations

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import Iterable, Mapping, Sequence

# The kernel's mode numbers (include/uapi/linux/mempolicy.h).
MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_LOCAL = 4
MPOL_PREFERRED_MANY = 5
MPOL_WEIGHTED_INTERLEAVE = 6  # Linux 6.9

MODE_NAMES = {MPOL_DEFAULT: "default", MPOL_PREFERRED: "preferred", MPOL_BIND: "bind",
              MPOL_INTERLEAVE: "interleave", MPOL_LOCAL: "local",
              MPOL_PREFERRED_MANY: "preferred-many",
              MPOL_WEIGHTED_INTERLEAVE: "weighted-interleave"}
# The option each mode comes from, for messages.
_OPTION = {MPOL_INTERLEAVE: "--interleave", MPOL_PREFERRED: "--preferred",
           MPOL_LOCAL: "--localalloc", MPOL_WEIGHTED_INTERLEAVE: "--weighted-interleave"}
WEIGHTED_KERNEL = "Linux 6.9"


class PolicyRefused(ValueError):
    """A memory policy numa-run will not apply; the message says why."""


class MemoryPolicy(Record):
    """A mode (MPOL_*) and its nodes; a Record, not a dataclass: numa-run imports it."""

    __slots__ = ("mode", "nodes")
    DEFAULTS = {"nodes": ()}
    mode: int
    nodes: tuple[int, ...]

    @property
    def name(self) -> str:
        return MODE_NAMES.get(self.mode, f"mode {self.mode}")

    @property
    def option(self) -> str:
        return _OPTION.get(self.mode, self.name)

    def describe(self) -> str:
        nodes = nodes_text(self.nodes)
        return f"{self.name} nodes {nodes}" if nodes else self.name

    def to_json(self) -> dict:
        return {"mode": self.name, "nodes": list(self.nodes)}


def nodes_text(nodes: Iterable[int]) -> str:
    return CpuSet(nodes).format()


def chosen_policy(*, interleave: Sequence[int] | None = None, preferred: Sequence[int] | None = None,
                  localalloc: bool = False,
                  weighted_interleave: Sequence[int] | None = None) -> MemoryPolicy | None:
    """The one policy the options ask for, None for none; refused when several
    are given or -p names more than one node."""
    asked = [MemoryPolicy(mode, tuple(sorted(set(nodes))))
             for mode, nodes in ((MPOL_INTERLEAVE, interleave), (MPOL_PREFERRED, preferred),
                                 (MPOL_WEIGHTED_INTERLEAVE, weighted_interleave))
             if nodes is not None]
    if localalloc:
        asked.append(MemoryPolicy(MPOL_LOCAL))
    if len(asked) > 1:
        raise PolicyRefused(f"{' and '.join(p.option for p in asked)} exclude each other: a "
                            f"process has one memory policy (as with numactl)")
    if not asked:
        return None
    policy = asked[0]
    if policy.mode == MPOL_PREFERRED and len(policy.nodes) != 1:
        raise PolicyRefused(f"--preferred takes one NUMA node, not {nodes_text(policy.nodes)}; "
                            f"for several use --membind NODES --preferred NODE")
    return policy


def request_membind(policy: MemoryPolicy | None,
                    membind: Sequence[int] | None) -> list[int] | None:
    """The memory nodes to ask the agent for: -m if given, else the policy's nodes."""
    if membind is not None:
        return list(membind)
    if policy is None or not policy.nodes:
        return None
    return list(policy.nodes)


def name_policy_nodes(policy: MemoryPolicy | None, membind_given: bool, message: str) -> str:
    """The agent's error about the nodes a policy booked (sent as membind when -m was not
    given) named by the option the user wrote instead."""
    prefix = "membind: "
    if policy is None or not policy.nodes or membind_given or not message.startswith(prefix):
        return message
    return f"{policy.option} {nodes_text(policy.nodes)}: {message[len(prefix):]}"


def effective_policy(policy: MemoryPolicy | None, booked_mems: Sequence[int]) -> MemoryPolicy | None:
    """The policy to set for a booking whose memory nodes are `booked_mems`."""
    if policy is None:
        return None
    booked = set(booked_mems)
    if not booked:
        raise PolicyRefused(f"{policy.option}: the booking has no memory nodes to apply it to")
    outside = sorted(set(policy.nodes) - booked)
    if outside:
        raise PolicyRefused(
            f"{policy.option} {nodes_text(policy.nodes)}: node(s) {nodes_text(outside)} lie "
            f"outside the booked memory nodes {nodes_text(booked)} (NUMA_AGENT_MEMS); book them "
            f"with --membind {nodes_text(booked | set(policy.nodes))} or name nodes within")
    return policy


def failure_message(policy: MemoryPolicy, errno_name: str, reason: str) -> str:
    """Why set_mempolicy refused `policy` (`reason`: the call's own message),
    naming the kernel need where that is the cause."""
    if policy.mode == MPOL_WEIGHTED_INTERLEAVE and errno_name == "EINVAL":
        return (f"--weighted-interleave needs {WEIGHTED_KERNEL} or later "
                f"(MPOL_WEIGHTED_INTERLEAVE); this kernel refused it (EINVAL): use --interleave")
    return reason


# ------------------------------------------------------------------ --show
def node_set_of(cpus: CpuSet, node_cpus: Mapping[int, CpuSet]) -> list[int]:
    """Nodes with at least one of `cpus`: numactl's cpubind/nodebind."""
    return sorted(n for n, mine in node_cpus.items() if not mine.isdisjoint(cpus))


def show_lines(*, mode: int, nodes: Sequence[int], next_node: int | None, affinity: CpuSet,
               node_cpus: Mapping[int, CpuSet], mems_allowed: Sequence[int]) -> list[str]:
    """What ``numactl --show`` prints for these readings."""
    name = MODE_NAMES.get(mode, f"mode {mode}")
    first = str(min(nodes)) if nodes else "0"
    preferred_node = {MPOL_PREFERRED: first, MPOL_BIND: first,
                      MPOL_INTERLEAVE: f"{next_node} (interleave next)",
                      MPOL_WEIGHTED_INTERLEAVE: f"{next_node} (interleave next)",
                      MPOL_PREFERRED_MANY: f"{next_node} (preferred-many)"}.get(mode, "current")
    lines = [f"policy: {name}", f"preferred node: {preferred_node}"]
    if mode in (MPOL_INTERLEAVE, MPOL_WEIGHTED_INTERLEAVE):
        lines += [_mask_line("interleavemask", nodes), f"interleavenode: {next_node}"]
    bound = node_set_of(affinity, node_cpus)
    membind = nodes if mode == MPOL_BIND else mems_allowed
    preferred = nodes if mode in (MPOL_PREFERRED, MPOL_PREFERRED_MANY) else ()
    return lines + [_mask_line("physcpubind", affinity.ids()), _mask_line("cpubind", bound),
                    _mask_line("nodebind", bound), _mask_line("membind", membind),
                    _mask_line("preferred", preferred)]


def _mask_line(label: str, ids: Iterable[int]) -> str:
    # numactl prints each id followed by a space.
    return f"{label}: " + "".join(f"{i} " for i in sorted(ids))


def binding_needed(mems: Iterable[int], has_memory: str | None) -> bool:
    """Whether MPOL_BIND over `mems` restricts anything: not when they are every
    node the kernel lists with memory (`has_memory`, the text of
    /sys/devices/system/node/has_memory; None or bad text: bind, to be safe).
    Bound to all of them, pages go to the nearest node with room, as by default."""
    if has_memory is None:
        return True
    try:
        every = CpuSet.parse(has_memory.strip())
    except ValueError:
        return True
    return not every or not every.issubset(CpuSet(sorted(set(mems))))

