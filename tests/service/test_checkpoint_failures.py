"""Every OSError on the way to a durable checkpoint is a checkpoint failure
(issue 36, defect 2): the decision is rolled back (nothing booked, freed or
resized, in the state, the cgroups or the checkpoint a load reads), the
caller gets the documented 503, health says the checkpoint is degraded until
a later commit succeeds. Faults are injected at each step of the store's
commit through its seams: the held state directory (a TrustedDir) and the
file calls of state/checkpoint.py. One test really runs out of descriptors."""

from __future__ import annotations

import errno
import os
import resource

import msgspec
import pytest

from numa_agent.api.errors import ServiceUnavailable
from numa_agent.api.server import _Request, _Router
from numa_agent.core.caller import Caller
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs, make_simulated_cgroup_root
from numa_agent.service.agent_service import AgentService
from numa_agent.service.recovery import restore
from numa_agent.service.refusals import Unavailable
from numa_agent.service.requests import AdmitRequest
from numa_agent.state import checkpoint
from numa_agent.state.checkpoint import FILE_NAME, JOURNAL_NAME, CheckpointStore
from numa_agent.state.trusted_dir import TrustedDir, open_directory
from tests.service.test_agent_service import make_machine

ME = Caller(pid=os.getpid(), uid=1000, gid=1000)
ROOT = Caller(pid=os.getpid(), uid=0, gid=0)
ERRNOS = ("EMFILE", "ENFILE", "ENOSPC", "EIO", "EROFS", "EDQUOT")
DOCUMENTED = "cannot write the checkpoint, nothing was booked"


class FaultyDir(TrustedDir):
    """The held state directory, failing one step with one errno while `fault` is set."""

    fault: tuple[str, int] | None = None
    renamed_in_place = False  # the checkpoint was just renamed into place

    def _fail(self, step: str) -> None:
        if self.fault is not None and step in self.fault[0].split("+"):
            code = self.fault[1]
            raise OSError(code, os.strerror(code))

    def listdir(self):
        self._fail("listdir")
        return super().listdir()

    def create_temporary(self, stem, mode=0o600):
        self._fail("create")
        return super().create_temporary(stem, mode)

    def open(self, name, flags, mode=0o600):
        if name == JOURNAL_NAME and flags & os.O_APPEND:
            self._fail("journal_open")
        return super().open(name, flags, mode)

    def link(self, source, target):
        self._fail("link")
        return super().link(source, target)

    def rename(self, source, target):
        if target == FILE_NAME:
            self._fail("rename")
        super().rename(source, target)
        self.renamed_in_place = target == FILE_NAME

    def fsync(self):
        if self.renamed_in_place:
            self.renamed_in_place = False
            self._fail("dir_fsync_after_rename")
        self._fail("dir_fsync")
        super().fsync()


class FaultyOs:
    """state/checkpoint.py's `os`, failing one file call while `fault` is set."""

    def __init__(self, held: FaultyDir) -> None:
        self.held = held

    def __getattr__(self, name):
        real = getattr(os, name)
        if name not in ("fsync", "fdatasync", "ftruncate"):
            return real

        def call(fd, *args):
            if fd != self.held.fd:
                self.held._fail(name)
            return real(fd, *args)
        return call


# (step, commits that meet it: "snapshot", "journal" or both)
STEPS = (("listdir", "snapshot"), ("create", "snapshot"), ("write", "both"), ("fsync", "snapshot"),
         ("rename", "snapshot"), ("dir_fsync", "snapshot"), ("dir_fsync_after_rename", "snapshot"),
         ("journal_open", "journal"), ("fdatasync", "journal"),
         ("fdatasync+ftruncate", "journal"))  # the failed entry cannot be cut off again
CASES = [(step, kind, name) for step, where in STEPS for kind in ("snapshot", "journal")
         if where in (kind, "both") for name in ERRNOS]


