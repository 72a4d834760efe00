"""The booking record of a cgroup: extended attributes on both files backends,
the driver's checks, and when the cgroup enforcer writes the record."""

from __future__ import annotations

import errno
import os

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.enforcement.affinity_enforcer import AffinityEnforcer
from numa_agent.enforcement.cgroup import XATTR_SIZE_MAX, CgroupV2, KernelFiles
from numa_agent.enforcement.cgroup_enforcer import CgroupEnforcer
from numa_agent.enforcement.errors import CgroupInvalidError, CgroupRangeError, CgroupUnsupportedError
from numa_agent.enforcement.plan import CgroupSpec
from numa_agent.enforcement.protocol import NO_LIMITS, kept_records
from numa_agent.enforcement.record import RECORD_XATTR, decode_record, encode_record
from numa_agent.enforcement.simulated_cgroupfs import SimulatedCgroupfs
from numa_agent.state.model import Booking, Pod, Workload, replace

NAME = "user.numa_agent.test"


def _user_xattrs_supported(directory) -> bool:
    try:
        os.setxattr(directory, "user.numa_agent.probe", b"1")
        os.removexattr(directory, "user.numa_agent.probe")
        return True
    except OSError:
        return False


# ---- KernelFiles: plain os.setxattr / os.getxattr ---------------------------------------
def test_kernel_files_xattrs_on_a_directory(tmp_path):
    if not _user_xattrs_supported(tmp_path):
        pytest.skip(f"the file system of {tmp_path} takes no user.* extended attributes")
    files = KernelFiles()
    assert files.getxattr(tmp_path, NAME) is None
    files.setxattr(tmp_path, NAME, b'{"a":1}')
    assert files.getxattr(tmp_path, NAME) == b'{"a":1}'
    assert os.getxattr(tmp_path, NAME) == b'{"a":1}'  # a real attribute, no file beside it
    assert list(tmp_path.iterdir()) == []
    files.removexattr(tmp_path, NAME)
    files.removexattr(tmp_path, NAME)  # removing what is not there is no error
    assert files.getxattr(tmp_path, NAME) is None


def test_kernel_files_errors_are_typed_by_the_driver(tmp_path, monkeypatch):
    (tmp_path / "w").mkdir()
    cg = CgroupV2(tmp_path, KernelFiles())

    def unsupported(path, name, value, **kwargs):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "setxattr", unsupported)
    with pytest.raises(CgroupUnsupportedError, match=r"setxattr user.numa_agent.test of .*/w failed: (EOPNOTSUPP|ENOTSUP)"):
        cg.write_xattr("w", NAME, b"x")


# ---- the driver ----------------------------------------------------------------------------
def test_driver_round_trip_on_the_fake_tree(cg, fake_root):
    cg.create("wl-a")
    assert cg.read_xattr("wl-a", NAME) is None
    cg.write_xattr("wl-a", NAME, b"one")
    cg.write_xattr("wl-a", NAME, b"two")
    assert cg.read_xattr("wl-a", NAME) == b"two"
    assert cg.children("") == ["wl-a"]
    cg.remove_xattr("wl-a", NAME)
    assert cg.read_xattr("wl-a", NAME) is None


def test_driver_refuses_what_the_kernel_would(cg):
    cg.create("wl-a")
    with pytest.raises(CgroupRangeError, match="E2BIG"):
        cg.write_xattr("wl-a", NAME, b"x" * (XATTR_SIZE_MAX + 1))
    cg.write_xattr("wl-a", NAME, b"x" * XATTR_SIZE_MAX)  # the largest value fits
    for bad in ("trusted.x", "security.x", "user.", "numa_agent.record"):
        with pytest.raises(CgroupInvalidError, match="must be user.<something>"):
            cg.write_xattr("wl-a", bad, b"x")
    with pytest.raises(Exception, match="not the root itself"):
        cg.write_xattr("", NAME, b"x")


