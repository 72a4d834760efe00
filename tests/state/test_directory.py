"""The state directory: one agent at a time, and only a directory the agent's
user alone can write (a forged checkpoint must not be believed)."""

import os
import stat

import pytest

from numa_agent.state.directory import StateDirError, StateDirLocked, StateDirUntrusted, claim_state_dir


def test_created_private_and_locked_with_our_pid(tmp_path):
    claim = claim_state_dir(tmp_path / "state")
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
        assert (tmp_path / "state" / "lock").read_text().strip() == str(os.getpid())
        with pytest.raises(StateDirLocked, match=f"in use by another numa-agent \\(PID {os.getpid()}\\)"):
            claim_state_dir(tmp_path / "state")
    finally:
        claim.release()
    claim_state_dir(tmp_path / "state").release()  # free again once released


def test_abandon_removes_only_a_directory_it_created(tmp_path):
    claim_state_dir(tmp_path / "new").abandon()
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir(mode=0o700)
    claim_state_dir(tmp_path / "old").abandon()
    assert (tmp_path / "old").is_dir()


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777, 0o720])
def test_group_or_world_writable_directory_is_refused(tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, mode)
    with pytest.raises(StateDirError, match="writable by its group or by others.*chmod go-w"):
        claim_state_dir(state)
    assert not (state / "lock").exists()  # refused before anything was written


def test_writable_checkpoint_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "checkpoint.json").write_text("{}")
    os.chmod(state / "checkpoint.json", 0o666)
    with pytest.raises(StateDirError, match="checkpoint.json is writable"):
        claim_state_dir(state)


def test_symlinked_checkpoint_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", state / "checkpoint.json")
    with pytest.raises(StateDirError, match="not a regular file"):
        claim_state_dir(state)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_directory_of_another_user_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 54321, -1)
    with pytest.raises(StateDirUntrusted, match="owned by another user \\(owner uid 54321, mode 0700\\)"):
        claim_state_dir(state)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_directory_below_one_another_user_may_write_is_refused(tmp_path):
    """Whoever can write a directory above it can swap the state directory for another."""
    above = tmp_path / "above"
    above.mkdir()
    os.chown(above, 54321, -1)
    (above / "state").mkdir(mode=0o700)
    with pytest.raises(StateDirUntrusted, match=f"{above} above it is owned by another user"):
        claim_state_dir(above / "state")
    assert not (above / "state" / "lock").exists()


def test_a_writable_or_symlinked_journal_is_refused(tmp_path):
    """The journal is replayed like the checkpoint: as guarded as it."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "checkpoint.journal").write_text("")
    os.chmod(state / "checkpoint.journal", 0o622)
    with pytest.raises(StateDirError, match="checkpoint.journal is writable"):
        claim_state_dir(state)
    os.unlink(state / "checkpoint.journal")
    os.symlink(tmp_path / "elsewhere", state / "checkpoint.journal")
    with pytest.raises(StateDirError, match="not a regular file"):
        claim_state_dir(state)


def test_a_lock_won_on_a_directory_a_failed_agent_removed_is_not_believed(tmp_path, monkeypatch):
    """Two agents start at once on a missing directory: the first makes it and
    locks it, fails its start and removes the directory again (abandon) while
    the second is between opening the lock file and locking it. The second
    must end up holding a live directory, not the removed one (where every
    file it makes fails), or say it could not."""
    import fcntl

    from numa_agent.state import directory as directory_module

    state = tmp_path / "state"
    first = claim_state_dir(state)
    real_flock = fcntl.flock
    calls = []

    def flock_after_the_first_gave_up(fd, operation):
        if not calls:
            first.abandon()  # unlinks the lock, removes the directory, lets go of the lock
        calls.append(fd)
        return real_flock(fd, operation)

    monkeypatch.setattr(directory_module.fcntl, "flock", flock_after_the_first_gave_up)
    try:
        second = claim_state_dir(state)
    except StateDirError:
        return  # said it could not: as good
    try:
        assert not second.held.removed()
        assert os.path.samestat(os.stat(state), os.fstat(second.held.fd))
        assert (state / "lock").read_text().strip() == str(os.getpid())
    finally:
        second.release()


def test_a_directory_removed_at_every_claim_is_a_clear_error(tmp_path, monkeypatch):
    import fcntl

    from numa_agent.state import directory as directory_module

    state = tmp_path / "state"
    real_flock = fcntl.flock

    def flock_of_a_removed_file(fd, operation):
        os.unlink(state / "lock")
        return real_flock(fd, operation)

    monkeypatch.setattr(directory_module.fcntl, "flock", flock_of_a_removed_file)
    with pytest.raises(StateDirError, match=f"state directory {state} was removed each time it was claimed"):
        claim_state_dir(state)
