"""CheckpointStore: atomic save, verified load, quarantine, failure paths."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.state.checkpoint import (
    CheckpointCorruptError,
    CheckpointReadError,
    CheckpointStore,
    CheckpointWriteError,
    checksum_of,
)
from numa_agent.state.trusted_dir import TrustedDir

PAYLOAD = {"workloads": {"db": {"cpus": "2-3", "mems": [0]}}, "epoch": 7}


def temps(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def write_document(store, document):
    store.directory.mkdir(parents=True, exist_ok=True)
    store.path.write_text(json.dumps(document))


def test_load_missing_returns_none(tmp_path):
    assert CheckpointStore(tmp_path / "absent").load() is None


def test_save_then_load_round_trips_and_file_is_versioned(tmp_path):
    store = CheckpointStore(tmp_path / "state")
    store.save(PAYLOAD)
    assert store.load() == PAYLOAD
    document = json.loads(store.path.read_text())
    assert document["version"] == 1
    assert document["data"] == PAYLOAD
    canonical = json.dumps(PAYLOAD, sort_keys=True, separators=(",", ":")).encode()
    import hashlib
    assert document["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert temps(store.directory) == []


def test_directory_is_created_private(tmp_path):
    store = CheckpointStore(tmp_path / "a" / "state")
    store.save({})
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def test_save_replaces_previous(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"n": 1})
    store.save({"n": 2})
    assert store.load() == {"n": 2}


def test_int_keys_round_trip_with_matching_checksum(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({2: "a", 10: "b"})
    assert store.load() == {"2": "a", "10": "b"}


def test_non_json_payload_is_refused_before_touching_disk(tmp_path):
    store = CheckpointStore(tmp_path / "s")
    with pytest.raises(ValueError, match="not JSON-encodable"):
        store.save({"x": object()})
    with pytest.raises(TypeError, match="must be a dict"):
        store.save([1, 2])  # type: ignore[arg-type]
    assert not store.directory.exists()


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10), max_size=5))
def test_any_json_payload_round_trips(tmp_path_factory, payload):
    store = CheckpointStore(tmp_path_factory.mktemp("hyp"))
    store.save(payload)
    assert store.load() == payload


@pytest.mark.parametrize("content, reason", [
    (b"", "file is empty"),
    (b'{"version": 1, "checksum": "sha256:ab", "da', "not valid JSON"),
    (b"[1, 2]", "top level is not a JSON object"),
    (b'{"checksum": "sha256:00", "data": {}}', "no 'version' field"),
    (b'{"version": 2, "checksum": "sha256:00", "data": {}}', "unsupported version 2"),
    (b'{"version": "1", "checksum": "sha256:00", "data": {}}', "unsupported version '1'"),
    (b'{"version": true, "checksum": "sha256:00", "data": {}}', "unsupported version True"),
    (b'{"version": 1, "checksum": "sha256:00", "data": []}', "'data' is missing or not"),
    (b'{"version": 1, "data": {}}', "checksum None is missing"),
    (b'{"version": 1, "checksum": "md5:00", "data": {}}', "checksum 'md5:00' is missing"),
])
def test_corrupt_files_are_reported_with_reason(tmp_path, content, reason):
    store = CheckpointStore(tmp_path)
    store.path.write_bytes(content)
    with pytest.raises(CheckpointCorruptError, match=reason) as info:
        store.load()
    assert info.value.path == store.path
    assert str(store.path) in str(info.value)


def test_tampered_data_fails_checksum(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(PAYLOAD)
    document = json.loads(store.path.read_text())
    document["data"]["epoch"] = 8
    store.path.write_text(json.dumps(document))
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch: file says sha256:"):
        store.load()


def test_truncated_file_is_corrupt(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(PAYLOAD)
    raw = store.path.read_bytes()
    store.path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointCorruptError, match="not valid JSON"):
        store.load()


def test_reordered_keys_still_verify(tmp_path):
    # The checksum covers canonical JSON, not the file's byte layout.
    store = CheckpointStore(tmp_path)
    data = {"b": 1, "a": [1, {"z": 0, "y": None}]}
    write_document(store, {"data": data, "checksum": checksum_of(data), "version": 1})
    assert store.load() == data


def test_unreadable_checkpoint_raises_read_error(tmp_path):
    store = CheckpointStore(tmp_path)
    store.path.mkdir()  # reading a directory fails with EISDIR
    with pytest.raises(CheckpointReadError, match="cannot read checkpoint .*EISDIR"):
        store.load()


def test_quarantine_moves_file_aside_and_never_overwrites(tmp_path):
    store = CheckpointStore(tmp_path)
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    store.path.write_text("garbage 1")
    first = store.quarantine(now)
    assert first.name == "checkpoint.json.corrupt-20240506T070809Z"
    assert first.read_text() == "garbage 1"
    assert not store.path.exists()
    store.path.write_text("garbage 2")
    second = store.quarantine(now)
    assert second.name == "checkpoint.json.corrupt-20240506T070809Z.1"
    assert first.read_text() == "garbage 1" and second.read_text() == "garbage 2"
    assert store.load() is None


def test_quarantine_converts_to_utc_and_handles_missing(tmp_path):
    from datetime import timedelta
    store = CheckpointStore(tmp_path)
    assert store.quarantine() is None
    store.path.write_text("x")
    local = datetime(2024, 1, 1, 2, 0, 0, tzinfo=timezone(timedelta(hours=2)))
    assert store.quarantine(local).name == "checkpoint.json.corrupt-20240101T000000Z"


def test_quarantine_failure_is_reported(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.path.write_text("x")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(CheckpointWriteError, match="cannot move .* aside .*EACCES"):
        store.quarantine()
    monkeypatch.undo()
    assert store.path.read_text() == "x"


def test_enospc_on_write_keeps_previous_and_leaves_no_temp(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.save({"n": 1})

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(CheckpointWriteError, match=r"ENOSPC .*previous checkpoint is unchanged"):
        store.save({"n": 2})
    monkeypatch.undo()
    assert store.load() == {"n": 1}
    assert temps(tmp_path) == []


def test_failed_rename_keeps_previous_and_leaves_no_temp(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.save({"n": 1})

    def refuse(src, dst, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(CheckpointWriteError, match="EACCES"):
        store.save({"n": 2})
    monkeypatch.undo()
    assert store.load() == {"n": 1}
    assert temps(tmp_path) == []


def test_short_writes_are_completed(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:5])))
    store.save(PAYLOAD)
    monkeypatch.undo()
    assert store.load() == PAYLOAD


def test_write_making_no_progress_is_an_error(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(CheckpointWriteError, match="EIO"):
        store.save(PAYLOAD)
    monkeypatch.undo()
    assert store.load() is None
    assert temps(tmp_path) == []


def test_directory_fsync_failure_is_reported_after_replace(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    real_fsync = os.fsync
    calls = []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 2:  # the first is the temp file, the second the directory
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointWriteError, match="replaced but fsync of .* failed: EIO"):
        store.save({"n": 3})
    monkeypatch.undo()
    assert store.load() == {"n": 3}


def test_unwritable_directory(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path / "ro")
    store.save({"n": 1})

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # Root ignores directory permission bits, so refuse the temp file itself.
    monkeypatch.setattr(TrustedDir, "create_temporary", refuse)
    with pytest.raises(CheckpointWriteError, match="EACCES"):
        store.save({"n": 2})
    monkeypatch.undo()
    assert store.load() == {"n": 1}


def test_state_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CheckpointWriteError, match="state directory .*file is not a directory"):
        CheckpointStore(blocker / "state").save({})


def test_stale_temp_files_from_a_crash_are_removed(tmp_path):
    store = CheckpointStore(tmp_path)
    stale = tmp_path / ".checkpoint.json.abc123.tmp"
    stale.write_text("half")
    store.save({"n": 1})
    assert temps(tmp_path) == []
    assert store.load() == {"n": 1}
