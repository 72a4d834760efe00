"""Affinity fallback for machines without a writable cgroup v2 cpuset
(containers, hybrid cgroup v1 hosts): CPU pinning with sched_setaffinity and
memory binding with set_mempolicy(MPOL_BIND).

Neither survives the way a cgroup does: affinity is per thread and inherited
only by threads and children created afterwards, and a memory policy applies
to the calling thread only. So `numa-run` binds *itself* right before exec,
and the agent pins the caller's PID at admission time.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from typing import Iterable

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.enforcement.errors import AffinityError
from numa_agent.enforcement.libc import libc

MPOL_DEFAULT = 0
MPOL_BIND = 2

# set_mempolicy / get_mempolicy numbers differ per architecture.
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "ppc64": 261}
_GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236, "ppc64le": 260, "ppc64": 260}
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
# Large enough for any kernel's nr_node_ids (CONFIG_NODES_SHIFT <= 10).
_QUERY_NODE_BITS = 1 << 12


def pin_process(pid: int, cpus: CpuSet) -> None:
    """Restrict `pid` (its main thread; later children inherit) to `cpus`."""
    if not cpus:
        raise AffinityError(f"refusing to pin pid {pid} to an empty CPU set")
    try:
        os.sched_setaffinity(pid, cpus.ids())
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, "E?")
        hint = {
            errno.ESRCH: "no such process",
            errno.EINVAL: "none of these CPUs is online and allowed for the process",
            errno.EPERM: "not permitted to change this process's affinity",
        }.get(exc.errno or 0, os.strerror(exc.errno or 0))
        raise AffinityError(f"sched_setaffinity(pid {pid}, CPUs {cpus.format()}) failed: "
                            f"{name} ({hint})") from None


def process_affinity(pid: int = 0) -> CpuSet:
    """CPUs `pid` (0: the caller) may run on."""
    try:
        return CpuSet(os.sched_getaffinity(pid))
    except OSError as exc:
        raise AffinityError(f"sched_getaffinity(pid {pid}) failed: "
                            f"{errno.errorcode.get(exc.errno or 0, 'E?')} "
                            f"({os.strerror(exc.errno or 0)})") from None


@dataclass(frozen=True)
class MemoryBindResult:
    """Outcome of bind_memory_self; falsy when the binding was not applied."""

    applied: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.applied


def bind_memory_self(nodes: Iterable[int], *, machine: str | None = None) -> MemoryBindResult:
    """set_mempolicy(MPOL_BIND, nodes) for the calling thread.

    Returns MemoryBindResult(False, reason) when the architecture or the
    kernel/sandbox does not allow it (seccomp profiles often refuse it);
    invalid node ids raise ValueError before any syscall.
    """
    mask = NumaMask(nodes)
    if not mask:
        raise ValueError("bind_memory_self needs at least one NUMA node")
    arch = machine or os.uname().machine
    number = _SET_MEMPOLICY.get(arch)
    if number is None:
        return MemoryBindResult(False, f"set_mempolicy syscall number unknown for architecture "
                                       f"{arch!r}")
    bits = mask.bits.bit_length()
    words = (bits + _ULONG_BITS - 1) // _ULONG_BITS
    nodemask = (ctypes.c_ulong * words)(*_words(mask.bits, words))
    ctypes.set_errno(0)
    # The kernel reads maxnode-1 bits (historic off-by-one), hence the + 1.
    rc = libc().syscall(ctypes.c_long(number), ctypes.c_int(MPOL_BIND), nodemask,
                      ctypes.c_ulong(words * _ULONG_BITS + 1))
    if rc != 0:
        code = ctypes.get_errno()
        return MemoryBindResult(False, f"set_mempolicy(MPOL_BIND, nodes "
                                       f"{CpuSet(mask.nodes()).format()}) failed: "
                                       f"{errno.errorcode.get(code, 'E?')} ({os.strerror(code)})")
    return MemoryBindResult(True)


def memory_policy_self(*, machine: str | None = None) -> tuple[int, NumaMask] | None:
    """(mode, nodes) of the calling thread's memory policy via
    get_mempolicy, or None when it cannot be queried."""
    number = _GET_MEMPOLICY.get(machine or os.uname().machine)
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
    return mode.value, NumaMask.from_bits(bits)


def _words(bits: int, count: int) -> list[int]:
    mask = (1 << _ULONG_BITS) - 1
    return [(bits >> (i * _ULONG_BITS)) & mask for i in range(count)]
