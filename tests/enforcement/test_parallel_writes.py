"""CgroupEnforcer under the commit unit's parallel writes (issue 37): changes that
share no cgroup are applied from different threads at once. Each test forces the
interleaving with a barrier or events, never with a sleep."""

from __future__ import annotations

import threading

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.plan import RELEASED_CGROUP, SHARED_CGROUP, CgroupSpec
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs


def _run(*targets):
    """Run each target in a thread; the exceptions they raised."""
    errors: list[BaseException] = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_two_evictions_at_once_both_make_do_with_one_released_cgroup(fake_root, sleepers):
    """Two releases of different workloads, applied at once, each find
    `shared/_released` missing and make it: the second must not fail on EEXIST
    (and so roll a release back)."""
    enforcer = CgroupEnforcer(CgroupV2(fake_root, SimulatedCgroupfs(fake_root)))
    try:
        enforcer.setup()
        pool = CpuSet.parse("0-11")
        layout = {
            SHARED_CGROUP: CgroupSpec(SHARED_CGROUP, pool, (0, 1)),
            "wl-a": CgroupSpec("wl-a", CpuSet([12]), (0,), workload="a"),
            "wl-b": CgroupSpec("wl-b", CpuSet([13]), (0,), workload="b"),
        }
        enforcer.apply({}, layout)
        for rel in ("wl-a", "wl-b"):
            enforcer.cgroup.move_pid(rel, sleepers().pid)
        after = {SHARED_CGROUP: layout[SHARED_CGROUP],
                 RELEASED_CGROUP: CgroupSpec(RELEASED_CGROUP, pool, (0, 1))}
        both_looked = threading.Barrier(2)
        exists = enforcer.cgroup.exists

        def looked(relpath: str) -> bool:
            found = exists(relpath)
            if relpath == RELEASED_CGROUP:
                both_looked.wait()  # each saw it missing before either made it
            return found

        enforcer.cgroup.exists = looked  # type: ignore[method-assign]
        errors = _run(lambda: enforcer.evict("wl-a", None, None, after),
                      lambda: enforcer.evict("wl-b", None, None, after))
        enforcer.cgroup.exists = exists  # type: ignore[method-assign]
        assert errors == []
        assert not exists("wl-a") and not exists("wl-b")
        assert len(enforcer.pids(RELEASED_CGROUP)) == 2
    finally:
        enforcer.close()
