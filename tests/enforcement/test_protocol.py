"""Both enforcers provide the whole Enforcer protocol, with the same signatures,
so the service never needs to ask which one it holds (only for a capability:
EngineCgroups, KeptRecords)."""

from __future__ import annotations

import inspect
import os
import select
import signal

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.cgroup import CgroupV2, KernelFiles
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.protocol import Applying, Enforcer, Grant, KeptRecords, Records, Tracking, kept_records

ROLES = (Applying, Tracking, Records)  # EngineCgroups, KeptRecords: capabilities, see test_no_stubs.py
OWN = {role: {name for name in vars(role) if not name.startswith("_")} for role in ROLES}
ROLE_OF = {name: role for role, names in OWN.items() for name in names}
MEMBERS = sorted(ROLE_OF)
ATTRIBUTES = [name for name in MEMBERS if isinstance(vars(ROLE_OF[name])[name], property)]
METHODS = [name for name in MEMBERS if name not in ATTRIBUTES]


@pytest.fixture(params=["cgroup", "affinity"])
def enforcer(request):
    if request.param == "cgroup":
        instance = CgroupEnforcer(request.getfixturevalue("cg"))
    else:
        instance = AffinityEnforcer("no cgroup v2 here (test)")
    yield instance
    instance.close()


def test_the_protocol_covers_what_the_service_uses():
    assert ATTRIBUTES == ["mode", "reason"]
    assert set(METHODS) >= {"setup", "apply", "verify", "exists", "populated", "pids", "existing",
                            "track", "fds", "released", "close"}


def test_the_roles_split_the_protocol_without_overlap():
    assert sum(len(names) for names in OWN.values()) == len(MEMBERS) == 18
    assert all(role in Enforcer.__mro__ for role in ROLES)
    assert {name for name in vars(Enforcer) if not name.startswith("_")} == set()  # nothing of its own
    assert OWN[Tracking] >= {"track", "fds", "released"} and OWN[Applying] >= {"apply", "verify", "evict"}


def test_both_enforcers_are_enforcers(enforcer):
    assert isinstance(enforcer, Enforcer)
    assert isinstance(enforcer.mode, str) and enforcer.mode
    assert enforcer.reason is None or isinstance(enforcer.reason, str)


@pytest.mark.parametrize("name", sorted(n for n in vars(KeptRecords) if not n.startswith("_")))
def test_the_kept_records_have_the_capabilitys_signature(name):
    wanted = inspect.signature(getattr(KeptRecords, name), eval_str=True)
    assert inspect.signature(getattr(CgroupEnforcer, name), eval_str=True) == wanted


@pytest.mark.parametrize("cls", [CgroupEnforcer, AffinityEnforcer])
@pytest.mark.parametrize("name", METHODS)
def test_every_method_has_the_protocol_signature(cls, name):
    wanted = inspect.signature(getattr(ROLE_OF[name], name), eval_str=True)
    got = inspect.signature(getattr(cls, name), eval_str=True)
    assert got == wanted, f"{cls.__name__}.{name}{got} differs from {ROLE_OF[name].__name__}.{name}{wanted}"


def test_event_loop_side_of_a_fresh_enforcer(enforcer):
    fds = enforcer.fds()
    assert fds and all(isinstance(fd, int) and fd >= 0 for fd in fds)
    assert enforcer.released(set()) == []
    kept = kept_records(enforcer)
    assert enforcer.existing() == [] and (kept is None or kept.prune({}) == [])


def test_track_of_an_unknown_workload_is_false(enforcer):
    assert not enforcer.track("wl-ghost", None)


def test_affinity_tracks_the_pid_and_releases_on_exit(sleepers):
    enforcer = AffinityEnforcer("test")
    try:
        proc = sleepers()
        assert enforcer.track("wl-a", proc.pid)
        assert enforcer.populated("wl-a") and enforcer.pids("wl-a") == [proc.pid]
        assert enforcer.existing() == ["wl-a"] and len(enforcer.fds()) == 1
        proc.kill()
        proc.wait()
        assert enforcer.released(set(enforcer.fds())) == ["wl-a"]
        assert not enforcer.populated("wl-a")
    finally:
        enforcer.close()


def test_affinity_releases_nothing_for_a_number_reused_by_a_live_process(sleepers):
    # A release and an admission on the API's thread give a closed pidfd's
    # number to the pidfd of a live workload: it must not be released for it.
    enforcer = AffinityEnforcer("test")
    try:
        first, second = sleepers(), sleepers()
        assert enforcer.track("wl-a", first.pid)
        (stale,) = enforcer._by_fd
        enforcer._forget("wl-a")
        assert enforcer.track("wl-b", second.pid)
        assert stale in enforcer._by_fd  # the lowest free number, reused
        assert enforcer.released(set(enforcer.fds())) == []
        second.kill()
        second.wait()
        assert enforcer.released(set(enforcer.fds())) == ["wl-b"]
    finally:
        enforcer.close()


def test_affinity_waits_on_one_descriptor_and_reports_each_exit_once(sleepers):
    enforcer = AffinityEnforcer("test")
    try:
        procs = [sleepers() for _ in range(3)]
        for i, proc in enumerate(procs):
            assert enforcer.track(f"wl-{i}", proc.pid)
        assert len(enforcer.fds()) == 1  # however many workloads it follows
        for proc in procs[:2]:
            proc.kill()
            proc.wait()
        assert enforcer.released(set(enforcer.fds())) == ["wl-0", "wl-1"]
        # Reported: not again (a release that fails is retried by the event loop),
        # and known as exited to that retry.
        assert enforcer.released(set(enforcer.fds())) == []
        assert not enforcer.populated("wl-0") and enforcer.populated("wl-2")
    finally:
        enforcer.close()


def test_affinity_counts_an_exited_unreaped_process_as_gone(sleepers):
    enforcer = AffinityEnforcer("test")
    try:
        proc = sleepers()
        assert enforcer.track("wl-a", proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        select.select([enforcer.fds()[0]], [], [], 10)
        # Not reaped yet (a zombie, which a signal of 0 still reaches): gone all the same.
        assert not enforcer.populated("wl-a") and enforcer.pids("wl-a") == []
    finally:
        enforcer.close()


def test_only_a_real_cgroup_root_grants(enforcer):
    # A simulated tree was made from the machine's own view: nothing to learn.
    # Affinity mode has nothing above the agent to grant (no KeptRecords).
    kept = kept_records(enforcer)
    assert kept is None or kept.granted() is None


def test_kernel_cgroup_root_grants_its_effective_cpuset(tmp_path):
    for name, value in (("cgroup.controllers", "cpuset"), ("cpuset.cpus.effective", "2-5"),
                        ("cpuset.mems.effective", "1")):
        (tmp_path / name).write_text(value + "\n")
    enforcer = CgroupEnforcer(CgroupV2(tmp_path, KernelFiles()))
    try:
        assert enforcer.granted() == Grant(CpuSet.parse("2-5"), NumaMask([1]),
                                           f"cgroup root {tmp_path}")
    finally:
        enforcer.close()
