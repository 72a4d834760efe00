"""CgroupV2 on a fake tree and on plain directories (the raw write path)."""

from __future__ import annotations

import builtins
import errno
import io
import os

import pytest

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.hints import NumaMask
from numa_agent.enforcement import cgroup as cgroup_module
from numa_agent.enforcement.cgroup import CgroupFiles, CgroupV2, KernelFiles, hugetlb_size_name
from numa_agent.enforcement.errors import (
    CgroupBusyError,
    CgroupError,
    CgroupExistsError,
    CgroupInvalidError,
    CgroupMissingError,
    CgroupNoSpaceError,
    CgroupNoSuchProcessError,
    CgroupPathError,
    CgroupPermissionError,
    CgroupRangeError,
    cgroup_error_from_oserror,
)
from numa_agent.enforcement.simulated_cgroupfs import FAKE_MARKER, SimulatedCgroupfs, make_simulated_cgroup_root


# ---- paths ------------------------------------------------------------------
@pytest.mark.parametrize("relpath, message", [
    ("/etc", "no engine.s cgroup lies beside it"),
    ("a//b", "empty component"),
    ("a/", "empty component"),
    ("..", "may not contain '..'"),
    ("a/../../x", "may not contain '..'"),
    ("a/./b", "may not contain '.'"),
    ("a b", r"outside \[A-Za-z0-9_.:@-\]"),
    ("pod/x\n", "outside"),
    ("é", "outside"),
    ("x" * 256, "longer than 255 bytes"),
    ("memory.max", "collide with a cgroup interface file"),
    ("pod/cgroup.procs", "collide"),
])
def test_bad_relative_paths_are_refused(fake_root, relpath, message):
    with pytest.raises(CgroupPathError, match=message):
        CgroupV2(fake_root, SimulatedCgroupfs(fake_root)).path(relpath)


def test_non_string_path_is_refused(fake_root):
    with pytest.raises(CgroupPathError, match="must be a string, got int"):
        CgroupV2(fake_root, SimulatedCgroupfs(fake_root)).path(3)  # type: ignore[arg-type]


def test_good_paths_stay_below_root(fake_root):
    cg = CgroupV2(fake_root, SimulatedCgroupfs(fake_root))
    assert cg.path("") == fake_root
    assert cg.path("pod-a/member_1.x:y@z") == fake_root / "pod-a" / "member_1.x:y@z"


def test_root_itself_cannot_be_created_or_removed(cg):
    with pytest.raises(CgroupPathError, match="needs a child cgroup"):
        cg.create("")
    with pytest.raises(CgroupPathError, match="needs a child cgroup"):
        cg.remove("")


# ---- errno mapping ------------------------------------------------------------
@pytest.mark.parametrize("code, cls", [
    (errno.EBUSY, CgroupBusyError), (errno.ENOTEMPTY, CgroupBusyError),
    (errno.EINVAL, CgroupInvalidError), (errno.ENOSPC, CgroupNoSpaceError),
    (errno.ERANGE, CgroupRangeError), (errno.EACCES, CgroupPermissionError),
    (errno.EPERM, CgroupPermissionError), (errno.ENOENT, CgroupMissingError),
    (errno.ESRCH, CgroupNoSuchProcessError), (errno.EEXIST, CgroupExistsError),
    (errno.EIO, CgroupError),
])
def test_errno_picks_the_error_class_and_message_names_everything(code, cls):
    err = cgroup_error_from_oserror(OSError(code, os.strerror(code)), "write",
                                    "/x/cpuset.cpus", "0-3")
    assert type(err) is cls
    assert str(err) == (f"write '0-3' to /x/cpuset.cpus failed: "
                        f"{errno.errorcode[code]} ({os.strerror(code)})")
    assert (err.path, err.value, err.errno) == ("/x/cpuset.cpus", "0-3", code)


# ---- probe ----------------------------------------------------------------------
def test_probe_fake_root(fake_root):
    caps = CgroupV2(fake_root, SimulatedCgroupfs(fake_root)).probe()
    assert caps.usable and caps.fake and caps.writable and caps.partition
    assert caps.controllers == ("cpuset", "cpu", "memory", "hugetlb")
    assert (caps.cpuset, caps.memory, caps.hugetlb) == (True, True, True)
    assert caps.reason == ""