@pytest.fixture
def agent(tmp_path, monkeypatch):
    machine = make_machine()
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    held = open_directory(tmp_path / "state", "state directory", create_mode=0o700)
    faulty = FaultyDir(held.path, held.fd)
    store = CheckpointStore(faulty)
    enforcer = CgroupEnforcer(CgroupV2(cg_root, SimulatedCgroupfs(cg_root)))
    enforcer.setup()
    state, _ = restore(machine, store, enforcer)
    service = AgentService(machine, store, enforcer)
    service.install(state)
    monkeypatch.setattr(checkpoint, "os", FaultyOs(faulty))
    real_write_all = checkpoint.write_all

    def write_all(fd, data):
        faulty._fail("write")
        real_write_all(fd, data)
    monkeypatch.setattr(checkpoint, "write_all", write_all)
    yield service, faulty, cg_root, tmp_path / "state"
    enforcer.close()  # its descriptors: hundreds of cases run in one process
    faulty.close()


def on_disk(state_dir) -> dict:
    """What a start would load."""
    store = CheckpointStore(state_dir)
    try:
        return store.load()
    finally:
        store.close()


def as_loaded(state) -> dict:
    return msgspec.json.decode(msgspec.json.encode(state.to_json()))


def fail_once(service, faulty, fault, call):
    """`call` with `fault` set; the refusal it raised."""
    faulty.fault = fault
    try:
        with pytest.raises(Unavailable) as refused:
            call()
    finally:
        faulty.fault = None
    return refused.value


def check_refused(service, refusal, name, state_dir, before):
    assert refusal.message.startswith(DOCUMENTED + ": ")
    assert name in refusal.message and "\n" not in refusal.message
    assert service.state is before or as_loaded(service.state) == as_loaded(before)
    assert on_disk(state_dir) == as_loaded(service.state)  # the checkpoint and the state agree
    health = service.health()
    assert health["status"] == "degraded" and health["checkpoint"]["healthy"] is False
    assert name in health["checkpoint"]["error"] and name in health["degraded_reason"]
    assert service.counters.checkpoint_healthy is False
    assert service.counters.checkpoint_failures_total >= 1


def check_recovered(service, state_dir):
    health = service.health()
    assert health["status"] == "ok" and health["checkpoint"]["healthy"] is True
    assert service.counters.checkpoint_healthy is True
    assert on_disk(state_dir) == as_loaded(service.state)


@pytest.mark.parametrize(("step", "kind", "name"), CASES)
def test_a_failed_admission_checkpoint_books_nothing(agent, step, kind, name):
    service, faulty, cg_root, state_dir = agent
    service.admit(AdmitRequest(name="first", cpus=1), ME)
    service.store.compact_every = 0 if kind == "snapshot" else 1000
    before, pool = service.state, (cg_root / "shared" / "cpuset.cpus").read_text()
    refusal = fail_once(service, faulty, (step, getattr(errno, name)),
                        lambda: service.admit(AdmitRequest(name="web", cpus=2), ME))
    check_refused(service, refusal, name, state_dir, before)
    assert not (cg_root / "wl-web").exists()
    assert (cg_root / "shared" / "cpuset.cpus").read_text() == pool
    service.admit(AdmitRequest(name="web", cpus=2), ME)  # the filesystem is back
    check_recovered(service, state_dir)
    assert [w.name for w in service.state.workloads] == ["first", "web"]


@pytest.mark.parametrize(("step", "kind", "name"), CASES)
def test_a_failed_release_checkpoint_keeps_the_booking(agent, step, kind, name):
    service, faulty, cg_root, state_dir = agent
    service.admit(AdmitRequest(name="web", cpus=2), ME)
    service.store.compact_every = 0 if kind == "snapshot" else 1000
    before = service.state
    refusal = fail_once(service, faulty, (step, getattr(errno, name)), lambda: service.release("web", ROOT))
    check_refused(service, refusal, name, state_dir, before)
    assert (cg_root / "wl-web").is_dir()  # still enforced
    service.release("web", ROOT)
    check_recovered(service, state_dir)
    assert service.state.workloads == ()


