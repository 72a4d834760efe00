"""The revocations' copy beside the mark key: what it holds is read back, a
damaged copy is ignored (the checkpoint is the record), and merging never
names one booking twice."""

import logging
import os

from numa_agent.service.revocation_copy import COPY_NAME, RevocationCopy, merged
from numa_agent.state.model import Revocation

A = Revocation(name="a", pid=10, pid_identity="boot:1", created_unix=1.0, released_unix=2.0)
B = Revocation(name="b", pid=11, pid_identity="boot:2", created_unix=1.5, released_unix=3.0)


def test_saved_then_loaded_and_removed_when_none_is_left(tmp_path):
    copy = RevocationCopy(tmp_path / "run")
    assert copy.load() == ()
    copy.save((A, B))
    assert RevocationCopy(tmp_path / "run").load() == (A, B)
    assert os.stat(tmp_path / "run" / COPY_NAME).st_mode & 0o777 == 0o600
    copy.save(())
    assert not (tmp_path / "run" / COPY_NAME).exists()


def test_a_damaged_copy_is_ignored_with_a_warning(tmp_path, caplog):
    (tmp_path / COPY_NAME).write_bytes(b'[{"name": 5}]')
    with caplog.at_level(logging.WARNING):
        assert RevocationCopy(tmp_path).load() == ()
    assert "is damaged" in caplog.text
    (tmp_path / COPY_NAME).write_bytes(b"[" * 100_000)
    assert RevocationCopy(tmp_path).load() == ()


def test_a_link_planted_at_its_name_is_neither_read_nor_written_through(tmp_path, caplog):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(victim, run / COPY_NAME)
    copy = RevocationCopy(run)
    with caplog.at_level(logging.WARNING):
        assert copy.load() == ()
    copy.save((A,))
    assert victim.read_bytes() == b"precious"
    assert RevocationCopy(run).load() == (A,)


def test_merged_adds_only_what_the_checkpoint_lacks():
    assert merged((A,), (A, B)) == (A, B)
    assert merged((A, B), ()) == (A, B)
    assert merged((), (B,)) == (B,)
