"""The commit unit lets go of the service's lock for the kernel writes: a cgroup
write the kernel holds up stops only the changes that depend on it; the state,
the checkpoint and the cgroup tree still agree once it is let through."""

import os
import threading

import pytest

from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.errors import CgroupNoSpaceError
from numa_agent.enforcement.plan import desired_layout
from numa_agent.service.refusals import InConflict, Unavailable
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from tests.service.test_agent_service import env  # noqa: F401 (a fixture)
from tests.support.simulated_service import cg_file, start

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
WAIT = 60  # seconds: only a guard against hanging, never a measure


class Stall:
    """The cpuset write of one workload's cgroup waits until `let_through`
    (and then fails, when told to)."""

    def __init__(self, service, monkeypatch, relpath, fail=False):
        self.entered, self.gate, self.fail = threading.Event(), threading.Event(), fail
        cgroup = service.enforcer.cgroup
        real = cgroup.write_cpuset

        def write_cpuset(rel, cpus, mems):
            if rel == relpath:
                self.entered.set()
                self.gate.wait()
                if self.fail:
                    raise CgroupNoSpaceError(f"write {cpus} to {rel}/cpuset.cpus: ENOSPC", path=rel)
            return real(rel, cpus, mems)

        monkeypatch.setattr(cgroup, "write_cpuset", write_cpuset)

    def let_through(self):
        self.gate.set()


class Run(threading.Thread):
    """`calls` one after the other on a thread of their own; what they
    returned, or the exception that ended them."""

    def __init__(self, *calls):
        super().__init__(daemon=True)
        self.calls, self.results, self.error = calls, [], None
        self.start()

    def run(self):
        try:
            for call in self.calls:
                self.results.append(call())
        except Exception as exc:  # handed to the test
            self.error = exc


def agree(service, root, state_dir, names):
    """State, checkpoint and cgroup tree hold `names`, each with its CPUs, and the pool the rest."""
    assert {w.name for w in service.state.workloads} == names
    assert {w["name"] for w in CheckpointStore(state_dir).load()["workloads"]} == names
    for w in service.state.workloads:
        assert CpuSet.parse(cg_file(root, f"wl-{w.name}", "cpuset.cpus")) == w.booking.cpus
    assert sorted(p.name for p in root.glob("wl-*")) == sorted(f"wl-{n}" for n in names)
    assert CpuSet.parse(cg_file(root, "shared", "cpuset.cpus")) == CpuSet.parse(service.status()["shared_pool"])
    assert service.layout == desired_layout(service.machine, service.state)


@pytest.mark.parametrize("fails", [False, True], ids=["let-through", "fails"])
def test_a_stalled_write_holds_up_no_other_admission_or_release(env, monkeypatch, fails):  # noqa: F811
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    service.admit(AdmitRequest(name="first", cpus=2), ME)
    stall = Stall(service, monkeypatch, "wl-slow", fail=fails)
    slow = Run(lambda: service.admit(AdmitRequest(name="slow", cpus=2), ME))
    assert stall.entered.wait(WAIT)
    others = Run(lambda: service.admit(AdmitRequest(name="other", cpus=2), ME),
                 lambda: service.release("first", ME))
    others.join(WAIT)
    done_meanwhile = not others.is_alive()
    stall.let_through()
    slow.join(WAIT)
    others.join(WAIT)
    assert done_meanwhile, "an admission and a release waited for another workload's cgroup write"
    assert others.error is None
    if fails:
        # only its own change is taken back: the other admission and the release stand
        assert isinstance(slow.error, Unavailable) and "nothing was booked" in str(slow.error)
        agree(service, root, state_dir, {"other"})
    else:
        assert slow.error is None and slow.results[0]["name"] == "slow"
        agree(service, root, state_dir, {"slow", "other"})
        assert CpuSet.parse(slow.results[0]["cpus"]).isdisjoint(service.state.workload("other").booking.cpus)


def test_a_release_asked_during_its_admissions_stall_is_applied_after_it(env, monkeypatch):  # noqa: F811
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    stall = Stall(service, monkeypatch, "wl-slow")
    slow = Run(lambda: service.admit(AdmitRequest(name="slow", cpus=2), ME))
    assert stall.entered.wait(WAIT)
    release = Run(lambda: service.release("slow", ME))
    stall.let_through()
    slow.join(WAIT)
    release.join(WAIT)
    assert slow.error is None and release.error is None
    # applied in the other order, the admission would have made wl-slow again after its removal
    agree(service, root, state_dir, set())


def test_an_admission_taking_the_cpus_of_a_stalled_release_waits_for_it(env, monkeypatch):  # noqa: F811
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    cpus = CpuSet.parse(service.admit(AdmitRequest(name="gone", cpus=len(machine.usable_cpus) - 4), ME)["cpus"])
    cgroup = service.enforcer.cgroup
    entered, gate = threading.Event(), threading.Event()
    real = cgroup.remove

    def remove(rel, *args, **kwargs):
        if rel == "wl-gone":
            entered.set()
            gate.wait()
        return real(rel, *args, **kwargs)

    monkeypatch.setattr(cgroup, "remove", remove)
    release = Run(lambda: service.release("gone", ME))
    assert entered.wait(WAIT)
    # Only the released CPUs are left for it: its cpuset is written once they are out of wl-gone.
    admit = Run(lambda: service.admit(AdmitRequest(name="next", cpus=4), ME))
    gate.set()
    release.join(WAIT)
    admit.join(WAIT)
    assert release.error is None and admit.error is None
    assert CpuSet.parse(admit.results[0]["cpus"]) & cpus
    agree(service, root, state_dir, {"next"})


def test_an_exit_seen_before_the_process_moved_in_releases_nothing(env, monkeypatch):  # noqa: F811
    """The event loop may see a new workload's cgroup empty between its making and the
    move: that release, asked while the admission is still being written, is refused."""
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    stall = Stall(service, monkeypatch, "wl-slow")
    slow = Run(lambda: service.admit(AdmitRequest(name="slow", cpus=2), ME))
    assert stall.entered.wait(WAIT)
    exited = Run(lambda: service.release("slow", None, reason="exited"))
    stall.let_through()
    slow.join(WAIT)
    exited.join(WAIT)
    assert slow.error is None
    assert isinstance(exited.error, InConflict)
    agree(service, root, state_dir, {"slow"})
