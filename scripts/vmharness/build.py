"""Prepare the guest: host packages, a Debian kernel, its modules and an initramfs.

Everything lands in the cache directory (`<repo>/.cache/vm/` by default) and is
reused: a second `setup` only checks that the files are there. The kernel
version is pinned in `kernel.json` on first download so later runs do not
follow apt's package lists by surprise (`setup --refresh` picks the newest again).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST_PACKAGES = {  # command that proves the package is there -> Debian package
    "qemu-system-x86_64": "qemu-system-x86",
    "depmod": "kmod",
    "cpio": "cpio",
}
BUSYBOX = Path("/bin/busybox")  # busybox-static installs a static binary here
# nvme and e1000e: the guest's NVMe and NIC get their drivers, so their MSI interrupts exist
# (the isolation scenario moves them); dummy gives the Slurm guest an address of its own
# (its daemons refuse to bind while only loopback has one); virtio_net carries the link
# that joins the guests of a two-guest shape.
GUEST_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "nvme", "e1000e", "dummy", "virtio_net")
KERNEL_PACKAGE = re.compile(r"^linux-image-(6\.1\.\d+-\d+-amd64)$")  # generic flavour only
XZ_MAGIC = b"\xfd7zXZ\x00"


class SetupError(RuntimeError):
    """The guest could not be prepared; the message says which step and why."""


@dataclass(frozen=True)
class GuestImage:
    kernel_version: str
    vmlinux: Path
    initrd: Path


def default_cache_dir() -> Path:
    return Path(os.environ.get("NUMA_AGENT_VM_CACHE", REPO / ".cache" / "vm"))


def progress(message: str) -> None:
    print(f"vm: {message}", file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    except FileNotFoundError as exc:
        raise SetupError(f"{what}: {argv[0]} is not installed ({exc})") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise SetupError(f"{what}: `{' '.join(argv)}` exited {done.returncode}: " + " | ".join(tail))
    return done


def ensure_host_packages() -> None:
    missing = sorted({pkg for cmd, pkg in HOST_PACKAGES.items() if not _have_command(cmd)})
    if not _is_static_busybox(BUSYBOX):
        missing.append("busybox-static")
    if not missing:
        return
    if os.geteuid() != 0:
        raise SetupError(f"host packages missing: {' '.join(missing)}; install them as root "
                         f"(apt-get install -y {' '.join(missing)})")
    progress(f"installing host packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], "apt-get install", env=env)
    except SetupError:
        progress("apt-get install failed; refreshing package lists once and retrying")
        _run(["apt-get", "update", "-q"], "apt-get update", env=env)
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], "apt-get install", env=env)
    if not _is_static_busybox(BUSYBOX):
        raise SetupError(f"{BUSYBOX} is not a static binary after installing busybox-static")


def _have_command(cmd: str) -> bool:
    # depmod lives in /sbin, which a non-root PATH often lacks
    return shutil.which(cmd) is not None or Path("/sbin", cmd).exists()


def _is_static_busybox(path: Path) -> bool:
    """A static ELF has no program interpreter (PT_INTERP), so it runs in an empty initramfs."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in data[:4096] and b"ld-linux-x86-64" not in data[:4096]


def _listed_kernels() -> list[str]:
    listing = _run(["apt-cache", "search", "--names-only", r"^linux-image-6\.1\.[0-9]+-[0-9]+-amd64$"],
                   "listing kernels").stdout
    names = [line.split(" ", 1)[0] for line in listing.splitlines()]
    return [n for n in names if KERNEL_PACKAGE.match(n)]