def test_fake_keeps_real_xattrs_where_the_file_system_takes_them(cg, fake_root):
    if not _user_xattrs_supported(fake_root):
        pytest.skip(f"the file system of {fake_root} takes no user.* extended attributes")
    cg.create("wl-a")
    cg.write_xattr("wl-a", NAME, b"v")
    assert os.getxattr(fake_root / "wl-a", NAME) == b"v"
    assert not any(p.name.startswith(".xattr") for p in (fake_root / "wl-a").iterdir())


def test_fake_falls_back_to_a_sidecar_that_is_no_cgroup(cg, fake_root, monkeypatch):
    cg.create("wl-a")

    def unsupported(*args, **kwargs):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    for name in ("setxattr", "getxattr", "removexattr"):
        monkeypatch.setattr(os, name, unsupported)
    cg.write_xattr("wl-a", NAME, b"sidecar")
    sidecar = fake_root / "wl-a" / f".xattr.{NAME}"
    assert sidecar.read_bytes() == b"sidecar"
    assert cg.read_xattr("wl-a", NAME) == b"sidecar"
    assert cg.children("") == ["wl-a"] and cg.children("wl-a") == []
    cg.remove("wl-a")  # an rmdir takes the attribute with it, as the kernel's does
    assert not (fake_root / "wl-a").exists()


def test_fake_sidecar_never_shadowed_by_an_older_attribute(cg, fake_root, monkeypatch):
    if not _user_xattrs_supported(fake_root):
        pytest.skip(f"the file system of {fake_root} takes no user.* extended attributes")
    cg.create("wl-a")
    cg.write_xattr("wl-a", NAME, b"old")
    real = os.setxattr

    def too_big(path, name, value, **kwargs):  # e.g. ext4 without ea_inode: one block at most
        if len(value) > 8:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, name, value)

    monkeypatch.setattr(os, "setxattr", too_big)
    cg.write_xattr("wl-a", NAME, b"newer and longer")
    assert cg.read_xattr("wl-a", NAME) == b"newer and longer"
    cg.write_xattr("wl-a", NAME, b"short")
    assert cg.read_xattr("wl-a", NAME) == b"short"
    assert not (fake_root / "wl-a" / f".xattr.{NAME}").exists()


# ---- the record's format ------------------------------------------------------------------
def _workload(**kw):
    booking = Booking(cpus=CpuSet.parse("2-3"), numa_nodes=(0,), mems=(0,),
                      memory={0: {"memory": 1 << 30, "hugepages-2048kB": 4 << 20}},
                      memory_group=(0,), devices=(("gpu", "0000:3b:00.0"),))
    base = dict(name="web", owner_uid=1000, booking=booking, pid=4242, pid_identity="boot:123",
                command=("db", "--password=hunter2"), request={"cpus": 2, "memory_bytes": 1 << 30})
    return Workload(**{**base, **kw})


def test_record_round_trips_without_the_command_line():
    w = _workload(pod="p")
    data = encode_record(w)
    assert b"hunter2" not in data and b" " not in data  # compact, and no secret
    assert decode_record(data) == replace(w, command=())
    pod = Pod(name="p", owner_uid=1000, booking=w.booking, request={"cpus": 4})
    assert decode_record(encode_record(pod)) == pod


@pytest.mark.parametrize("data, message", [
    (b"{", "not JSON"),
    (b"[]", "unknown record schema"),
    (b'{"schema":2,"workload":{}}', "unknown record schema 2"),
    (b'{"schema":1}', "exactly one"),
    (b'{"schema":1,"workload":{"name":"a","owner_uid":0},"pod":{"name":"a","owner_uid":0}}', "exactly one"),
    (b'{"schema":1,"workload":{"owner_uid":0}}', "Workload"),
    (b'{"schema":1,"workload":{"name":"a","owner_uid":0,"booking":{"cpus":"x"}}}', "Workload"),
])
def test_bad_records_are_value_errors(data, message):
    with pytest.raises(ValueError, match=message):
        decode_record(data)


# ---- the enforcer --------------------------------------------------------------------------
def _spec(w, cpus="2-3", memory_max=None):
    return CgroupSpec(f"wl-{w.name}", CpuSet.parse(cpus), (0,), memory_max, workload=w.name, pid=w.pid,
                      record=w)


