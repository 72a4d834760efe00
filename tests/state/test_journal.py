"""The checkpoint journal: the change between two states and its replay
(pure), and the store that appends it, compacts it and replays it on load,
through torn tails, damage, failures and crashes at each step."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.core.cpuset import CpuSet
from numa_agent.state import checkpoint as checkpoint_module
from numa_agent.state.checkpoint import CheckpointStore, CheckpointWriteError, checksum_of
from numa_agent.state.journal import encode_entry, parse_journal, replay, state_delta
from numa_agent.state.model import AgentState, Booking, Pod, Revocation, Workload, replace


def workload(name: str, cpu: int = 0, **kw) -> Workload:
    return Workload(name=name, owner_uid=1000, pid=100 + cpu, created_unix=1.5,
                    booking=Booking(cpus=CpuSet([cpu]), numa_nodes=(0,), mems=(0,),
                                    memory={0: {"memory": 1 << 20}}), command=("sleep", "1"), **kw)


def states(n: int) -> list[AgentState]:
    """Admissions one by one: each state shares the older workloads."""
    out = [AgentState(policy_fingerprint="f")]
    for i in range(n):
        out.append(out[-1].with_workload(workload(f"w{i}", i)))
    return out


def as_read(value):
    """As a load decodes it: JSON lists, string keys."""
    return json.loads(json.dumps(value))


# ---- the change, pure ---------------------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["admit", "change", "release", "pod", "unpod", "policy", "revoke",
                                          "unrevoke"]),
                         st.integers(0, 5)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_replaying_the_delta_gives_the_new_state_exactly(ops):
    state = AgentState(policy_fingerprint="a")
    for op, i in ops:
        old = state
        name = f"w{i}"
        if op == "admit":
            state = state.with_workload(workload(name, i))
        elif op == "change" and state.workload(name):
            state = state.with_workload(replace(state.workload(name), lost=("cpu 9",)))
        elif op == "release":
            state = state.without_workload(name)
        elif op == "pod":
            state = state.with_pod(Pod(name=f"p{i}", owner_uid=0, members=(name,)))
        elif op == "unpod":
            state = state.without_pod(f"p{i}")
        elif op == "policy":
            state = replace(state, policy_fingerprint=f"fp{i}")
        elif op == "revoke":
            state = state.with_revoked((*state.revoked, Revocation(name=name, pid=100 + i, cgroup=f"wl-{name}")))
        elif op == "unrevoke":
            state = state.with_revoked(state.revoked[1:])
        delta = state_delta(old, state)
        assert (delta is None) == (as_read(old.to_json()) == as_read(state.to_json()))
        if delta is not None:
            replayed = replay(as_read(old.to_json()), (as_read(delta),))
            assert replayed == as_read(state.to_json())
            assert checksum_of(replayed) == checksum_of(state.to_json())


def test_the_delta_holds_only_what_changed():
    history = states(50)
    old, new = history[-1], history[-1].with_workload(replace(history[-1].workload("w7"), pid=5))
    delta = state_delta(old, new)
    assert delta is not None
    assert [w["name"] for w in delta["workloads"]] == ["w7"] and delta["workloads"][0]["pid"] == 5
    assert set(delta) == {"workloads"}
    gone = state_delta(new, new.without_workload("w3").without_workload("w9"))
    assert gone == {"removed_workloads": ["w3", "w9"]}


def test_an_equal_value_that_is_not_the_same_object_is_no_change():
    state = states(3)[-1]
    copy = AgentState.from_json(state.to_json())  # every object new, every value equal
    assert state_delta(state, copy) is None


def test_replay_refuses_what_is_not_a_delta():
    with pytest.raises(ValueError, match="not a state delta"):
        replay({"workloads": []}, [{"bogus": 1}])
    with pytest.raises(ValueError, match="without a name"):
        replay({"workloads": []}, [{"workloads": [{"owner_uid": 1}]}])


def test_parse_tells_a_torn_tail_from_damage_in_the_middle():
    lines = [encode_entry("sha256:b", i, {"removed_workloads": [f"w{i}"]}) for i in (1, 2, 3)]
    whole = b"".join(lines)
    assert len(parse_journal(whole).entries) == 3 and parse_journal(whole).damage is None
    torn = parse_journal(whole + lines[0][:10])
    assert len(torn.entries) == 3 and torn.torn_bytes == 10 and torn.damage is None
    zeros = parse_journal(whole + b"\0" * 30 + b"\n")  # what a power cut can leave
    assert len(zeros.entries) == 3 and zeros.torn_bytes == 31 and zeros.damage is None
    flipped = bytearray(whole)
    flipped[len(lines[0]) + 20] ^= 0x01
    middle = parse_journal(bytes(flipped))
    assert len(middle.entries) == 1 and middle.good_length == len(lines[0])
    assert middle.damage and "entry 2" in middle.damage and "1 after it are not used" in middle.damage
    last = bytearray(whole)
    last[-20] ^= 0x01  # a complete last entry with a bad checksum: rot, not a torn write
    assert parse_journal(bytes(last)).damage is not None


# ---- the store ----------------------------------------------------------------------------
def committed(tmp_path, n: int, **kw) -> tuple[CheckpointStore, list[AgentState]]:
    store = CheckpointStore(tmp_path, **kw)
    history = states(n)
    for state in history:
        store.commit(state)
    return store, history


def test_commits_append_to_the_journal_and_load_replays_them(tmp_path):
    store, history = committed(tmp_path, 40)
    snapshot = store.path.read_bytes()
    kinds = [store.commit(s) for s in (history[-1].without_workload("w1"),
                                        history[-1].without_workload("w1").without_workload("w2"))]
    assert kinds == ["journal", "journal"] and store.path.read_bytes() == snapshot
    assert store.commit(history[-1].without_workload("w1").without_workload("w2")) is None
    loaded = store.load_generation()
    expected = history[-1].without_workload("w1").without_workload("w2")
    assert loaded.data == as_read(expected.to_json()) and loaded.path == store.path
    assert loaded.journal_entries > 2 and loaded.damaged == () and loaded.torn_bytes == 0
    assert CheckpointStore(tmp_path).load() == as_read(expected.to_json())


def test_a_snapshot_every_n_entries_empties_the_journal(tmp_path):
    store, history = committed(tmp_path, 30, compact_every=4)
    assert store.load() == as_read(history[-1].to_json())
    entries = parse_journal(store.journal_path.read_bytes()).entries
    assert len(entries) <= 4
    assert all(e.base == json.loads(store.path.read_text())["checksum"] for e in entries)
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))


def test_a_snapshot_when_the_journal_would_outgrow_it(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_module, "COMPACT_MIN_BYTES", 0)
    store, history = CheckpointStore(tmp_path), states(60)
    kinds = []
    for state in history:
        kinds.append(store.commit(state))
        journal = store.journal_path.stat().st_size if store.journal_path.exists() else 0
        assert journal <= store.path.stat().st_size
    assert 1 < kinds.count("snapshot") < kinds.count("journal")
    assert store.load() == as_read(history[-1].to_json())


def test_a_small_state_journals_up_to_the_floor_instead_of_snapshotting_every_few_changes(tmp_path):
    store, history = committed(tmp_path, 3)
    state, kinds = history[-1], []
    for i in range(100):  # a few workloads coming and going
        state = state.with_workload(workload(f"x{i}", 10)).without_workload(f"x{i - 1}")
        kinds.append(store.commit(state))
    assert kinds.count("journal") == 100
    assert store.journal_path.stat().st_size > store.path.stat().st_size
    assert store.load() == as_read(state.to_json())


def test_torn_tail_is_ignored_and_goes_with_the_next_snapshot(tmp_path):
    store, history = committed(tmp_path, 30)
    line = encode_entry(json.loads(store.path.read_text())["checksum"], 999, {"removed_workloads": ["w0"]})
    with open(store.journal_path, "ab") as f:
        f.write(line[: len(line) // 2])
    fresh = CheckpointStore(tmp_path)
    loaded = fresh.load_generation()
    assert loaded.data == as_read(history[-1].to_json()) and loaded.torn_bytes == len(line) // 2
    assert loaded.damaged == ()
    fresh.commit(AgentState.from_json(loaded.data), snapshot=True)  # what install does
    assert store.journal_path.stat().st_size == 0
    assert fresh.load() == as_read(history[-1].to_json())


def flip_entry(store: CheckpointStore, number: int) -> None:
    raw = bytearray(store.journal_path.read_bytes())
    starts = [0] + [i + 1 for i, b in enumerate(raw) if b == ord("\n")]
    raw[starts[number - 1] + 30] ^= 0x04
    store.journal_path.write_bytes(bytes(raw))


def test_damage_in_the_middle_is_reported_and_the_entries_before_it_used(tmp_path):
    store = CheckpointStore(tmp_path)
    history = states(40)
    store.commit(history[30], snapshot=True)
    for state in history[31:36]:
        assert store.commit(state) == "journal"
    flip_entry(store, 3)
    loaded = CheckpointStore(tmp_path).load_generation()
    assert loaded.data == as_read(history[32].to_json()) and loaded.journal_entries == 2
    assert [d.path for d in loaded.damaged] == [store.journal_path]
    assert "entry 3" in loaded.damaged[0].reason
    moved = store.quarantine(path=store.journal_path)
    assert moved is not None and moved.name.startswith("checkpoint.journal.corrupt-")
    assert not store.journal_path.exists()


def test_a_journal_following_a_damaged_checkpoint_is_moved_aside_not_replayed(tmp_path):
    store = CheckpointStore(tmp_path, compact_every=0)
    history = states(35)
    store.commit(history[30])
    store.commit(history[31])  # .prev: 30, current: 31
    store.compact_every = 1000
    assert store.commit(history[32]) == "journal"
    store.path.write_text("{}")
    loaded = CheckpointStore(tmp_path).load_generation()
    assert loaded.fallback and loaded.data == as_read(history[30].to_json()) and loaded.journal_entries == 0
    assert [d.path for d in loaded.damaged] == [store.path, store.journal_path]


class Crash(BaseException):
    """The process dies here."""


def test_crash_between_snapshot_rename_and_journal_reset_never_replays_the_old_journal(tmp_path, monkeypatch):
    store, history = committed(tmp_path, 30)
    store.commit(history[-1].without_workload("w5"))
    assert store.journal_path.stat().st_size > 0
    newer = history[-1].without_workload("w5").without_workload("w6")

    def crash(self):
        raise Crash()

    monkeypatch.setattr(CheckpointStore, "_empty_journal", crash)
    with pytest.raises(Crash):
        store.commit(newer, snapshot=True)
    monkeypatch.undo()
    assert json.loads(store.path.read_text())["data"] == as_read(newer.to_json())
    assert store.journal_path.stat().st_size > 0  # left over, following the older snapshot
    loaded = CheckpointStore(tmp_path).load_generation()
    assert loaded.data == as_read(newer.to_json()) and loaded.journal_entries == 0 and loaded.damaged == ()


def test_a_snapshot_equal_to_the_journals_base_empties_the_journal_first(tmp_path, monkeypatch):
    """X, then A admitted (journal), then X again as a whole snapshot: a crash
    at the rename must not leave A's entry to be replayed onto X."""
    store, history = committed(tmp_path, 30)
    x = history[-1]
    store.commit(x, snapshot=True)
    assert store.commit(x.with_workload(workload("a", 60))) == "journal"
    assert store.journal_path.stat().st_size > 0

    def crash(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(checkpoint_module.os, "replace", crash)
    with pytest.raises(Crash):
        store.commit(x, snapshot=True)
    monkeypatch.undo()
    assert CheckpointStore(tmp_path).load() == as_read(x.to_json())


def test_a_failed_append_leaves_the_previous_state_and_the_next_commit_snapshots(tmp_path, monkeypatch):
    store, history = committed(tmp_path, 30)
    before = store.journal_path.read_bytes()

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.os, "fdatasync", no_space)
    with pytest.raises(CheckpointWriteError, match="ENOSPC"):
        store.commit(history[-1].without_workload("w0"))
    monkeypatch.undo()
    assert store.journal_path.read_bytes() == before  # the partial entry is cut off
    assert CheckpointStore(tmp_path).load() == as_read(history[-1].to_json())
    assert store.commit(history[-1].without_workload("w0")) == "snapshot"
    assert CheckpointStore(tmp_path).load() == as_read(history[-1].without_workload("w0").to_json())


