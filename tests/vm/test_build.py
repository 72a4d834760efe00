"""Guest image pieces that need no network and no QEMU: cpio, kernel extraction, modules."""

import gzip
import lzma
import stat
import subprocess

import pytest
from vmharness import build
from vmharness.build import (
    CpioEntry,
    SetupError,
    build_initramfs,
    cpio_newc,
    extract_vmlinux,
    parse_show_depends,
    render_init,
)


def read_newc(data: bytes) -> dict[str, tuple[int, bytes, tuple[int, int]]]:
    """Independent reader of the newc format: name -> (mode, data, (rdevmajor, rdevminor))."""
    entries, pos = {}, 0
    while True:
        assert data[pos:pos + 6] == b"070701", f"bad magic at {pos}"
        fields = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rmaj, rmin, namesize = fields[1], fields[6], fields[9], fields[10], fields[11]
        name_at = pos + 110
        name = data[name_at:name_at + namesize - 1].decode()
        assert data[name_at + namesize - 1] == 0
        body_at = (name_at + namesize + 3) & ~3
        body = data[body_at:body_at + size]
        pos = (body_at + size + 3) & ~3
        if name == "TRAILER!!!":
            assert pos == len(data)
            return entries
        entries[name] = (mode, body, (rmaj, rmin))


def test_cpio_newc_round_trips_files_dirs_and_device_nodes():
    archive = cpio_newc([
        CpioEntry("bin", stat.S_IFDIR | 0o755),
        CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
        CpioEntry("init", stat.S_IFREG | 0o755, b"#!/bin/sh\necho hi\n"),
        CpioEntry("odd", stat.S_IFREG | 0o644, b"12345"),  # forces padding after the body
    ])
    entries = read_newc(archive)
    assert list(entries) == ["bin", "dev/console", "init", "odd"]
    assert stat.S_ISDIR(entries["bin"][0])
    assert stat.S_ISCHR(entries["dev/console"][0]) and entries["dev/console"][2] == (5, 1)
    assert entries["init"][1] == b"#!/bin/sh\necho hi\n" and entries["init"][0] & 0o777 == 0o755
    assert entries["odd"][1] == b"12345"
    assert cpio_newc([CpioEntry("odd", stat.S_IFREG | 0o644, b"12345")]) == \
        cpio_newc([CpioEntry("odd", stat.S_IFREG | 0o644, b"12345")])  # reproducible bytes


def test_cpio_newc_is_readable_by_gnu_cpio_when_installed(tmp_path):
    try:
        listing = subprocess.run(["cpio", "-it", "--quiet"], input=cpio_newc([
            CpioEntry("a", stat.S_IFDIR | 0o755), CpioEntry("a/b", stat.S_IFREG | 0o644, b"x")]),
            capture_output=True, check=True).stdout
    except FileNotFoundError:
        pytest.skip("cpio is not installed")
    assert listing.split() == [b"a", b"a/b"]


def test_extract_vmlinux_keeps_the_xz_stream_that_holds_an_elf():
    elf = b"\x7fELF" + bytes(range(256)) * 40
    image = b"MZ" + b"\0" * 500 + lzma.compress(b"not a kernel") + b"pad" + lzma.compress(elf) + b"trailer"
    assert extract_vmlinux(image) == elf


def test_extract_vmlinux_explains_a_kernel_without_xz_elf():
    with pytest.raises(SetupError, match="no xz-compressed ELF kernel found inside vmlinuz"):
        extract_vmlinux(b"MZ" + b"\xfd7zXZ\x00broken" + lzma.compress(b"just data"))


def test_parse_show_depends_orders_and_deduplicates_and_skips_builtins():
    out = ("insmod /lib/modules/6.1/kernel/virtio_ring.ko \n"
           "insmod /lib/modules/6.1/kernel/virtio.ko\n"
           "builtin crc32c\n"
           "insmod /lib/modules/6.1/kernel/virtio_ring.ko\n"
           "insmod /lib/modules/6.1/kernel/9p.ko.xz debug=0\n")
    assert parse_show_depends(out) == ["/lib/modules/6.1/kernel/virtio_ring.ko",
                                       "/lib/modules/6.1/kernel/virtio.ko",
                                       "/lib/modules/6.1/kernel/9p.ko.xz"]


