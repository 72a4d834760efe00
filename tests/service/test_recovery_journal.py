"""Restart with a journal: what was acknowledged since the last snapshot comes
back by replay; a torn tail is dropped and cut off; a damaged journal is moved
aside and what it held after the damage is rebuilt from the cgroup tree."""

from __future__ import annotations

import logging

from numa_agent.service.requests import AdmitRequest
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.state.journal import parse_journal
from tests.service.test_agent_service import env  # noqa: F401  (a fixture)
from tests.support.simulated_service import start


def admitted(env, sleepers, names):  # noqa: F811
    machine, state_dir, root = env
    service, _ = start(machine, state_dir, root)
    for name in ("base1", "base2", "base3"):  # a snapshot big enough to journal after
        service.admit(AdmitRequest(name=name, shared=True), sleepers())
    service.store.commit(service.state, snapshot=True)
    for name in names:
        service.admit(AdmitRequest(name=name, cpus=2), sleepers())
    assert len(parse_journal(service.store.journal_path.read_bytes()).entries) == len(names)
    return service


def test_restart_replays_the_journal(env, sleepers, caplog):  # noqa: F811
    machine, state_dir, root = env
    service = admitted(env, sleepers, ["a", "b"])
    service.release("a", None)
    expected = {w.name: w.booking.cpus for w in service.state.workloads}
    with caplog.at_level(logging.INFO, logger="numa_agent.recovery"):
        service2, report = start(machine, state_dir, root)
    assert {w.name: w.booking.cpus for w in service2.state.workloads} == expected
    assert report.adopted == () and report.released == () and report.quarantined is None
    assert "3 journal entries after it restored" in caplog.text
    assert service2.store.journal_path.stat().st_size == 0  # install wrote a snapshot


def test_a_torn_tail_is_dropped_and_cut_off_at_restart(env, sleepers, caplog):  # noqa: F811
    machine, state_dir, root = env
    service = admitted(env, sleepers, ["a"])
    with open(service.store.journal_path, "ab") as f:
        f.write(b'{"checksum":"sha256:0123')
    with caplog.at_level(logging.WARNING, logger="numa_agent.recovery"):
        service2, report = start(machine, state_dir, root)
    assert service2.state.workload("a") is not None and report.quarantined is None
    assert "torn entry" in caplog.text
    assert service2.store.journal_path.read_bytes() == b""


def test_a_damaged_journal_is_moved_aside_and_the_rest_rebuilt(env, sleepers, caplog):  # noqa: F811
    machine, state_dir, root = env
    service = admitted(env, sleepers, ["a", "b", "c"])
    cpus = {w.name: w.booking.cpus for w in service.state.workloads}
    journal = service.store.journal_path
    raw = bytearray(journal.read_bytes())
    second = raw.index(b"\n") + 1
    raw[second + 40] ^= 0x02  # entry 2 of 3 (b's admission)
    journal.write_bytes(bytes(raw))
    with caplog.at_level(logging.ERROR, logger="numa_agent.recovery"):
        service2, report = start(machine, state_dir, root)
    assert "journal" in caplog.text and "entry 2" in caplog.text
    moved = [p.name for p in state_dir.iterdir() if p.name.startswith("checkpoint.journal.corrupt-")]
    assert len(moved) == 1
    # a came from the journal; b and c from their cgroups' booking records
    assert sorted(report.adopted) == ["b", "c"]
    assert {w.name: w.booking.cpus for w in service2.state.workloads} == cpus
    assert CheckpointStore(state_dir).load_generation().damaged == ()
