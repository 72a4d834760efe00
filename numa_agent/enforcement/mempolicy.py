"""set_mempolicy(2) and get_mempolicy(2) for the calling thread, and the other
readings `numa-run --show` prints (the edge; the rules are core/mempolicy.py).

Python wraps neither call, so they go through libc's syscall() with the
architecture's numbers."""

from __future__ import annotations

import ctypes
import errno
import os

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.mempolicy import MPOL_BIND, MPOL_INTERLEAVE, MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE
from numa_agent.core.record import Record
from numa_agent.enforcement.libc import libc

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: numa-run uses this module
if TYPE_CHECKING:
    from typing import Iterable

# set_mempolicy / get_mempolicy numbers differ per architecture.
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "ppc64": 261}
GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236, "ppc64le": 260, "ppc64": 260}
MPOL_F_NODE = 1  # get_mempolicy: the next interleave node, for an interleave policy
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
# Large enough for any kernel's nr_node_ids (CONFIG_NODES_SHIFT <= 10).
_QUERY_NODE_BITS = 1 << 12


# Records, not dataclasses: numa-run sets policies right before exec, and the
# dataclasses module costs it ~15 ms to import.
class PolicyResult(Record):
    """Outcome of set_policy; falsy when the kernel did not take the policy. errno_name:
    "EINVAL", ...; "" when no call was made."""

    __slots__ = ("applied", "reason", "errno_name")
    DEFAULTS = {"reason": "", "errno_name": ""}
    applied: bool
    reason: str
    errno_name: str

    def __bool__(self) -> bool:
        return bool(self.applied)


class PolicyReading(Record):
    """A thread's policy: its mode, nodes and, for interleave policies, the next node."""

    __slots__ = ("mode", "nodes", "next_node")
    mode: int
    nodes: tuple[int, ...]
    next_node: int | None


def set_policy(mode: int, nodes: Iterable[int], *, label: str,
               machine: str | None = None) -> PolicyResult:
    """set_mempolicy(mode, nodes) for the calling thread; `label` names the
    policy in the failure reason. No nodes: a NULL mask (MPOL_LOCAL, MPOL_DEFAULT)."""
    bits = _node_bits(nodes)
    arch = machine or os.uname().machine
    number = SET_MEMPOLICY.get(arch)
    if number is None:
        return PolicyResult(False, f"set_mempolicy syscall number unknown for architecture {arch!r}")
    words = (bits.bit_length() + _ULONG_BITS - 1) // _ULONG_BITS
    nodemask = (ctypes.c_ulong * words)(*_words(bits, words)) if words else None
    ctypes.set_errno(0)
    # The kernel reads maxnode-1 bits (historic off-by-one), hence the + 1.
    rc = libc().syscall(ctypes.c_long(number), ctypes.c_int(mode), nodemask,
                        ctypes.c_ulong(words * _ULONG_BITS + 1 if words else 0))
    if rc != 0:
        code = ctypes.get_errno()
        name = errno.errorcode.get(code, "E?")
        return PolicyResult(False, f"set_mempolicy({label}) failed: {name} ({os.strerror(code)})",
                            name)
    return PolicyResult(True)


def _node_bits(nodes: Iterable[int]) -> int:
    bits = 0
    for node in nodes:
        if node < 0:
            raise ValueError(f"NUMA node id must be >= 0, got {node}")
        bits |= 1 << node
    return bits


def bind_self(nodes: Iterable[int], *, machine: str | None = None) -> PolicyResult:
    """set_mempolicy(MPOL_BIND, nodes) for the calling thread: the affinity fallback's
    memory binding, which numa-run sets on itself before exec."""
    ordered = sorted(set(nodes))
    if not ordered:
        raise ValueError("binding memory needs at least one NUMA node")
    _node_bits(ordered)  # a negative id is refused as one, before the label formats it
    return set_policy(MPOL_BIND, ordered, machine=machine,
                      label=f"MPOL_BIND, nodes {CpuSet(ordered).format()}")


def get_policy(*, machine: str | None = None) -> PolicyReading | None:
    """The calling thread's memory policy, or None when it cannot be queried."""
    number = GET_MEMPOLICY.get(machine or os.uname().machine)
    if number is None:
        return None
    words = _QUERY_NODE_BITS // _ULONG_BITS
    mode = ctypes.c_int(0)
    nodemask = (ctypes.c_ulong * words)()
    rc = libc().syscall(ctypes.c_long(number), ctypes.byref(mode), nodemask,
                        ctypes.c_ulong(_QUERY_NODE_BITS), ctypes.c_void_p(0), ctypes.c_ulong(0))
    if rc != 0:
        return None
    bits = 0
    for i, word in enumerate(nodemask):
        bits |= int(word) << (i * _ULONG_BITS)
    # Mode flags (MPOL_F_STATIC_NODES...) ride in the high bits of the mode.
    plain = mode.value & 0xFF
    next_node = None
    if plain in (MPOL_INTERLEAVE, MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE):
        node = ctypes.c_int(0)
        if libc().syscall(ctypes.c_long(number), ctypes.byref(node), ctypes.c_void_p(0),
                          ctypes.c_ulong(0), ctypes.c_void_p(0), ctypes.c_ulong(MPOL_F_NODE)) == 0:
            next_node = node.value
    return PolicyReading(plain, CpuSet.from_bits(bits).ids(), next_node)


def mems_allowed(status_path: str = "/proc/self/status") -> tuple[int, ...]:
    """Mems_allowed_list of /proc/self/status: the nodes the cpuset allows."""
    with open(status_path) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "Mems_allowed_list":
                return CpuSet.parse(value).ids()
    return ()


def node_cpus(node_root: str = "/sys/devices/system/node") -> dict[int, CpuSet]:
    """Each NUMA node's CPUs; {} without NUMA in sysfs."""
    out: dict[int, CpuSet] = {}
    try:
        entries = os.listdir(node_root)
    except OSError:
        return out
    for entry in entries:
        if entry.startswith("node") and entry[4:].isdigit():
            try:
                with open(os.path.join(node_root, entry, "cpulist")) as f:
                    out[int(entry[4:])] = CpuSet.parse(f.read())
            except OSError:
                continue
    return out


def _words(bits: int, count: int) -> list[int]:
    mask = (1 << _ULONG_BITS) - 1
    return [(bits >> (i * _ULONG_BITS)) & mask for i in range(count)]