def test_probe_missing_directory(tmp_path):
    caps = CgroupV2(tmp_path / "nope", KernelFiles()).probe()
    assert not caps.usable and not caps.mounted
    assert caps.reason == f"no cgroup2 mounted at {tmp_path / 'nope'} (directory does not exist)"


def test_probe_plain_directory_is_not_cgroup2(tmp_path):
    caps = CgroupV2(tmp_path, KernelFiles()).probe()
    assert not caps.mounted
    assert caps.reason.startswith(f"no cgroup2 mounted at {tmp_path} (filesystem type 0x")


def test_probe_without_controllers_file(fake_root):
    (fake_root / "cgroup.controllers").unlink()
    caps = CgroupV2(fake_root, SimulatedCgroupfs(fake_root)).probe()
    assert not caps.usable
    assert caps.reason == f"no cgroup2 mounted at {fake_root} (no cgroup.controllers)"


def test_probe_without_cpuset_controller(tmp_path):
    root = make_simulated_cgroup_root(tmp_path / "r", CpuSet([0]), [0], controllers=["memory", "hugetlb"])
    caps = CgroupV2(root, SimulatedCgroupfs(root)).probe()
    assert not caps.usable and caps.memory and caps.hugetlb and not caps.cpuset
    assert not caps.partition
    assert caps.reason == (f"cpuset controller not available in {root}/cgroup.controllers "
                           "(bound to cgroup v1?)")


def test_probe_not_writable(fake_root, monkeypatch):
    monkeypatch.setattr(cgroup_module.os, "access", lambda path, mode: False)
    caps = CgroupV2(fake_root, SimulatedCgroupfs(fake_root)).probe()
    assert not caps.usable and not caps.writable
    assert caps.reason == f"not writable: {fake_root} (needs root or a delegated cgroup)"


def test_unknown_controller_for_fake_root_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown cgroup controller.*: blkio"):
        make_simulated_cgroup_root(tmp_path / "r", CpuSet([0]), [0], controllers=["cpuset", "blkio"])


# ---- controllers ---------------------------------------------------------------------
def test_enable_controllers_writes_only_available_ones(fake_root):
    cg = CgroupV2(fake_root, SimulatedCgroupfs(fake_root))
    assert cg.enable_controllers("", ["memory", "io", "cpuset"]) == ("cpuset", "memory")
    assert cg.subtree_control("") == ("cpuset", "memory")
    cg.create("w")
    assert cg.controllers("w") == ("cpuset", "memory")
    assert (fake_root / "w" / "cpuset.cpus").is_file()
    assert not (fake_root / "w" / "hugetlb.2MB.max").exists()
    # Enabling more later adds the files to existing children, as the kernel does.
    cg.enable_controllers("", ["hugetlb"])
    assert (fake_root / "w" / "hugetlb.2MB.max").is_file()
    assert cg.enable_controllers("w", ["cpu"]) == ()


def test_enabling_domain_controllers_in_a_cgroup_with_processes_is_busy(cg, sleepers):
    cg.create("w")
    cg.move_pid("w", sleepers().pid)
    with pytest.raises(CgroupBusyError, match=r"write '\+cpuset \+memory' to "
                                              r".*w/cgroup.subtree_control failed: EBUSY"):
        cg.enable_controllers("w", ["cpuset", "memory"])
    # cpuset is a threaded controller: allowed next to the cgroup's processes.
    assert cg.enable_controllers("w", ["cpuset"]) == ("cpuset",)
    with pytest.raises(CgroupBusyError, match="EBUSY"):
        cg.enable_controllers("w", ["memory"])


def test_disabling_a_controller_a_child_still_uses_is_busy(cg):
    cg.create("pod")
    cg.enable_controllers("pod", ["cpuset"])
    with pytest.raises(CgroupBusyError, match="EBUSY"):
        cg._write(cg.path("") / "cgroup.subtree_control", "-cpuset")


def test_fake_rejects_malformed_subtree_control_and_unavailable_controller(cg):
    cg.create("w")
    with pytest.raises(CgroupInvalidError, match="EINVAL"):
        cg._write(cg.path("w") / "cgroup.subtree_control", "cpuset")
    with pytest.raises(CgroupMissingError, match="ENOENT"):
        cg._write(cg.path("w") / "cgroup.subtree_control", "+cpu")


