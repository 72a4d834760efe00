"""A directory the agent writes in cannot be redirected: refused when someone
else could change it or a directory above it, and once held, written only
through its descriptor and never through a symlink."""

import errno
import os
import stat

import pytest

from numa_agent.state.trusted_dir import UntrustedDirectory, open_directory

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="files of another user need root")
OTHER = 54321  # a uid that is neither root nor the agent's


def test_made_with_the_mode_asked_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        with open_directory(tmp_path / "a" / "b", "test directory", create_mode=0o755) as held:
            assert held.path == tmp_path / "a" / "b"
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o755


def test_missing_and_not_to_be_made(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_directory(tmp_path / "absent", "test directory")
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_writable_by_others_is_refused(tmp_path, mode):
    target = tmp_path / "d"
    target.mkdir()
    os.chmod(target, mode)
    with pytest.raises(UntrustedDirectory) as refused:
        open_directory(target, "kubelet state directory")
    message = str(refused.value)
    assert "\n" not in message
    assert f"kubelet state directory {target} is writable by its group or by others" in message
    assert f"mode {mode:04o}" in message and f"chmod go-w {target}" in message


def test_below_a_directory_others_may_write_is_refused(tmp_path):
    os.chmod(tmp_path, 0o777)  # not sticky: anyone may rename what is inside
    (tmp_path / "d").mkdir()
    with pytest.raises(UntrustedDirectory, match=f"{tmp_path} above it is writable by its group or by others"):
        open_directory(tmp_path / "d", "test directory")


def test_below_a_sticky_shared_directory_is_allowed(tmp_path):
    os.chmod(tmp_path, 0o1777)  # as /tmp
    open_directory(tmp_path / "d", "test directory", create_mode=0o700).close()


@as_root
@pytest.mark.parametrize("where", ["itself", "above"])
def test_owned_by_another_user_is_refused(tmp_path, where):
    target = tmp_path / "above" / "d"
    target.mkdir(parents=True)
    os.chown(target if where == "itself" else target.parent, OTHER, -1)
    with pytest.raises(UntrustedDirectory, match=f"owned by another user \\(owner uid {OTHER}, mode 0755\\)"):
        open_directory(target, "test directory")


def test_a_symlink_in_a_trusted_directory_is_followed(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "alias")
    with open_directory(tmp_path / "alias", "test directory") as held:
        held.replace_file("f", b"x", 0o644)
    assert (tmp_path / "real" / "f").read_bytes() == b"x"


@as_root
def test_another_users_symlink_in_a_shared_directory_is_refused(tmp_path):
    """As fs.protected_symlinks: in /tmp, a link is anyone's to plant."""
    os.chmod(tmp_path, 0o1777)
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "planted")
    os.lchown(tmp_path / "planted", OTHER, -1)
    with pytest.raises(UntrustedDirectory, match="a symlink in a shared directory, owned by another user"):
        open_directory(tmp_path / "planted", "test directory")


def test_a_symlink_loop_is_an_error_not_a_hang(tmp_path):
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    with pytest.raises(OSError) as failed:
        open_directory(tmp_path / "a", "test directory")
    assert failed.value.errno == errno.ELOOP


def test_a_link_planted_at_the_name_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    held = open_directory(tmp_path / "d", "test directory", create_mode=0o755)
    os.symlink(victim, tmp_path / "d" / "state")
    held.replace_file("state", b"new", 0o644)
    assert victim.read_bytes() == b"precious"
    assert (tmp_path / "d" / "state").read_bytes() == b"new" and not (tmp_path / "d" / "state").is_symlink()
    with pytest.raises(OSError) as refused:
        os.symlink(victim, tmp_path / "d" / "other")
        held.open("other", os.O_WRONLY | os.O_TRUNC)
    assert refused.value.errno == errno.ELOOP
    assert victim.read_bytes() == b"precious"


def test_links_planted_at_temporary_names_are_never_used(tmp_path):
    """The temporary names are unpredictable and made with O_EXCL."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    held = open_directory(tmp_path / "d", "test directory", create_mode=0o755)
    for guess in (".state.tmp", f".state.{os.getpid()}.tmp", ".state.000000000000.tmp"):
        os.symlink(victim, tmp_path / "d" / guess)
    held.replace_file("state", b"new", 0o644)
    assert victim.read_bytes() == b"precious"


def test_a_directory_swapped_for_a_link_after_start_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    held = open_directory(tmp_path / "d", "test directory", create_mode=0o755)
    os.rename(tmp_path / "d", tmp_path / "moved")
    os.symlink(elsewhere, tmp_path / "d")
    held.replace_file("state", b"new", 0o644)
    assert os.listdir(elsewhere) == []
    assert (tmp_path / "moved" / "state").read_bytes() == b"new"


def test_nothing_is_made_below_a_refused_directory(tmp_path):
    os.chmod(tmp_path, 0o777)
    with pytest.raises(UntrustedDirectory):
        open_directory(tmp_path / "a" / "b", "test directory", create_mode=0o700)
    assert not (tmp_path / "a").exists()


def test_dot_dot_after_a_symlink_is_where_the_kernel_goes(tmp_path):
    """The agent's other calls by path (the socket's liveness probe, its
    removal, clients) resolve '..' after a symlink in the link's target, as
    the kernel does: so must the directory held."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "x").mkdir()
    os.symlink(tmp_path / "real" / "sub", tmp_path / "link")
    with open_directory(f"{tmp_path}/link/../x", "test directory", create_mode=0o755) as held:
        assert os.path.samestat(os.fstat(held.fd), os.stat(f"{tmp_path}/link/../x"))
    assert not (tmp_path / "x").exists()


def test_a_directory_refused_through_a_symlink_is_named_as_itself(tmp_path):
    (tmp_path / "loose").mkdir()
    os.chmod(tmp_path / "loose", 0o777)
    os.symlink("loose", tmp_path / "alias")
    with pytest.raises(UntrustedDirectory) as refused:
        open_directory(tmp_path / "alias", "test directory")
    assert "above it" not in str(refused.value)
    assert f"test directory {tmp_path}/alias ({tmp_path}/loose) is writable by its group or by others" \
        in str(refused.value)


@as_root
def test_the_remedy_names_the_agents_own_user(tmp_path, monkeypatch):
    """An agent running as a dedicated user is told to chown to that user, not to root."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    target = tmp_path / "d"
    target.mkdir()
    os.chown(target, OTHER, -1)
    monkeypatch.setattr(os, "geteuid", lambda: nobody.pw_uid)
    with pytest.raises(UntrustedDirectory, match=f"chown nobody {target}"):
        open_directory(target, "test directory")
