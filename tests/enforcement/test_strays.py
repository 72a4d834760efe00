"""The affinity fallback finds a workload's processes that left its process tree (a
daemon's double fork: the parent exits, the grandchild is reparented to PID 1 or a
subreaper) by the mark numa-run gave the workload, so that the CPUs handed to someone
else are not kept by them. Real processes on this machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.names import ENV_WORKLOAD
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.plan import SHARED_CGROUP, CgroupSpec
from tests.support.processes import kill_all

# Forks a child that forks the grandchild and exits at once (the daemon's double fork);
# prints the grandchild's pid, then waits for stdin to close before exiting itself.
DAEMONISE = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        if os.environ.get("DROP_UID"):  # a process of another user
            os.setresuid(*[int(os.environ["DROP_UID"])] * 3)
        os.close(r); os.write(w, str(os.getpid()).encode()); os.close(w)
        time.sleep(120)
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode(), flush=True)
sys.stdin.read()
"""


def cpus_or_skip() -> tuple[CpuSet, CpuSet]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to move between")
    return CpuSet(allowed[:1]), CpuSet(allowed[1:2])


def affinity(pid: int) -> CpuSet:
    return CpuSet(os.sched_getaffinity(pid))


def orphan_parent(grandchild: int) -> int:
    with open(f"/proc/{grandchild}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


@pytest.fixture
def daemonised():
    """(workload process, its double-forked grandchild) started with `name`'s mark on `cpus`."""
    started: list[tuple[subprocess.Popen, int]] = []

    def start(name: str, cpus: CpuSet, uid: int | None = None) -> tuple[subprocess.Popen, int]:
        env = {**os.environ, ENV_WORKLOAD: name, **({"DROP_UID": str(uid)} if uid is not None else {})}
        proc = subprocess.Popen([sys.executable, "-c", DAEMONISE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env, text=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus.ids()))
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        started.append((proc, grandchild))
        return proc, grandchild

    yield start
    for proc, grandchild in started:
        kill_all([grandchild])
        proc.kill()
        proc.wait()


def test_a_released_workloads_daemonised_grandchild_goes_to_the_pool(daemonised):
    pool, exclusive = cpus_or_skip()
    name = f"ex-{os.getpid()}"
    proc, grandchild = daemonised(name, exclusive)
    enforcer = AffinityEnforcer("test")
    try:
        assert enforcer.track(name, proc.pid)
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()  # the workload's process exits: the agent releases it
        assert orphan_parent(grandchild) != proc.pid and affinity(grandchild) == exclusive
        old = {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0,)),
               name: CgroupSpec(name, exclusive, (0,), workload=name, pid=proc.pid)}
        new = {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool | exclusive, (0,))}
        enforcer.apply(old, new)
        assert affinity(grandchild) == pool | exclusive  # not the CPUs handed on
    finally:
        enforcer.close()


def test_a_pool_shrink_takes_a_shared_workloads_escaped_grandchild_too(daemonised):
    kept, taken = cpus_or_skip()
    name = f"sh-{os.getpid()}"
    proc, grandchild = daemonised(name, kept | taken)
    rel = f"shared/{name}"
    enforcer = AffinityEnforcer("test")

    def layout(pool: CpuSet) -> dict:
        return {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0,)),
                rel: CgroupSpec(rel, pool, (0,), workload=name, pid=proc.pid, inherit=True)}

    try:
        assert enforcer.track(rel, proc.pid)
        enforcer.apply(layout(kept | taken), layout(kept), changed=frozenset({SHARED_CGROUP}))
        assert affinity(proc.pid) == kept and affinity(grandchild) == kept
    finally:
        enforcer.close()


def test_a_process_of_another_name_is_left_alone(daemonised):
    pool, exclusive = cpus_or_skip()
    name = f"ex-{os.getpid()}"
    proc, grandchild = daemonised(f"other-{os.getpid()}", exclusive)
    enforcer = AffinityEnforcer("test")
    try:
        old = {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0,)),
               name: CgroupSpec(name, exclusive, (0,), workload=name, pid=None)}
        enforcer.apply(old, {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool | exclusive, (0,))})
        assert affinity(grandchild) == exclusive and affinity(proc.pid) == exclusive
    finally:
        enforcer.close()


def test_a_stray_that_cannot_be_pinned_does_not_fail_the_change(daemonised, monkeypatch):
    """The mark is anyone's to set: a process carrying it that cannot be pinned is logged,
    and the release goes on."""
    from numa_agent.enforcement import affinity_enforcer as module
    from numa_agent.enforcement.errors import EnforcementError
    pool, exclusive = cpus_or_skip()
    name = f"ex-{os.getpid()}"
    _, grandchild = daemonised(name, exclusive)

    def refuse(pids, cpus, **kwargs):
        raise EnforcementError("cannot pin")

    monkeypatch.setattr(module, "_pin_trees", refuse)
    enforcer = AffinityEnforcer("test")
    try:
        old = {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0,)),
               name: CgroupSpec(name, exclusive, (0,), workload=name, pid=None)}
        enforcer.apply(old, {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool | exclusive, (0,))})
        assert affinity(grandchild) == exclusive
    finally:
        enforcer.close()


def test_a_resize_takes_its_owners_strays_into_the_smaller_booking_and_no_one_elses(daemonised):
    from numa_agent.state.model import Workload
    kept, given_back = cpus_or_skip()
    if os.geteuid() != 0:
        pytest.skip("starts a process of another uid")
    name = f"ex-{os.getpid()}"
    proc, own = daemonised(name, kept | given_back)
    _, foreign = daemonised(name, kept | given_back, uid=65534)  # anyone may set the mark
    record = Workload(name=name, owner_uid=os.geteuid())
    enforcer = AffinityEnforcer("test")

    def layout(cpus: CpuSet) -> dict:
        return {SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, CpuSet(), (0,)),
                name: CgroupSpec(name, cpus, (0,), workload=name, pid=proc.pid, record=record)}

    try:
        assert enforcer.track(name, proc.pid)
        enforcer.apply(layout(kept | given_back), layout(kept), changed=frozenset({name}))
        assert affinity(proc.pid) == kept and affinity(own) == kept
        assert affinity(foreign) == kept | given_back  # not pinned into another's booking
    finally:
        enforcer.close()