# ---- create / remove / children ---------------------------------------------------------
def test_create_remove_children(cg):
    cg.create("shared")
    cg.create("pod")
    cg.create("pod/a")
    assert cg.exists("pod/a") and not cg.exists("pod/b")
    assert cg.children() == ["pod", "shared"]
    assert cg.children("pod") == ["pod/a"]
    with pytest.raises(CgroupExistsError, match=r"mkdir .*/shared failed: EEXIST"):
        cg.create("shared")
    assert cg.create("shared", exist_ok=True) == cg.path("shared")
    with pytest.raises(CgroupMissingError, match=r"mkdir .*/nope/x failed: ENOENT"):
        cg.create("nope/x")
    with pytest.raises(CgroupBusyError, match=r"rmdir .*/pod failed: EBUSY"):
        cg.remove("pod")
    cg.remove("pod/a")
    cg.remove("pod")
    assert cg.children() == ["shared"]
    with pytest.raises(CgroupMissingError, match="rmdir .* failed: ENOENT"):
        cg.remove("pod")


def test_remove_populated_cgroup_is_busy(cg, fakefs, sleepers):
    cg.create("w")
    cg.write_cpuset("w", CpuSet([1]), [0])
    proc = sleepers()
    cg.move_pid("w", proc.pid)
    with pytest.raises(CgroupBusyError, match="EBUSY"):
        cg.remove("w")
    fakefs.process_exited(proc.pid)
    cg.remove("w")
    assert not cg.exists("w")


def test_children_of_missing_cgroup(cg):
    with pytest.raises(CgroupMissingError, match=r"list .*/ghost failed: ENOENT"):
        cg.children("ghost")


# ---- cpuset ------------------------------------------------------------------------------
def test_write_cpuset_and_effective(cg, fake_root):
    cg.create("shared")
    cg.create("w")
    cg.write_cpuset("shared", CpuSet.parse("0-11"), [0, 1])
    cg.write_cpuset("w", CpuSet.parse("12-15"), NumaMask([1]))
    assert (fake_root / "w" / "cpuset.cpus").read_text().strip() == "12-15"
    assert (fake_root / "w" / "cpuset.mems").read_text().strip() == "1"
    assert cg.read_effective("w") == (CpuSet.parse("12-15"), NumaMask([1]))
    assert cg.read_effective("") == (CpuSet.parse("0-15"), NumaMask([0, 1]))


def test_child_without_cpuset_inherits_parent_effective(cg):
    cg.create("w")
    assert cg.read_effective("w") == (CpuSet.parse("0-15"), NumaMask([0, 1]))


def test_effective_is_clipped_to_the_parent(cg):
    cg.create("pod")
    cg.write_cpuset("pod", CpuSet.parse("0-3"), [0])
    cg.enable_controllers("pod", ["cpuset"])
    cg.create("pod/a")
    cg.write_cpuset("pod/a", CpuSet.parse("2-5"), [0, 1])
    assert cg.read_effective("pod/a") == (CpuSet.parse("2-3"), NumaMask([0]))


def test_empty_cpus_or_mems_are_refused(cg):
    cg.create("w")
    with pytest.raises(CgroupInvalidError, match="empty cpuset.cpus for 'w'.*inherit every CPU"):
        cg.write_cpuset("w", CpuSet(), [0])
    with pytest.raises(CgroupInvalidError, match="empty cpuset.mems for 'w'.*inherit every node"):
        cg.write_cpuset("w", CpuSet([1]), [])


def test_cpus_outside_the_machine_are_einval(cg):
    cg.create("w")
    with pytest.raises(CgroupInvalidError, match=r"write '16' to .*w/cpuset.cpus failed: EINVAL"):
        cg.write_cpuset("w", CpuSet([16]), [0])
    with pytest.raises(CgroupInvalidError, match=r"write '3' to .*w/cpuset.mems failed: EINVAL"):
        cg.write_cpuset("w", CpuSet([1]), [3])


def test_fake_rejects_unparsable_cpu_list(cg):
    cg.create("w")
    with pytest.raises(CgroupInvalidError, match="EINVAL"):
        cg._write(cg.path("w") / "cpuset.cpus", "0-x")