def test_parse_show_depends_refuses_what_it_does_not_understand():
    with pytest.raises(SetupError, match="unexpected modprobe --show-depends line: 'modprobe: FATAL"):
        parse_show_depends("modprobe: FATAL: Module nope not found\n")


def test_initramfs_holds_busybox_modules_in_order_console_and_init(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF static busybox")
    plain = tmp_path / "virtio.ko"
    plain.write_bytes(b"plain module")
    packed = tmp_path / "9p.ko.xz"
    packed.write_bytes(lzma.compress(b"packed module"))
    entries = read_newc(gzip.decompress(build_initramfs([plain, packed], busybox)))
    assert entries["bin/busybox"][1] == b"\x7fELF static busybox"
    assert entries["lib/modules/virtio.ko"][1] == b"plain module"
    assert entries["lib/modules/9p.ko"][1] == b"packed module"  # busybox insmod needs plain .ko
    assert entries["dev/console"][2] == (5, 1)
    init = entries["init"][1].decode()
    assert "for m in virtio.ko 9p.ko; do" in init
    for needed in ("mount -t cgroup2 -o nsdelegate", "nsdelegate,favordynmods", "cgroup.subtree_control", "version=9p2000.L",
                   "lowerdir=/host", "poweroff -f", "/started", "exit_code"):
        assert needed in init


def test_init_boots_systemd_only_when_the_job_asks_and_fills_every_placeholder():
    init = render_init(["virtio.ko"])
    assert "@" not in init.replace("$@", "")  # every @NAME@ replaced
    branch = init.index('= systemd ]; then boot_systemd; fi')
    # the chroot path's own cgroup2 mount comes after the branch: systemd mounts its own
    assert init.index("mount -t cgroup2") > branch
    for needed in ("exec switch_root $R /lib/systemd/systemd", "systemctl poweroff -ff",
                   "multi-user.target.wants/vmharness-job.service", "/etc/tmpfiles.d/tmp.conf",
                   "J=/vmharness/job", "J=/run/vmharness/job"):
        assert needed in init


def test_missing_host_packages_without_root_name_the_apt_command(monkeypatch):
    monkeypatch.setattr(build, "_have_command", lambda cmd: False)
    monkeypatch.setattr(build, "_is_static_busybox", lambda path: False)
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    with pytest.raises(SetupError, match=r"host packages missing: cpio kmod qemu-system-x86 busybox-static; "
                                         r"install them as root \(apt-get install -y cpio"):
        build.ensure_host_packages()


def test_a_failing_setup_command_is_quoted_with_its_output():
    with pytest.raises(SetupError, match=r"listing things: `sh -c echo nope >&2; exit 4` exited 4: nope"):
        build._run(["sh", "-c", "echo nope >&2; exit 4"], "listing things")


def test_a_missing_setup_tool_is_named():
    with pytest.raises(SetupError, match="unpacking: /nonexistent/dpkg-deb is not installed"):
        build._run(["/nonexistent/dpkg-deb"], "unpacking")


def test_newest_kernel_package_picks_the_highest_generic_version(monkeypatch):
    listing = ("linux-image-6.1.0-9-amd64 - Linux 6.1\n"
               "linux-image-6.1.0-57-amd64 - Linux 6.1\n"
               "linux-image-6.1.0-60-cloud-amd64 - cloud\n"
               "linux-image-6.1.0-10-amd64 - Linux 6.1\n")
    monkeypatch.setattr(build, "_run", lambda argv, what, **kw: subprocess.CompletedProcess(argv, 0, listing, ""))
    assert build.newest_kernel_package() == "linux-image-6.1.0-57-amd64"


def test_no_listed_kernel_refreshes_apt_once_then_says_so(monkeypatch):
    calls = []

    def fake_run(argv, what, **kw):
        calls.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(build, "_run", fake_run)
    with pytest.raises(SetupError, match=r"apt lists no linux-image-6.1.\*-amd64 package, even after `apt-get update`"):
        build.newest_kernel_package()
    assert calls == ["apt-cache", "apt-get", "apt-cache"]


def test_kernel_found_after_refreshing_apt(monkeypatch):
    answers = iter(["", "", "linux-image-6.1.0-57-amd64 - Linux 6.1\n"])
    monkeypatch.setattr(build, "_run", lambda argv, what, **kw: subprocess.CompletedProcess(argv, 0, next(answers), ""))
    assert build.newest_kernel_package() == "linux-image-6.1.0-57-amd64"
