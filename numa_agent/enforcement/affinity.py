"""Affinity fallback for machines without a writable cgroup v2 cpuset
(containers, hybrid cgroup v1 hosts): CPU pinning with sched_setaffinity and
memory binding with set_mempolicy(MPOL_BIND).

Neither survives the way a cgroup does: affinity is per thread and inherited
only by threads and children created afterwards, and a memory policy applies
to the calling thread only. So `numa-run` binds *itself* right before exec,
and the agent pins the caller's PID at admission time.
"""

from __future__ import annotations

import errno
import os

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.errors import AffinityError


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