def test_read_effective_falls_back_and_reports_garbage(tmp_path):
    # A tree without *.effective files, read through the kernel backend.
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "cpuset.cpus").write_text("4-5\n")
    (tmp_path / "w" / "cpuset.mems").write_text("0\n")
    cg = CgroupV2(tmp_path, KernelFiles())
    assert cg.read_effective("w") == (CpuSet.parse("4-5"), NumaMask([0]))
    (tmp_path / "w" / "cpuset.cpus").write_text("banana\n")
    with pytest.raises(CgroupInvalidError, match=r"unexpected content 'banana' in .*w/cpuset.cpus"):
        cg.read_effective("w")
    (tmp_path / "w" / "cpuset.mems").unlink()
    (tmp_path / "w" / "cpuset.cpus").write_text("1")
    with pytest.raises(CgroupMissingError, match=r"read .*w/cpuset.mems failed: ENOENT"):
        cg.read_effective("w")


# ---- partitions ------------------------------------------------------------------------------
def test_partition_below_a_member_reads_back_invalid(cg):
    cg.create("w")
    cg.write_cpuset("w", CpuSet.parse("8-15"), [1])
    with pytest.raises(CgroupInvalidError, match=r"wrote 'isolated' to .*w/cpuset.cpus.partition but "
                                                 r"the kernel reports 'isolated invalid \(Parent is "
                                                 r"not a partition root\)'"):
        cg.set_partition("w", "isolated")


def test_partition_carves_cpus_out_of_parent(cg):
    cg.create("shared")
    cg.create("w")
    cg.write_cpuset("shared", CpuSet.parse("0-7"), [0])
    cg.write_cpuset("w", CpuSet.parse("8-15"), [1])
    cg.set_partition("", "root")
    cg.set_partition("w", "isolated")
    assert cg.partition("w") == "isolated"
    assert cg.read_effective("")[0] == CpuSet.parse("0-7")
    assert cg.read_effective("w")[0] == CpuSet.parse("8-15")
    cg.set_partition("w", "member")
    assert cg.read_effective("")[0] == CpuSet.parse("0-15")


def test_remote_partition_with_exclusive_cpus(cg):
    cg.create("w")
    cg.write_cpuset("w", CpuSet.parse("8-15"), [1])
    # cpuset.cpus.exclusive (Linux 6.7+) hands CPUs down for a remote partition;
    # the agent never writes it, the simulated tree models it.
    cg.files.write(cg.path("w") / "cpuset.cpus.exclusive", "8-15")
    cg.set_partition("w", "root")
    assert cg.partition("w") == "root"


def test_overlapping_partition_reads_back_not_exclusive(cg):
    cg.create("a")
    cg.create("b")
    cg.write_cpuset("a", CpuSet.parse("0-7"), [0])
    cg.write_cpuset("b", CpuSet.parse("4-9"), [0])
    cg.set_partition("", "root")
    with pytest.raises(CgroupInvalidError, match=r"not exclusive"):
        cg.set_partition("b", "root")


def test_partition_without_cpus_reads_back_empty(cg):
    cg.create("a")
    cg.set_partition("", "root")
    with pytest.raises(CgroupInvalidError, match=r"cpuset.cpus and cpuset.cpus.exclusive are empty"):
        cg.set_partition("a", "root")


def test_bad_partition_type(cg):
    cg.create("a")
    with pytest.raises(CgroupInvalidError, match="partition type must be one of root, isolated, "
                                                 "member, got 'exclusive'"):
        cg.set_partition("a", "exclusive")
    with pytest.raises(CgroupInvalidError, match="EINVAL"):
        cg._write(cg.path("a") / "cpuset.cpus.partition", "exclusive")


# ---- limits -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size, name", [
    (2048, "2MB"), ("2048kB", "2MB"), ("hugepages-1048576kB", "1GB"), ("1GB", "1GB"),
    (64, "64KB"), ("64kB", "64KB"), (32768, "32MB"), (16 << 20, "16GB"), ("2MB", "2MB"),
    ("2Mi", "2MB"), ("hugepages-1Gi", "1GB"),
])
def test_hugetlb_size_names(size, name):
    assert hugetlb_size_name(size) == name


@pytest.mark.parametrize("size, message", [
    ("3MB", "invalid hugepage size '3MB': not a power of two"), ("huge", "invalid hugepage size"),
    (0, "must be positive"),
])
def test_bad_hugetlb_sizes(size, message):
    with pytest.raises(ValueError, match=message):
        hugetlb_size_name(size)


