"""CheckpointStore keeps the previous good generation as checkpoint.json.prev
and falls back to it; a crash or failure at any step of save leaves a loadable
generation."""

from __future__ import annotations

import json
import os

import pytest

from numa_agent.state.checkpoint import (
    CheckpointCorruptError,
    CheckpointStore,
    CheckpointWriteError,
)
from numa_agent.state.directory import StateDirError, claim_state_dir


def truncate(path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def flip_a_bit(path):
    """One bit of the first digit in the payload: still JSON, wrong checksum."""
    raw = bytearray(path.read_bytes())
    document = json.loads(raw)
    at = raw.index(b'"data"')
    while not raw[at:at + 1].isdigit():
        at += 1
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    assert json.loads(raw)["checksum"] == document["checksum"]


def empty(path):
    path.write_bytes(b"")


def delete(path):
    path.unlink()


DAMAGE = {"truncated": truncate, "bit-flipped": flip_a_bit, "emptied": empty, "deleted": delete}


def two_generations(directory):
    store = CheckpointStore(directory)
    store.save({"n": 1})
    store.save({"n": 2})
    return store


def test_save_keeps_the_previous_generation(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"n": 1})
    assert not store.previous_path.exists()
    store.save({"n": 2})
    assert json.loads(store.previous_path.read_text())["data"] == {"n": 1}
    store.save({"n": 3})
    assert json.loads(store.previous_path.read_text())["data"] == {"n": 2}
    assert store.load() == {"n": 3}
    assert not store.path.samefile(store.previous_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.json.prev"]


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_load_falls_back_to_the_previous_generation(tmp_path, how):
    store = two_generations(tmp_path)
    DAMAGE[how](store.path)
    assert store.load() == {"n": 1}
    loaded = store.load_generation()
    assert loaded.data == {"n": 1} and loaded.path == store.previous_path and loaded.fallback
    if how == "deleted":
        assert loaded.damaged == ()
    else:
        assert [e.path for e in loaded.damaged] == [store.path]


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_without_a_good_previous_generation_the_damage_is_reported(tmp_path, how):
    store = two_generations(tmp_path)
    DAMAGE[how](store.path)
    store.previous_path.unlink()
    if how == "deleted":
        assert store.load() is None
    else:
        with pytest.raises(CheckpointCorruptError) as info:
            store.load()
        assert info.value.path == store.path


def test_both_generations_damaged(tmp_path):
    store = two_generations(tmp_path)
    truncate(store.path)
    empty(store.previous_path)
    loaded = store.load_generation()
    assert loaded.data is None and [e.path for e in loaded.damaged] == [store.path, store.previous_path]
    with pytest.raises(CheckpointCorruptError, match="checkpoint.json is corrupt"):
        store.load()


def test_a_damaged_current_never_replaces_a_good_previous(tmp_path):
    store = two_generations(tmp_path)
    truncate(store.path)
    store.save({"n": 3})
    assert json.loads(store.previous_path.read_text())["data"] == {"n": 1}
    assert store.load() == {"n": 3}


def test_after_quarantine_the_next_save_keeps_the_previous(tmp_path):
    store = two_generations(tmp_path)
    flip_a_bit(store.path)
    moved = store.quarantine()
    assert moved is not None and moved.name.startswith("checkpoint.json.corrupt-")
    assert store.load() == {"n": 1}
    store.save({"n": 3})
    assert store.load() == {"n": 3}
    assert json.loads(store.previous_path.read_text())["data"] == {"n": 1}


def test_quarantine_of_the_previous_generation(tmp_path):
    store = two_generations(tmp_path)
    moved = store.quarantine(path=store.previous_path)
    assert moved is not None and moved.name.startswith("checkpoint.json.prev.corrupt-")
    assert not store.previous_path.exists() and store.load() == {"n": 2}


def test_without_hard_links_the_previous_is_a_copy(tmp_path, monkeypatch):
    store = two_generations(tmp_path)

    def no_links(src, dst, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store.save({"n": 3})
    monkeypatch.undo()
    assert json.loads(store.previous_path.read_text())["data"] == {"n": 2}
    assert store.load() == {"n": 3}


# ---- a crash or a failure at each step of save -------------------------------------

class Crash(BaseException):
    """The process dies here: nothing after it runs, no clean-up."""


STEPS = ("write", "fsync", "link", "replace", "open")  # every call save makes that touches disk


def count_steps(tmp_path, monkeypatch):
    store = two_generations(tmp_path / "count")
    calls = []
    for name in STEPS:
        real = getattr(os, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, wrapper)
    store.save({"n": 3})
    monkeypatch.undo()
    return calls


def fail_at(monkeypatch, index, error):
    calls = []
    for name in STEPS:
        real = getattr(os, name)

        def wrapper(*args, _real=real, **kwargs):
            calls.append(1)
            if len(calls) == index + 1:
                raise error
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, wrapper)


def test_the_steps_of_save_are_what_the_crash_tests_walk(tmp_path, monkeypatch):
    calls = count_steps(tmp_path, monkeypatch)
    # temp written and synced, the current linked aside and renamed to .prev,
    # the directory synced, the temp renamed over the current, the directory synced
    assert "link" in calls and calls.count("replace") == 2 and calls.count("fsync") == 3


def test_a_crash_at_any_step_of_save_leaves_good_generations(tmp_path, monkeypatch):
    steps = len(count_steps(tmp_path, monkeypatch))
    for index in range(steps):
        directory = tmp_path / f"crash-{index}"
        store = two_generations(directory)
        fail_at(monkeypatch, index, Crash())
        with pytest.raises(Crash):
            store.save({"n": 3})
        monkeypatch.undo()
        after = CheckpointStore(directory)  # the agent starts again
        assert after.load() in ({"n": 2}, {"n": 3}), index
        # and the previous generation is good too: losing the current one still leaves one
        previous = json.loads(after.previous_path.read_text())["data"]
        assert previous in ({"n": 1}, {"n": 2}), index
        after.path.unlink()
        assert after.load() in ({"n": 1}, {"n": 2}), index
        after.save({"n": 4})  # leftovers of the crash do not get in the way
        assert after.load() == {"n": 4}
        assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_a_failure_at_any_step_of_save_leaves_a_good_generation(tmp_path, monkeypatch):
    steps = len(count_steps(tmp_path, monkeypatch))
    for index in range(steps):
        directory = tmp_path / f"fail-{index}"
        store = two_generations(directory)
        fail_at(monkeypatch, index, OSError(5, "Input/output error"))
        try:
            store.save({"n": 3})
            saved = True  # only a failing link: the previous generation is copied instead
        except CheckpointWriteError:
            saved = False
        monkeypatch.undo()
        assert store.load() in (({"n": 3},) if saved else ({"n": 2}, {"n": 3})), index
        assert json.loads(store.previous_path.read_text())["data"] in ({"n": 1}, {"n": 2}), index
        assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")], index


def test_the_directory_guard_checks_the_previous_generation(tmp_path):
    state = tmp_path / "state"
    two_generations(state)
    os.chmod(state / "checkpoint.json.prev", 0o666)
    with pytest.raises(StateDirError, match=r"checkpoint.json.prev is writable"):
        claim_state_dir(state)


def test_a_save_reads_back_only_a_checkpoint_it_did_not_just_write(tmp_path, monkeypatch):
    """A save must not cost a read and hash of the whole previous checkpoint:
    the one this store wrote is known good while the file is untouched. One
    changed behind its back (a bit flipped in place, same size) is read, and
    not kept as the previous generation."""
    store = two_generations(tmp_path)
    reads = []
    real_read = CheckpointStore._read
    monkeypatch.setattr(CheckpointStore, "_read", lambda self, path: reads.append(path) or real_read(self, path))
    store.save({"n": 3})
    assert reads == [] and json.loads(store.previous_path.read_text())["data"] == {"n": 2}
    flip_a_bit(store.path)
    store.save({"n": 4})
    assert reads == [store.path]
    assert json.loads(store.previous_path.read_text())["data"] == {"n": 2}