def test_a_journal_changed_behind_the_stores_back_makes_the_next_commit_a_snapshot(tmp_path):
    store, history = committed(tmp_path, 30)
    store.commit(history[-1].without_workload("w0"))
    os.truncate(store.journal_path, 0)
    assert store.commit(history[-1].without_workload("w0").without_workload("w1")) == "snapshot"
    assert CheckpointStore(tmp_path).load() == \
        as_read(history[-1].without_workload("w0").without_workload("w1").to_json())


def test_a_whole_save_of_a_payload_still_works_and_empties_the_journal(tmp_path):
    store, history = committed(tmp_path, 30)
    store.commit(history[-1].without_workload("w0"))
    store.save(history[3].to_json())
    assert store.journal_path.stat().st_size == 0 and store.load() == as_read(history[3].to_json())
    assert store.commit(history[4]) == "snapshot"  # a payload is not a state to diff against


def test_a_journal_without_any_checkpoint_is_reported_to_be_moved_aside(tmp_path):
    store, history = committed(tmp_path, 30)
    store.commit(history[-1].without_workload("w0"))
    store.path.unlink()
    store.previous_path.unlink(missing_ok=True)
    loaded = CheckpointStore(tmp_path).load_generation()
    assert loaded.data is None and [d.path for d in loaded.damaged] == [store.journal_path]