@pytest.mark.parametrize(("step", "kind", "name"), CASES)
def test_a_failed_resize_checkpoint_keeps_the_old_booking(agent, step, kind, name):
    service, faulty, cg_root, state_dir = agent
    service.admit(AdmitRequest(name="web", cpus=2), ME)
    service.store.compact_every = 0 if kind == "snapshot" else 1000
    before, cpus = service.state, (cg_root / "wl-web" / "cpuset.cpus").read_text()
    refusal = fail_once(service, faulty, (step, getattr(errno, name)), lambda: service.resize("web", ROOT, cpus=3))
    check_refused(service, refusal, name, state_dir, before)
    assert (cg_root / "wl-web" / "cpuset.cpus").read_text() == cpus
    service.resize("web", ROOT, cpus=3)
    check_recovered(service, state_dir)
    assert len(service.state.workload("web").booking.cpus) == 3


def _request(method: str, path: str, body: bytes = b"") -> _Request:
    return _Request(method, path, "", {}, body)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kind", ["snapshot", "journal"])
def test_out_of_descriptors_the_api_answers_503_then_recovers(tmp_path, request, kind):
    """Really out of descriptors: the soft RLIMIT_NOFILE lowered and every
    descriptor below it taken, then given back."""
    machine = make_machine()
    cg_root = make_simulated_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    store = CheckpointStore(tmp_path / "state", compact_every=0 if kind == "snapshot" else 1000)
    request.addfinalizer(store.close)
    enforcer = CgroupEnforcer(CgroupV2(cg_root, SimulatedCgroupfs(cg_root)))
    enforcer.setup()
    state, _ = restore(machine, store, enforcer)
    service = AgentService(machine, store, enforcer)
    service.install(state)
    request.addfinalizer(enforcer.close)
    router = _Router(service)
    body = msgspec.json.encode({"name": "web", "cpus": 2})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(_open_fds() + 16, 64), hard))
        while True:
            try:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        with pytest.raises(ServiceUnavailable) as refused:
            router.dispatch(_request("POST", "/v1/workloads", body), ME)
        status, health = router.dispatch(_request("GET", "/v1/health"), ME)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert refused.value.status == 503 and refused.value.code == "unavailable"
    assert refused.value.message.startswith(DOCUMENTED + ": ") and "EMFILE" in refused.value.message
    assert status == 200 and health["status"] == "degraded" and health["checkpoint"]["healthy"] is False
    assert "EMFILE" in health["degraded_reason"]
    assert service.state.workloads == () and not (cg_root / "wl-web").exists()
    # Descriptors are back: the same request goes through and health is ok again.
    status, admitted = router.dispatch(_request("POST", "/v1/workloads", body), ME)
    assert status == 201 and admitted["name"] == "web"
    status, health = router.dispatch(_request("GET", "/v1/health"), ME)
    assert health["status"] == "ok" and health["checkpoint"]["healthy"] is True
    assert [w["name"] for w in on_disk(tmp_path / "state")["workloads"]] == ["web"]


def test_enforcement_and_its_checkpoint_rollback_failing_say_the_first_failure(agent, monkeypatch):
    """Enforcement fails and so does checkpointing the state back: still nothing
    booked, the caller hears why enforcement failed, health is degraded, and
    the next commit that succeeds makes the checkpoint agree again."""
    from numa_agent.enforcement.errors import CgroupNoSpaceError
    from numa_agent.state.checkpoint import CheckpointWriteError

    service, faulty, cg_root, state_dir = agent
    real_move, real_commit = service.enforcer.cgroup.move_pid, service.store.commit
    calls = []

    def failing_move(rel, pid):
        raise CgroupNoSpaceError(f"write {pid} to {rel}/cgroup.procs: ENOSPC", path=rel)

    def commit_once(state, *, snapshot=False):
        calls.append(state)
        if len(calls) > 1:
            raise CheckpointWriteError("appending to the journal failed: EIO (Input/output error)")
        return real_commit(state, snapshot=snapshot)

    monkeypatch.setattr(service.enforcer.cgroup, "move_pid", failing_move)
    monkeypatch.setattr(service.store, "commit", commit_once)
    with pytest.raises(Unavailable, match=r"^enforcement failed, nothing was booked: .*cgroup.procs: ENOSPC"):
        service.admit(AdmitRequest(name="web", cpus=2), ME)
    monkeypatch.setattr(service.enforcer.cgroup, "move_pid", real_move)
    monkeypatch.setattr(service.store, "commit", real_commit)
    assert service.state.workloads == () and not (cg_root / "wl-web").exists()
    assert service.health()["status"] == "degraded"
    service.admit(AdmitRequest(name="other", cpus=1), ME)
    check_recovered(service, state_dir)