def test_memory_and_hugetlb_limits(cg, fake_root):
    cg.create("w")
    cg.write_memory_max("w", 1 << 30)
    assert (fake_root / "w" / "memory.max").read_text().strip() == str(1 << 30)
    cg.write_memory_max("w", 4097)  # the kernel rounds down to pages
    assert (fake_root / "w" / "memory.max").read_text().strip() == "4096"
    cg.write_memory_max("w", None)
    assert (fake_root / "w" / "memory.max").read_text().strip() == "max"
    cg.write_hugetlb_max("w", "2048kB", 512 * (2 << 20))
    assert (fake_root / "w" / "hugetlb.2MB.max").read_text().strip() == str(512 * (2 << 20))
    cg.write_hugetlb_max("w", 1048576, None)
    assert (fake_root / "w" / "hugetlb.1GB.max").read_text().strip() == "max"


def test_limit_errors(cg):
    cg.create("w")
    with pytest.raises(CgroupInvalidError, match="memory.max must be a byte count >= 0 or None, "
                                                 "got -1"):
        cg.write_memory_max("w", -1)
    with pytest.raises(CgroupInvalidError, match="got '1G'"):
        cg.write_memory_max("w", "1G")  # type: ignore[arg-type]
    with pytest.raises(CgroupInvalidError, match=r"hugetlb limit 1000 is not a multiple of the 2MB "
                                                 r"page size \(2097152 bytes\) for 'w'"):
        cg.write_hugetlb_max("w", "2MB", 1000)
    with pytest.raises(CgroupMissingError, match=r"hugetlb.64KB.max failed: ENOENT"):
        cg.write_hugetlb_max("w", 64, None)
    with pytest.raises(CgroupInvalidError, match="EINVAL"):
        cg._write(cg.path("w") / "memory.max", "lots")


def test_limit_file_missing_without_controller(fake_root):
    cg = CgroupV2(fake_root, SimulatedCgroupfs(fake_root))
    cg.enable_controllers("", ["cpuset"])
    cg.create("w")
    with pytest.raises(CgroupMissingError, match=r"write 'max' to .*w/memory.max failed: ENOENT"):
        cg.write_memory_max("w", None)


def test_read_only_files_are_eacces(cg):
    cg.create("w")
    with pytest.raises(CgroupPermissionError, match=r"cpuset.cpus.effective failed: EACCES"):
        cg._write(cg.path("w") / "cpuset.cpus.effective", "1")


# ---- processes -----------------------------------------------------------------------------------
def test_move_pid_procs_and_populated(cg, sleepers):
    cg.create("a")
    cg.create("b")
    proc = sleepers()
    assert not cg.populated("a")
    cg.move_pid("a", proc.pid)
    assert cg.procs("a") == [proc.pid] and cg.populated("a") and cg.populated("")
    cg.move_pid("b", proc.pid)  # a process lives in exactly one cgroup
    assert cg.procs("a") == [] and cg.procs("b") == [proc.pid]
    assert not cg.populated("a") and cg.populated("b")


def test_move_pid_errors(cg, sleepers):
    cg.create("pod")
    cg.enable_controllers("pod", ["cpuset", "memory"])
    proc = sleepers()
    with pytest.raises(CgroupBusyError, match=rf"write '{proc.pid}' to .*pod/cgroup.procs failed: "
                                              r"EBUSY"):
        cg.move_pid("pod", proc.pid)
    with pytest.raises(CgroupInvalidError, match="pid must be a positive integer, got 0"):
        cg.move_pid("pod", 0)
    with pytest.raises(CgroupInvalidError, match="got True"):
        cg.move_pid("pod", True)
    cg.create("w")
    with pytest.raises(CgroupNoSuchProcessError, match="ESRCH"):
        cg.move_pid("w", 2**31 - 1)
    with pytest.raises(CgroupInvalidError, match="EINVAL"):
        cg._write(cg.path("w") / "cgroup.procs", "self")


