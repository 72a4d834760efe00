"""--isolate through the service: the admission's answer, release, restart after a crash, strictness."""

from __future__ import annotations

import errno
import os

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.api.errors import BadRequest
from numa_agent.api.validation import parse_admit_request
from numa_agent.core.caller import Caller
from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.simulated_cgroupfs import make_simulated_cgroup_root
from numa_agent.isolation.keeper import IsolationKeeper
from numa_agent.service.refusals import NoCapacity, NotPermitted
from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.views.metrics import build_registry
from tests.support.isolation_tree import CPU, Failing, machine, snapshot
from tests.support.simulated_service import start
from tests.support.synthetic import make_topology

ME = Caller(pid=os.getpid(), uid=0, gid=0)  # only root (or a configured group) may ask for --isolate
USER = Caller(pid=os.getpid(), uid=1000, gid=1000)


@pytest.fixture
def env(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    m = build_machine(topo, PolicyConfig())
    tree = machine(tmp_path / "machine", cpus=16)
    return m, tmp_path / "state", make_simulated_cgroup_root(tmp_path / "cg", m.usable_cpus, [0, 1]), tree


def keeper(tree, fail=None):
    return IsolationKeeper(Failing(tree, fail or {}))


def irq24(tree) -> CpuSet:
    return CpuSet.parse((tree / "proc/irq/24/smp_affinity_list").read_text())


def test_the_answer_says_what_was_done_and_release_restores(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    out = service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs", "idle", "freq"]), ME)
    cpus = CpuSet.parse(out["cpus"])
    assert out["isolation"]["done"] == ["irqs", "idle"]
    assert "freq: not available on this machine" in out["isolation"]["not_done"]
    assert irq24(tree).isdisjoint(cpus) and irq24(tree) | cpus == CpuSet.parse("0-15")
    saved = CheckpointStore(state_dir).load()
    assert saved["isolation"]["originals"]["irq/24"] == "0-15"  # recorded with the booking
    status = service.status()
    assert status["workloads"][0]["isolation"]["asked"] == ["irqs", "idle", "freq"]
    assert status["isolation"]["knobs_held"] > 0
    service.release("a", None)
    assert snapshot(tree) == before and "isolation" not in CheckpointStore(state_dir).load()


def test_restart_after_a_crash_restores_what_an_exited_workload_held(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    service.admit(AdmitRequest(name="gone", cpus=2, isolate=["irqs", "idle"]), ME)
    assert snapshot(tree) != before
    # The agent is killed; the workload exits meanwhile; a new agent starts.
    (root / "wl-gone" / "cgroup.procs").write_text("")
    (root / "wl-gone" / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    service2, report = start(m, state_dir, root, isolation=keeper(tree))
    assert report.released == ("gone",)
    assert snapshot(tree) == before and not service2.state.isolation


def test_strict_refuses_what_the_machine_lacks_before_booking(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    with pytest.raises(NoCapacity) as info:
        service.admit(AdmitRequest(name="a", cpus=2, isolate=["freq"], isolate_strict=True), ME)
    assert "freq: not available on this machine" in str(info.value)
    assert service.state.workloads == () and snapshot(tree) == before
    # Without --isolate-strict the same request is admitted and says what it could not do.
    out = service.admit(AdmitRequest(name="a", cpus=2, isolate=["freq"]), ME)
    assert out["isolation"]["not_done"] == ["freq: not available on this machine"]


def test_strict_refuses_when_a_write_is_refused_and_restores_the_rest(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree, {"irq/25": errno.EACCES}))
    with pytest.raises(NoCapacity) as info:
        service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"], isolate_strict=True), ME)
    assert "irq/25: Permission denied" in str(info.value)
    assert service.state.workloads == () and snapshot(tree) == before


def test_managed_interrupts_do_not_make_strict_refuse(env):
    m, state_dir, root, tree = env
    service, _ = start(m, state_dir, root, isolation=keeper(tree, {"irq/25": errno.EIO}))
    out = service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"], isolate_strict=True), ME)
    assert "irq 25: kernel-managed, not movable" in out["isolation"]["not_done"]
    assert service.status()["isolation"]["not_movable"] == ["irq/25"]


def test_a_failed_restore_is_in_status_and_metrics_and_retried(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    files = Failing(tree, {})
    service, _ = start(m, state_dir, root, isolation=IsolationKeeper(files))
    service.admit(AdmitRequest(name="a", cpus=2, isolate=["idle"]), ME)
    files.fail = {key: errno.EBUSY for key in service.state.isolation.originals}
    service.release("a", None)
    assert service.isolation_pending()
    failures = service.status()["isolation"]["restore_failures"]
    assert len(failures) == 2 and failures[0]["error"] == "Device or resource busy"
    text = _metrics(service)
    assert "numa_agent_isolation_restore_failures 2.0" in text
    assert 'numa_agent_isolation_knobs{kind="idle",state="restore_failed"} 2.0' in text
    assert CheckpointStore(state_dir).load()["isolation"]["originals"]  # still recorded
    files.fail = {}
    service.retry_isolation()
    assert not service.isolation_pending() and snapshot(tree) == before
    assert "isolation" not in CheckpointStore(state_dir).load()


def test_a_config_default_isolates_exclusive_workloads_only(env):
    m, state_dir, root, tree = env
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    service.isolate_default = ("idle",)
    out = service.admit(AdmitRequest(name="a", cpus=1), ME)
    cpu = CpuSet.parse(out["cpus"]).min()
    assert (tree / f"{CPU}/cpu{cpu}/power/pm_qos_resume_latency_us").read_text().strip() == "n/a"
    assert service.admit(AdmitRequest(name="s", shared=True), ME)["isolation"] is None


def test_the_api_refuses_isolate_on_the_shared_pool_and_unknown_kinds():
    with pytest.raises(BadRequest, match="exclusive CPUs"):
        parse_admit_request(b'{"shared": true, "isolate": ["irqs"]}')
    with pytest.raises(BadRequest, match="unknown isolation 'irq'"):
        parse_admit_request(b'{"cpus": 1, "isolate": ["irq"]}')
    with pytest.raises(BadRequest, match="isolate_strict needs isolate"):
        parse_admit_request(b'{"cpus": 1, "isolate_strict": true}')
    assert parse_admit_request(b'{"cpus": 1, "isolate": ["all"]}').isolate == ["irqs", "idle", "freq"]


def _metrics(service) -> str:
    from prometheus_client import generate_latest

    return generate_latest(build_registry(service.metrics_snapshot)).decode()


def test_losing_every_checkpoint_generation_loses_no_original(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs", "idle"]), ME)
    service.enforcer.close()
    for name in ("checkpoint.json", "checkpoint.json.prev", "checkpoint.journal"):
        (state_dir / name).unlink(missing_ok=True)  # lost with the disk they were on
    # The agent restarts: the workload is adopted from its cgroup's record, isolating again.
    service2, report = start(m, state_dir, root, isolation=keeper(tree))
    assert report.adopted == ("a",)
    assert service2.state.isolation.originals["irq/24"] == "0-15"  # not the value the agent wrote
    service2.release("a", None)
    assert snapshot(tree) == before and not service2.state.isolation


def test_an_older_generation_loaded_loses_no_original_it_lacks(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    service.admit(AdmitRequest(name="plain", cpus=1), ME)
    service.store.commit(service.state, snapshot=True)  # a generation without any original
    older = (state_dir / "checkpoint.json").read_bytes()
    service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"]), ME)
    service.enforcer.close()
    (state_dir / "checkpoint.journal").unlink(missing_ok=True)
    (state_dir / "checkpoint.json").write_bytes(older)  # the newer generations damaged, an older one read
    (state_dir / "checkpoint.json.prev").unlink(missing_ok=True)
    service2, report = start(m, state_dir, root, isolation=keeper(tree))
    assert "a" in report.adopted
    service2.release("a", None)  # (plain's cgroup lost its one process to a: released at the restart)
    assert snapshot(tree) == before and not service2.state.isolation


def test_only_root_or_the_configured_group_may_ask_for_isolation(env):
    m, state_dir, root, tree = env
    before = snapshot(tree)
    service, _ = start(m, state_dir, root, isolation=keeper(tree))
    for dry_run in (True, False):
        with pytest.raises(NotPermitted, match=r"only root may ask for it.*\[isolation\] group"):
            service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"]), USER, dry_run=dry_run)
    assert service.state.workloads == () and snapshot(tree) == before
    service.isolate_gid = 4242
    with pytest.raises(NotPermitted):
        service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"]), USER)
    member = Caller(pid=os.getpid(), uid=1000, gid=1000, groups=(27, 4242))
    assert service.admit(AdmitRequest(name="a", cpus=2, isolate=["irqs"]), member)["isolation"]["done"] == ["irqs"]
    primary = Caller(pid=os.getpid(), uid=1001, gid=4242)
    assert service.admit(AdmitRequest(name="b", cpus=1, isolate=["idle"]), primary)["isolation"]["done"] == ["idle"]
    # What the administrator configured as the default applies to everyone's exclusive workloads.
    service.isolate_default = ("idle",)
    assert service.admit(AdmitRequest(name="c", cpus=1), USER)["isolation"]["done"] == ["idle"]


def test_a_first_start_looks_for_no_kept_originals_and_logs_nothing_of_it(env, caplog):
    m, state_dir, root, tree = env
    import logging

    with caplog.at_level(logging.WARNING):
        start(m, state_dir, root, isolation=keeper(tree))
    assert not [r for r in caplog.records if "booking record" in r.getMessage()]