def test_a_hotplug_that_cannot_be_checkpointed_keeps_the_machine_it_had(agent):
    """The machine re-read after hotplug is taken on with its rebased state,
    or not at all: a refused commit leaves the old machine with the old state
    (new admissions are not decided on CPUs the bookings were not fitted to)."""
    import dataclasses

    from numa_agent.admission.machine import PolicyConfig, build_machine

    service, faulty, cg_root, state_dir = agent
    service.admit(AdmitRequest(name="web", cpus=2), ME)
    old_machine, before = service.machine, service.state
    lost = min(service.state.workload("web").booking.cpus)
    topology = old_machine.topology
    offline = dataclasses.replace(topology, cpus=tuple(dataclasses.replace(c, online=False) if c.id == lost else c
                                                       for c in topology.cpus))
    new_machine = build_machine(offline, PolicyConfig(topology_policy="best-effort",
                                                      devices={"gpu": {"vendor": "0x10de"}}))
    refusal = fail_once(service, faulty, ("journal_open", errno.EIO), lambda: service.replace_machine(new_machine))
    assert refusal.message.startswith(DOCUMENTED)
    assert service.machine is old_machine and service.state is before
    assert service.health()["status"] == "degraded"
    service.replace_machine(new_machine)
    assert service.machine is new_machine and lost not in service.state.workload("web").booking.cpus
    check_recovered(service, state_dir)


def test_a_file_the_decision_needs_failing_is_a_refusal(agent, monkeypatch):
    """Out of descriptors before anything is decided (reading the caller's
    cgroup for in_place): the documented 503's kind, one line, nothing booked."""
    service, faulty, cg_root, state_dir = agent

    def no_descriptor(pid):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), f"/proc/{pid}/cgroup")

    monkeypatch.setattr(service.enforcer, "cgroup_of", no_descriptor)
    with pytest.raises(Unavailable, match=r"^cannot decide the admission, nothing was booked: EMFILE "
                                          r"\(Too many open files\)$"):
        service.admit(AdmitRequest(name="web", cpus=2, in_place=True), ME)
    assert service.state.workloads == ()


@pytest.mark.parametrize("failing", ["cgroup", "os"])
def test_a_file_the_release_needs_failing_is_a_refusal(agent, monkeypatch, failing):
    """Out of descriptors while the release looks whether the workload's processes
    still run (its cgroup.events), before anything is checkpointed: a 503 that
    releases nothing, not a 500 with a traceback."""
    from numa_agent.enforcement.errors import CgroupError

    service, faulty, cg_root, state_dir = agent
    service.admit(AdmitRequest(name="web", cpus=2), ME)
    before = service.state

    def no_descriptor(rel):
        if failing == "cgroup":
            raise CgroupError(f"read {cg_root / rel / 'cgroup.events'} failed: EMFILE (Too many open files)")
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(cg_root / rel / "cgroup.events"))

    monkeypatch.setattr(service.enforcer, "populated", no_descriptor)
    with pytest.raises(Unavailable, match=r"^cannot release web, nothing was released: .*EMFILE"):
        service.release("web", ROOT)
    assert service.state is before and (cg_root / "wl-web").is_dir()
    monkeypatch.undo()
    service.release("web", ROOT)
    assert service.state.workloads == ()