def test_threaded_controllers_alone_allow_processes_next_to_children(cg, sleepers):
    cg.create("pod")
    cg.enable_controllers("pod", ["cpuset"])
    cg.create("pod/a")
    proc = sleepers()
    cg.move_pid("pod", proc.pid)
    assert cg.procs("pod") == [proc.pid]
    # A populated child domain makes the parent unable to be a thread root.
    cg.create("pod2")
    cg.enable_controllers("pod2", ["cpuset"])
    cg.create("pod2/a")
    cg.move_pid("pod2/a", sleepers().pid)
    with pytest.raises(CgroupBusyError, match="pod2/cgroup.procs failed: EBUSY"):
        cg.move_pid("pod2", proc.pid)


def test_move_into_cgroup_without_cpus_is_enospc(cg, sleepers):
    cg.create("a")
    cg.create("b")
    cg.create("rest")
    cg.write_cpuset("a", CpuSet.parse("0-7"), [0])
    cg.write_cpuset("b", CpuSet.parse("8-15"), [1])
    cg.set_partition("", "root")
    cg.set_partition("a", "root")
    cg.set_partition("b", "root")
    assert cg.read_effective("rest")[0] == CpuSet()
    with pytest.raises(CgroupNoSpaceError, match="ENOSPC"):
        cg.move_pid("rest", sleepers().pid)


def test_populated_without_key(cg, fake_root):
    cg.create("w")
    (fake_root / "w" / "cgroup.events").write_text("frozen 0\n")
    with pytest.raises(CgroupInvalidError, match=r"no 'populated' key in .*w/cgroup.events"):
        cg.populated("w")


# ---- the raw (non-fake) write path ---------------------------------------------------------------
@pytest.fixture
def plain(tmp_path):
    """A plain directory standing in for cgroupfs: the kernel backend, raw writes."""
    (tmp_path / "w").mkdir()
    for name in ("cpuset.cpus", "cpuset.mems", "cgroup.procs", "memory.max"):
        (tmp_path / "w" / name).write_text("")
    return CgroupV2(tmp_path, KernelFiles())


def test_raw_writes_replace_the_value_in_one_write(plain, tmp_path, monkeypatch):
    calls = []
    real_write = os.write
    monkeypatch.setattr(cgroup_module.os, "write", lambda fd, data: calls.append(data) or
                        real_write(fd, data))
    plain.write_cpuset("w", CpuSet.parse("0-3,8"), [0])
    plain.write_cpuset("w", CpuSet([1]), [0])
    assert calls == [b"0", b"0-3,8", b"0", b"1"]  # mems before cpus, one write each
    assert (tmp_path / "w" / "cpuset.cpus").read_text() == "1"


def test_raw_write_never_creates_missing_files(plain, tmp_path):
    with pytest.raises(CgroupMissingError, match="hugetlb.2MB.max failed: ENOENT"):
        plain.write_hugetlb_max("w", "2MB", None)
    assert not (tmp_path / "w" / "hugetlb.2MB.max").exists()


def test_raw_write_errno_and_short_write(plain, monkeypatch):
    def erange(fd, data):
        raise OSError(errno.ERANGE, os.strerror(errno.ERANGE))

    monkeypatch.setattr(cgroup_module.os, "write", erange)
    with pytest.raises(CgroupRangeError, match=r"write '1' to .*w/memory.max failed: ERANGE"):
        plain.write_memory_max("w", 1)
    monkeypatch.setattr(cgroup_module.os, "write", lambda fd, data: 1)
    with pytest.raises(CgroupError, match=r"write '4096' to .*memory.max failed: EIO"):
        plain.write_memory_max("w", 4096)


def test_raw_mkdir_rmdir(plain, tmp_path):
    plain.create("x")
    assert (tmp_path / "x").is_dir()
    plain.remove("x")
    with pytest.raises(CgroupBusyError, match="rmdir .*w failed: ENOTEMPTY"):
        plain.remove("w")  # on a plain fs leftover files stand in for EBUSY


# ---- the files backends -------------------------------------------------------------------------
def test_both_backends_are_cgroup_files(fake_root):
    assert isinstance(KernelFiles(), CgroupFiles) and not KernelFiles().simulated
    assert isinstance(SimulatedCgroupfs(fake_root), CgroupFiles) and SimulatedCgroupfs(fake_root).simulated
    assert not CgroupV2(fake_root, KernelFiles()).probe().fake