def test_a_state_made_from_the_old_one_is_compared_by_the_names_it_changed_only(monkeypatch):
    from numa_agent.state import journal

    history = states(200)
    old = history[-1]
    new = old.with_workload(replace(old.workload("w7"), pid=5)).without_workload("w3")
    # The identity comparison over every workload is not needed here: make it fail loudly.
    monkeypatch.setattr(journal, "_changed", lambda *a: (_ for _ in ()).throw(AssertionError("full scan")))
    delta = state_delta(old, new)
    assert [w["name"] for w in delta["workloads"]] == ["w7"] and delta["removed_workloads"] == ["w3"]
    monkeypatch.undo()
    assert state_delta(old, new) == delta
    unrelated = AgentState.from_json(new.to_json())  # no line of derivation: the full comparison
    assert state_delta(old, unrelated) == delta


def test_the_isolation_ledger_is_journalled_and_read_back(tmp_path):
    from numa_agent.state.model import IsolationLedger

    store, history = committed(tmp_path, 3)
    held = history[-1].with_isolation(IsolationLedger({"irq/24": "0-7", "cpu/3/pm_qos": "0"}))
    assert held.changes_since(history[-1]) == (frozenset(), frozenset())
    assert store.commit(held) == "journal"
    assert AgentState.from_json(store.load()).isolation == held.isolation
    restored = held.with_isolation(IsolationLedger())
    assert store.commit(restored) == "journal"
    data = store.load()
    assert "isolation" not in data and data == as_read(restored.to_json())
    assert "isolation" not in history[-1].to_json()  # a state that never isolated writes what it wrote before