def test_record_is_written_at_creation_before_the_process_moves_in(cg, fake_root, sleepers, monkeypatch):
    enforcer = CgroupEnforcer(cg)
    proc = sleepers()
    w = _workload(pid=proc.pid)
    seen = []
    real_move = cg.move_pid

    def move(relpath, pid):
        seen.append(cg.read_xattr(relpath, RECORD_XATTR))
        real_move(relpath, pid)

    monkeypatch.setattr(cg, "move_pid", move)
    enforcer.apply({}, {"wl-web": _spec(w)}, ("wl-web", proc.pid))
    assert seen == [encode_record(w)]
    assert decode_record(enforcer.read_record("wl-web")) == replace(w, command=())
    enforcer.close()


def test_record_is_rewritten_only_when_the_booking_changes(cg, monkeypatch):
    enforcer = CgroupEnforcer(cg)
    w = _workload()
    before = {"wl-web": _spec(w)}
    enforcer.apply({}, before)
    writes = []
    real = cg.write_xattr
    monkeypatch.setattr(cg, "write_xattr", lambda *a: (writes.append(a[0]), real(*a)))
    # Same booking, other limit: the cgroup is updated, its record stays.
    enforcer.apply(before, {"wl-web": _spec(w, memory_max=1 << 30)})
    assert writes == []
    # A trim (hotplug took CPU 3): written once, even though it shrinks and grows.
    trimmed = replace(w, booking=replace(w.booking, cpus=CpuSet.parse("2,4")), lost=("cpu 3",))
    enforcer.apply(before, {"wl-web": _spec(trimmed, cpus="2,4")})
    assert writes == ["wl-web"]
    assert decode_record(enforcer.read_record("wl-web")).lost == ("cpu 3",)
    enforcer.close()


def test_a_record_that_cannot_be_stored_is_logged_and_the_old_one_removed(cg, caplog):
    enforcer = CgroupEnforcer(cg)
    w = _workload()
    enforcer.apply({}, {"wl-web": _spec(w)})
    huge = replace(w, request={"note": "x" * XATTR_SIZE_MAX})
    enforcer.apply({"wl-web": _spec(w)}, {"wl-web": _spec(huge)})  # does not raise
    assert enforcer.read_record("wl-web") is None
    assert "keeps no booking record" in caplog.text and "E2BIG" in caplog.text
    enforcer.close()


def test_enforcer_record_round_trip(cg, caplog):
    enforcer = CgroupEnforcer(cg)
    cg.create("wl-a")
    assert enforcer.read_record("wl-a") is None
    enforcer.write_record("wl-a", b"data")
    assert enforcer.read_record("wl-a") == b"data"
    assert enforcer.read_record("wl-gone") is None
    enforcer.write_record("wl-gone", b"data")  # logged, never raised
    assert "keeps no booking record" in caplog.text
    enforcer.close()


def test_read_limits(cg):
    enforcer = CgroupEnforcer(cg)
    cg.create("wl-a")
    assert enforcer.read_limits("wl-a") == (None, {})
    cg.write_memory_max("wl-a", 603979776)
    cg.write_hugetlb_max("wl-a", 2048, 8 << 20)
    assert enforcer.read_limits("wl-a") == (603979776, {2048: 8 << 20})
    assert enforcer.read_limits("gone") == (None, {})
    enforcer.close()


def test_read_limits_without_the_controllers(fake_root):
    cg = CgroupV2(fake_root, SimulatedCgroupfs(fake_root))  # the root hands nothing down
    cg.create("wl-a")
    enforcer = CgroupEnforcer(cg)
    assert enforcer.read_limits("wl-a") == NO_LIMITS
    enforcer.close()


def test_affinity_keeps_no_record():
    enforcer = AffinityEnforcer("test")
    try:
        # Nothing outlives the agent but the process: no record, no limits to ask for.
        assert kept_records(enforcer) is None
    finally:
        enforcer.close()


def test_a_record_nested_past_the_parsers_depth_is_not_a_record():
    from numa_agent.enforcement.record import decode_ledger

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_record(deep)
    assert decode_ledger(deep) is None