@pytest.mark.parametrize("marker_present", [False, True])
def test_kernel_backend_never_creates_or_reads_the_marker(tmp_path, monkeypatch, marker_present):
    """The driver does not look for the fake-tree marker: with the kernel
    backend a marker in the root is never opened or stat'ed (nor created),
    and the writes stay raw (a new cgroup gets no emulated interface files)."""
    for name, value in (("cgroup.controllers", "cpuset memory"), ("cgroup.subtree_control", ""),
                        ("cgroup.procs", ""), ("cgroup.events", "populated 0")):
        (tmp_path / name).write_text(value + "\n")
    marker = tmp_path / FAKE_MARKER
    if marker_present:
        marker.write_text("not json: whoever parses this fails\n")
    touched: list[str] = []

    def recording(real):
        def call(path, *args, **kwargs):
            touched.append(os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path))
            return real(path, *args, **kwargs)
        return call

    for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "stat"),
                         (os, "lstat"), (os, "access"), (os, "mkdir"), (os, "rmdir")):
        monkeypatch.setattr(module, name, recording(getattr(module, name)))

    cg = CgroupV2(tmp_path, KernelFiles())
    caps = cg.probe()
    assert not caps.fake
    assert cg.enable_controllers("", ["cpuset", "cpu"]) == ("cpuset",)
    cg.create("w")
    assert cg.exists("w") and cg.children("") == ["w"]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == []  # no emulation
    assert cg.procs("") == [] and not cg.populated("")
    cg.remove("w")
    monkeypatch.undo()

    assert touched and not [p for p in touched if FAKE_MARKER in p]
    assert marker.exists() == marker_present
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpuset"


def test_kernel_files_make_cgroup_directories_readable_whatever_the_umask(tmp_path):
    # The unit's UMask=0077 must not hide a workload's memory.max or cpu.max from its
    # own processes (runtimes size themselves from them) or from monitoring.
    old = os.umask(0o077)
    try:
        KernelFiles().mkdir(tmp_path / "wl-x")
    finally:
        os.umask(old)
    assert (tmp_path / "wl-x").stat().st_mode & 0o777 == 0o755


def test_kernel_files_never_make_a_cgroup_directory_others_can_write(tmp_path, monkeypatch):
    """Not even between the mkdir and the chmod: another user who makes a
    child cgroup in a workload's there keeps the agent from removing it."""
    seen = []
    real_open = os.open

    def open_noting_the_mode(path, *args, **kwargs):
        seen.append(os.stat(path).st_mode & 0o777)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cgroup_module.os, "open", open_noting_the_mode)
    old = os.umask(0)
    try:
        KernelFiles().mkdir(tmp_path / "wl-x")
    finally:
        os.umask(old)
    assert seen and not [mode for mode in seen if mode & 0o022]


def _as_another_user(action) -> bool:
    """Run `action()` in a child with the uid and gid of another user (neither
    root nor the agent's): True if it went through, False if the kernel refused."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setresgid(54321, 54321, 54321)
            os.setresuid(54321, 54321, 54321)
            action()
            os._exit(0)
        except OSError:
            os._exit(1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 1), status
    return os.WEXITSTATUS(status) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root")
def test_the_simulated_tree_cannot_be_redirected_by_another_user_whatever_the_umask(tmp_path):
    """`--sysfs-root` mode keeps its tree in the state directory, which may be
    0755: another user must not be able to swap an interface file for a link
    to a file of root's, which the agent's next write would then overwrite."""
    import tempfile

    victim = tmp_path / "victim"
    victim.write_text("precious")
    state = tempfile.mkdtemp(prefix="na-fake-", dir="/tmp")  # as a state directory: root's, 0755
    os.chmod(state, 0o755)
    old = os.umask(0)
    try:
        root = make_simulated_cgroup_root(f"{state}/cgroupfs", CpuSet.parse("0-3"), [0])
        driver = CgroupV2(root, SimulatedCgroupfs(root))
        driver.enable_controllers("", ["cpuset", "memory"])
        driver.create("wl")

        def plant() -> None:
            os.rename(root / "wl" / "memory.max", root / "wl" / ".gone")
            os.symlink(victim, root / "wl" / "memory.max")

        planted = _as_another_user(plant)
        try:
            driver.write_memory_max("wl", 1 << 30)
        except CgroupError:
            pass  # refusing the link is as good as never seeing one
        assert not planted and victim.read_text() == "precious"
    finally:
        os.umask(old)
        import shutil

        shutil.rmtree(state, ignore_errors=True)