def newest_kernel_package() -> str:
    names = _listed_kernels()
    if not names:
        # A fresh machine may have no package lists yet.
        progress("apt lists no linux-image-6.1.*-amd64 package; refreshing package lists once")
        _run(["apt-get", "update", "-q"], "apt-get update")
        names = _listed_kernels()
    if not names:
        raise SetupError("apt lists no linux-image-6.1.*-amd64 package, even after `apt-get update`")

    def version_key(name: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", name))

    return max(names, key=version_key)


def extract_vmlinux(vmlinuz: bytes) -> bytes:
    """The uncompressed ELF kernel inside a bzImage: QEMU boots it directly (PVH), which saves
    seconds of in-guest decompression under emulation."""
    start = vmlinuz.find(XZ_MAGIC)
    while start != -1:
        try:
            # the xz stream is followed by other data; a decompressor stops at its end
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(vmlinuz[start:])
        except lzma.LZMAError:
            elf = b""
        if elf.startswith(b"\x7fELF"):
            return elf
        start = vmlinuz.find(XZ_MAGIC, start + 1)
    raise SetupError("no xz-compressed ELF kernel found inside vmlinuz "
                     "(is this a Debian x86-64 kernel? they are xz-compressed)")


def parse_show_depends(output: str) -> list[str]:
    """`modprobe --show-depends` lines -> .ko paths in load order; built-in modules need nothing."""
    paths: list[str] = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "insmod":
            if parts[1] not in paths:
                paths.append(parts[1])
        elif parts and parts[0] != "builtin":
            raise SetupError(f"unexpected modprobe --show-depends line: {line!r}")
    return paths


# --- initramfs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CpioEntry:
    name: str  # without leading slash
    mode: int  # full st_mode, type bits included
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def cpio_newc(entries: list[CpioEntry]) -> bytes:
    """An archive in the kernel's initramfs format (`cpio -H newc`), owned by root, mtime 0,
    so the same inputs always give the same bytes."""
    out = bytearray()

    def pad4() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    for ino, entry in enumerate([*entries, CpioEntry("TRAILER!!!", 0)], start=1):
        name = entry.name.encode() + b"\0"
        fields = (ino, entry.mode, 0, 0, 1, 0, len(entry.data), 0, 0,
                  entry.rdev[0], entry.rdev[1], len(name), 0)
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + name
        pad4()
        out += entry.data
        pad4()
    return bytes(out)


INIT_TEMPLATE = r"""#!/bin/busybox sh
# PID 1 of the test guest: build a writable copy of the host root, enable every
# cgroup v2 controller, run the job from the job share, record its result, power off;
# or, when the job asks for it (its `init` file reads "systemd"), boot the host's
# systemd on that root and let a unit run the job.
/bin/busybox mkdir -p /bin /sbin /proc /sys /dev /host /rw /newroot
/bin/busybox --install -s /bin
export PATH=/bin
say() { echo "vmharness: $*" > /dev/console; }
fail() { say "FAILED: $*"; poweroff -f; }
# PID 1 handed to the host's systemd: the job runs as a unit of the booted system.
# Its shares live outside /run and /tmp, which systemd mounts afresh; cgroup2 is
# left to systemd, which mounts it and enables the controllers itself.
boot_systemd() {
    J=@SYSTEMD_JOB@
    mkdir -p $R$J || fail "job mount point"
    mount --move /job $R$J || fail "move job share"
    if grep -q '^out$' $R$J/shares 2>/dev/null; then
        mkdir -p $R@SYSTEMD_OUT@
        mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out $R@SYSTEMD_OUT@ || fail "mount out share"
    fi
    mkdir -p $R/etc/systemd/system/multi-user.target.wants $R/etc/tmpfiles.d
    # tmp.conf empties /tmp at boot: through the overlay that walks the host's /tmp
    # over 9p for minutes, for a guest that throws its root away anyway.
    ln -sf /dev/null $R/etc/tmpfiles.d/tmp.conf
    cat > $R/etc/systemd/system/vmharness-job.service <<UNIT
[Unit]
Description=vmharness job
After=basic.target

[Service]
Type=simple
ExecStart=/bin/sh $J/run-job.sh
StandardOutput=journal+console
StandardError=journal+console
UNIT
    ln -sf ../vmharness-job.service $R/etc/systemd/system/multi-user.target.wants/vmharness-job.service
    cat > $R$J/run-job.sh <<'RUN'
J=@SYSTEMD_JOB@
cut -d' ' -f1 /proc/uptime > $J/started
echo "vmharness: running job under systemd (timeout $(cat $J/timeout)s)" > /dev/console
timeout -k 5 "$(cat $J/timeout)" /bin/sh $J/job.sh < /dev/null > $J/stdout 2> $J/stderr
rc=$?
[ $rc -eq 124 ] && echo timeout > $J/timed_out
echo $rc > $J/exit_code.tmp && mv $J/exit_code.tmp $J/exit_code
cut -d' ' -f1 /proc/uptime > $J/finished
echo "vmharness: job exited $rc" > /dev/console
sync
systemctl poweroff -ff
RUN
    umount $R/dev/shm $R/dev/pts $R/dev $R/run $R/sys $R/proc
    say "handing PID 1 to systemd"
    exec switch_root $R /lib/systemd/systemd --unit=multi-user.target
    fail "switch_root"
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say "loading modules"
for m in @MODULES@; do insmod "/lib/modules/$m" || fail "insmod $m"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /host || fail "mount host root"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail "overlay"
R=/newroot
mount -t proc proc $R/proc || fail "proc"
mount -t sysfs sysfs $R/sys || fail "sysfs"
mount -t devtmpfs devtmpfs $R/dev || fail "devtmpfs"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts || fail "devpts"
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm || fail "/dev/shm"
mount -t tmpfs -o mode=0755 tmpfs $R/run || fail "/run"
mkdir -p /job
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job /job || fail "mount job share"
# A guest of a two-guest shape: its end of the link (found by MAC) gets its address.
if [ -s /job/net ]; then
    read mac address < /job/net
    link=
    for dev in /sys/class/net/*; do
        [ "$(cat $dev/address)" = "$mac" ] && link=${dev##*/}
    done
    [ -n "$link" ] || fail "no interface with MAC $mac"
    ip addr add $address dev $link && ip link set $link up && ip link set lo up || fail "address $address on $link"
    say "link $link: $address"
fi
if [ "$(cat /job/init 2>/dev/null)" = systemd ]; then boot_systemd; fi
# favordynmods (6.0+): a task's move between cgroups does not wait for an RCU grace
# period, which under emulation, with vCPUs starved by the host, took minutes.
mount -t cgroup2 -o nsdelegate,favordynmods cgroup2 $R/sys/fs/cgroup 2>/dev/null \
    || mount -t cgroup2 -o nsdelegate cgroup2 $R/sys/fs/cgroup || fail "cgroup2"
# As a systemd host does: every controller available to children of the root.
for c in $(cat $R/sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" > $R/sys/fs/cgroup/cgroup.subtree_control || say "cannot enable controller $c"
done
J=@CHROOT_JOB@
mkdir -p $R$J
mount --move /job $R$J || fail "move job share"
if grep -q '^out$' $R$J/shares 2>/dev/null; then
    mkdir -p $R@CHROOT_OUT@
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out $R@CHROOT_OUT@ || fail "mount out share"
fi
timeout=$(cat $R$J/timeout)
cut -d' ' -f1 /proc/uptime > $R$J/started
say "running job (timeout ${timeout}s)"
chroot $R /bin/sh $J/job.sh < /dev/null > $R$J/stdout 2> $R$J/stderr &
job=$!
( sleep "$timeout"; echo timeout > $R$J/timed_out; kill -TERM $job; sleep 5; kill -KILL $job ) &
watchdog=$!
wait $job
rc=$?
kill $watchdog 2>/dev/null
echo $rc > $R$J/exit_code.tmp && mv $R$J/exit_code.tmp $R$J/exit_code
cut -d' ' -f1 /proc/uptime > $R$J/finished
say "job exited $rc"
sync
poweroff -f
"""


# Where the job and out shares are inside the guest: under /run for the chroot
# guest; outside /run and /tmp under systemd, which mounts both afresh.
CHROOT_JOB_DIR, CHROOT_OUT_DIR = "/run/vmharness/job", "/run/vmharness/out"
SYSTEMD_JOB_DIR, SYSTEMD_OUT_DIR = "/vmharness/job", "/vmharness/out"


def render_init(module_names: list[str]) -> str:
    return (INIT_TEMPLATE.replace("@MODULES@", " ".join(module_names))
            .replace("@CHROOT_JOB@", CHROOT_JOB_DIR).replace("@CHROOT_OUT@", CHROOT_OUT_DIR)
            .replace("@SYSTEMD_JOB@", SYSTEMD_JOB_DIR).replace("@SYSTEMD_OUT@", SYSTEMD_OUT_DIR))


def build_initramfs(module_paths: list[Path], busybox: Path) -> bytes:
    names = [p.name[:-3] if p.name.endswith(".xz") else p.name for p in module_paths]
    init = render_init(names)
    entries = [CpioEntry(d, stat.S_IFDIR | 0o755) for d in ("bin", "dev", "lib", "lib/modules")]
    entries.append(CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(CpioEntry("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()))
    for path, name in zip(module_paths, names, strict=True):
        data = path.read_bytes()
        if path.name.endswith(".xz"):
            data = lzma.decompress(data)  # busybox insmod loads plain .ko only
        entries.append(CpioEntry(f"lib/modules/{name}", stat.S_IFREG | 0o644, data))
    entries.append(CpioEntry("init", stat.S_IFREG | 0o755, init.encode()))
    return gzip.compress(cpio_newc(entries), compresslevel=9, mtime=0)


# --- the set-up as a whole ------------------------------------------------------------------

@contextlib.contextmanager
def _locked(cache: Path):
    """Two runs preparing the cache at once would fight over the same files."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _fetch_kernel(cache: Path, refresh: bool) -> tuple[str, Path]:
    """-> (kernel version, unpacked package tree)."""
    pin = cache / "kernel.json"
    if pin.exists() and not refresh:
        package = json.loads(pin.read_text())["package"]
    else:
        package = newest_kernel_package()
    version = KERNEL_PACKAGE.match(package).group(1)
    tree = cache / "kernel" / version
    if not (tree / ".unpacked").exists():
        downloads = cache / "kernel" / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        debs = sorted(downloads.glob(f"{package}_*.deb"))
        if not debs:
            progress(f"downloading {package} (about 70 MB)")
            _run(["apt-get", "download", "-q", package], f"downloading {package}", cwd=downloads)
            debs = sorted(downloads.glob(f"{package}_*.deb"))
            if not debs:
                raise SetupError(f"apt-get download {package} left no .deb in {downloads}")
        progress(f"unpacking {debs[-1].name}")
        if tree.exists():
            shutil.rmtree(tree)
        _run(["dpkg-deb", "-x", str(debs[-1]), str(tree)], "unpacking the kernel package")
        (tree / ".unpacked").touch()
    _write_atomic(pin, json.dumps({"package": package, "version": version}).encode())
    return version, tree


def _modules_for(tree: Path, version: str) -> list[Path]:
    depmod = shutil.which("depmod") or "/sbin/depmod"
    modprobe = shutil.which("modprobe") or "/sbin/modprobe"
    if not (tree / "lib/modules" / version / "modules.dep").exists():
        progress(f"running depmod for {version}")
        _run([depmod, "-b", str(tree), version], "depmod")
    paths: list[str] = []
    for module in GUEST_MODULES:
        out = _run([modprobe, "-d", str(tree), "-S", version, "--show-depends", module],
                   f"resolving module {module}").stdout
        paths += [p for p in parse_show_depends(out) if p not in paths]
    # modprobe prints paths below -d as if it were the root, with the prefix included
    return [Path(p) if Path(p).exists() else tree / p.lstrip("/") for p in paths]


def ensure_guest_image(cache: Path | None = None, *, refresh: bool = False) -> GuestImage:
    """Everything a boot needs, built once and cached. Safe to call before every run."""
    cache = cache or default_cache_dir()
    with _locked(cache):
        ensure_host_packages()
        version, tree = _fetch_kernel(cache, refresh)
        vmlinux = cache / f"vmlinux-{version}"
        if not vmlinux.exists():
            progress(f"extracting the uncompressed kernel to {vmlinux.name}")
            _write_atomic(vmlinux, extract_vmlinux((tree / "boot" / f"vmlinuz-{version}").read_bytes()))
        modules = _modules_for(tree, version)
        # The initramfs name carries a digest of its inputs: editing /init rebuilds it.
        digest = hashlib.sha256(render_init([m.name for m in modules]).encode() + BUSYBOX.read_bytes()
                                + "\n".join(map(str, modules)).encode()).hexdigest()[:12]
        initrd = cache / f"initramfs-{version}-{digest}.cpio.gz"
        if not initrd.exists():
            progress(f"building {initrd.name} (busybox, {len(modules)} modules)")
            _write_atomic(initrd, build_initramfs(modules, BUSYBOX))
            for old in cache.glob("initramfs-*.cpio.gz"):
                if old != initrd:
                    old.unlink()
        return GuestImage(version, vmlinux, initrd)
