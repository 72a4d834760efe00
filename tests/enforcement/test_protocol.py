"""Both enforcers provide the whole Enforcer protocol, with the same signatures,
so the service never needs to ask which one it holds."""

from __future__ import annotations

import inspect

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.enforcement.cgroup import CgroupV2, KernelFiles
from numa_agent.enforcement.enforcer import AffinityEnforcer, CgroupEnforcer
from numa_agent.enforcement.protocol import Enforcer, Grant

MEMBERS = sorted(name for name in vars(Enforcer) if not name.startswith("_"))
ATTRIBUTES = [name for name in MEMBERS if isinstance(vars(Enforcer)[name], property)]
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
                            "prune", "track", "fds", "released", "granted", "close"}


def test_both_enforcers_are_enforcers(enforcer):
    assert isinstance(enforcer, Enforcer)
    assert isinstance(enforcer.mode, str) and enforcer.mode
    assert enforcer.reason is None or isinstance(enforcer.reason, str)


@pytest.mark.parametrize("cls", [CgroupEnforcer, AffinityEnforcer])
@pytest.mark.parametrize("name", METHODS)
def test_every_method_has_the_protocol_signature(cls, name):
    wanted = inspect.signature(getattr(Enforcer, name), eval_str=True)
    got = inspect.signature(getattr(cls, name), eval_str=True)
    assert got == wanted, f"{cls.__name__}.{name}{got} differs from Enforcer.{name}{wanted}"


def test_event_loop_side_of_a_fresh_enforcer(enforcer):
    fds = enforcer.fds()
    assert fds and all(isinstance(fd, int) and fd >= 0 for fd in fds)
    assert enforcer.released(set()) == []
    assert enforcer.existing() == [] and enforcer.prune({}) == []


def test_track_of_an_unknown_workload_is_false(enforcer):
    assert not enforcer.track("wl-ghost", None)


def test_affinity_tracks_the_pid_and_releases_on_exit(sleepers):
    enforcer = AffinityEnforcer("test")
    try:
        proc = sleepers()
        assert enforcer.track("wl-a", proc.pid)
        assert enforcer.populated("wl-a") and enforcer.pids("wl-a") == [proc.pid]
        assert enforcer.existing() == ["wl-a"] and len(enforcer.fds()) == 2
        proc.kill()
        proc.wait()
        assert enforcer.released(set(enforcer.fds())) == ["wl-a"]
        assert not enforcer.populated("wl-a")
    finally:
        enforcer.close()


def test_affinity_releases_nothing_for_a_number_reported_ready_while_its_process_lives(sleepers):
    # poll(2) reports a descriptor closed while it waited (POLLNVAL) as ready;
    # meanwhile a release and an admission may have given its number to the
    # pidfd of a live workload, which must not be released for it.
    enforcer = AffinityEnforcer("test")
    try:
        first, second = sleepers(), sleepers()
        assert enforcer.track("wl-a", first.pid)
        (stale,) = set(enforcer.fds()) - {enforcer.fds()[0]}
        enforcer._forget("wl-a")
        assert enforcer.track("wl-b", second.pid)
        assert stale in enforcer.fds()  # the lowest free number, reused
        assert enforcer.released({stale}) == []
        second.kill()
        second.wait()
        assert enforcer.released({stale}) == ["wl-b"]
    finally:
        enforcer.close()


def test_only_a_real_cgroup_root_grants(enforcer):
    # A simulated tree was made from the machine's own view: nothing to learn.
    assert enforcer.granted() is None


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
