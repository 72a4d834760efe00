"""Boot a guest of a given shape, run one command inside it, collect the result.

One boot runs one command. To run many tests, make that command a whole pytest
session or a scenario script: a boot costs 10-40 s under emulation, a command
inside an already booted guest costs only its own run time.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .build import (
    CHROOT_JOB_DIR,
    CHROOT_OUT_DIR,
    SYSTEMD_JOB_DIR,
    SYSTEMD_OUT_DIR,
    GuestImage,
    default_cache_dir,
    ensure_guest_image,
    progress,
)
from .monitor import serve_request
from .shapes import GUEST_NETWORK, Shape, get_shape, guest_address, guest_mac, qemu_args

# Where the job share and the optional out share are mounted inside the guest.
GUEST_JOB_DIR, GUEST_OUT_DIR = CHROOT_JOB_DIR, CHROOT_OUT_DIR
# systemd's own start adds minutes under emulation before the job unit runs.
SYSTEMD_BOOT_SECONDS = 300
TIMED_OUT_STATUS = 124                 # as coreutils timeout(1)
CONSOLE_TAIL_LINES = 30
# After the guest's own watchdog kills the command it still has to power off; past this
# margin the host stops QEMU itself.
HOST_GRACE_SECONDS = 30
# The other guests of a two-guest shape serve the first one's command: once it has ended
# they have this long to power off by themselves before the host stops them.
PEER_GRACE_SECONDS = 30
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Never passed into the guest: the opt-in switch would make tests inside the guest boot
# guests of their own; the rest describe the host session, not the guest.
_ENV_DROPPED = {"NUMA_AGENT_VM", "OLDPWD", "_", "SHLVL", "PWD"}


class GuestError(RuntimeError):
    """The guest gave no result for the command (never booted, or died mid-run)."""

    def __init__(self, message: str, console_tail: tuple[str, ...] = (), job_dir: Path | None = None):
        super().__init__(message)
        self.console_tail = console_tail
        self.job_dir = job_dir


class GuestBootError(GuestError):
    """No boot reached the command (the `started` marker never appeared)."""


@dataclass(frozen=True)
class GuestResult:
    shape: str
    argv: tuple[str, ...]
    exit_code: int | None        # the command's own status; None if it was killed for time
    timed_out: bool
    stdout: bytes
    stderr: bytes
    boot_seconds: float          # QEMU start -> `started` marker, for the boot that ran the command
    run_seconds: float           # `started` marker -> QEMU exit
    total_seconds: float         # everything, failed boots included
    attempts: int                # boots needed (2 when the first one hung)
    console_tail: tuple[str, ...] = field(repr=False, default=())
    job_dir: Path | None = None  # kept only when asked (keep_job_dir=True)
    peers: tuple[str, ...] = ()  # how each other guest of the shape ended, one line each

    @property
    def returncode(self) -> int:
        """What a shell would see: the command's status, or 124 after a timeout."""
        return TIMED_OUT_STATUS if self.timed_out or self.exit_code is None else self.exit_code

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def guest_env(host_env: dict[str, str], shape: Shape, cwd: str, with_out: bool, guest: int = 0) -> dict[str, str]:
    """The command's environment inside the guest: the caller's, minus host-session noise.
    In a shape of several guests, which one this is and every guest's address."""
    env = {k: v for k, v in host_env.items()
           if _ENV_NAME.match(k) and k not in _ENV_DROPPED and "\0" not in v}
    env["PWD"] = cwd
    env["NUMA_AGENT_IN_VM"] = "1"
    env["NUMA_AGENT_VM_SHAPE"] = shape.name
    if shape.guests > 1:
        env["NUMA_AGENT_VM_GUEST"] = str(guest)
        env["NUMA_AGENT_VM_ADDRESSES"] = " ".join(guest_address(i) for i in range(shape.guests))
    else:
        for name in ("NUMA_AGENT_VM_GUEST", "NUMA_AGENT_VM_ADDRESSES"):
            env.pop(name, None)
    # The job folder, where the guest asks the host for QEMU monitor commands (monitor.py).
    env["NUMA_AGENT_VM_JOB"] = SYSTEMD_JOB_DIR if shape.boots_systemd else GUEST_JOB_DIR
    if with_out:
        env["NUMA_AGENT_VM_OUT"] = SYSTEMD_OUT_DIR if shape.boots_systemd else GUEST_OUT_DIR
    else:
        env.pop("NUMA_AGENT_VM_OUT", None)
    return env


def job_script(argv: list[str] | tuple[str, ...], cwd: str, env: dict[str, str]) -> str:
    """The shell script the guest runs (with the host's /bin/sh, since the host root is the guest root)."""
    if not argv:
        raise ValueError("no command given to run in the guest")
    if "=" in argv[0]:
        raise ValueError(f"the command name {argv[0]!r} contains '=', which env(1) would take "
                         "for a variable; call it through `sh -c` or a path without '='")
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        "# Written by scripts/vmharness for one guest run.",
        f"cd {q(cwd)} || {{ echo {q(f'vmharness: cannot enter {cwd} in the guest')} >&2; exit 125; }}",
        "exec /usr/bin/env -i \\",
        *(f"    {q(f'{k}={v}')} \\" for k, v in sorted(env.items())),
        "    " + " ".join(q(a) for a in argv),
        "",
    ]
    return "\n".join(lines)


def _tail(path: Path, lines: int = CONSOLE_TAIL_LINES) -> tuple[str, ...]:
    try:
        text = path.read_bytes().decode("utf-8", "replace").replace("\r", "")
    except OSError:
        return ()
    return tuple(text.splitlines()[-lines:])


class _Streamer:
    """Copies what the guest appends to stdout/stderr to ours while the command runs; with a
    prefix (another guest's), line by line, all of it to our stderr."""

    def __init__(self, job_dir: Path, enabled: bool, prefix: bytes = b""):
        self.enabled = enabled
        self.offsets = {"stdout": 0, "stderr": 0}
        self.job_dir = job_dir
        self.prefix = prefix
        self.partial = {"stdout": b"", "stderr": b""}

    def pump(self) -> None:
        if not self.enabled:
            return
        for name, sink in (("stdout", sys.stdout.buffer), ("stderr", sys.stderr.buffer)):
            try:
                with open(self.job_dir / name, "rb") as f:
                    f.seek(self.offsets[name])
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            self.offsets[name] += len(data)
            if self.prefix:
                *lines, self.partial[name] = (self.partial[name] + data).split(b"\n")
                data = b"".join(self.prefix + line + b"\n" for line in lines)
                sink = sys.stderr.buffer
            sink.write(data)
            sink.flush()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class _Boot:
    started: bool
    boot_seconds: float
    run_seconds: float
    timed_out: bool
    why: str  # empty when the boot ran the command to its end


_RUN_FILES = ("started", "finished", "stdout", "stderr", "exit_code", "timed_out", "console.log")


def _start_qemu(args: list[str], job_dir: Path, net_socket: Path | None = None) -> subprocess.Popen:
    for name in _RUN_FILES:
        (job_dir / name).unlink(missing_ok=True)
    if net_socket is not None:
        net_socket.unlink(missing_ok=True)  # a booted-again guest binds its end of the link anew
    with open(job_dir / "qemu.log", "wb") as qemu_log:
        try:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=qemu_log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise GuestError(f"cannot start {args[0]}: {exc}") from None


def _boot_once(args: list[str], job_dir: Path, boot_timeout: float, timeout: float,
               stream: bool, poll: float, on_started, tick=lambda: None,
               net_socket: Path | None = None) -> _Boot:
    t0 = time.monotonic()
    proc = _start_qemu(args, job_dir, net_socket)
    try:
        while not (job_dir / "started").exists():
            tick()
            if proc.poll() is not None:
                if (job_dir / "started").exists():
                    break
                qemu_says = " | ".join(_tail(job_dir / "qemu.log", 5))
                return _Boot(False, time.monotonic() - t0, 0.0, False,
                             f"QEMU exited with status {proc.returncode} before the command started"
                             + (f" (QEMU: {qemu_says})" if qemu_says else ""))
            if time.monotonic() - t0 > boot_timeout:
                return _Boot(False, time.monotonic() - t0, 0.0, False,
                             f"the guest did not start the command within {boot_timeout:g} s")
            time.sleep(poll)
        t_started = time.monotonic()
        on_started(t_started - t0)
        streamer = _Streamer(job_dir, stream)
        # The guest kills the command at `timeout` and powers off; the margin covers that,
        # and the host stops a guest that hangs even so.
        deadline = t_started + timeout + HOST_GRACE_SECONDS
        while proc.poll() is None and time.monotonic() < deadline:
            streamer.pump()
            serve_request(job_dir)  # a guest of a shape without a monitor never asks
            tick()
            time.sleep(poll)
        streamer.pump()
        host_killed = proc.poll() is None
        _stop(proc)
        return _Boot(True, t_started - t0, time.monotonic() - t_started,
                     host_killed or (job_dir / "timed_out").exists(), "")
    finally:
        _stop(proc)


class _Peer:
    """Another guest of a two-guest shape, booted beside the first. It runs the same command
    (NUMA_AGENT_VM_GUEST tells it which guest it is), which serves the first guest's; a boot
    that hangs is tried again like the first guest's. `tick()` is called from the first
    guest's boot loop; `finish()` once its command has ended."""

    def __init__(self, index: int, args: list[str], job_dir: Path, net_socket: Path, boot_timeout: float,
                 attempts: int, stream: bool, say) -> None:
        self.index, self.args, self.job_dir, self.net_socket = index, args, job_dir, net_socket
        self.boot_timeout, self.attempts_left, self.say = boot_timeout, attempts, say
        self.streamer = _Streamer(job_dir, stream, prefix=f"[guest {index}] ".encode())
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        self.started = False
        self.failures: list[str] = []

    def boot(self) -> None:
        self.attempts_left -= 1
        self.say(f"booting guest {self.index} beside it")
        self.t0 = time.monotonic()
        self.proc = _start_qemu(self.args, self.job_dir, self.net_socket)

    def tick(self) -> None:
        if self.proc is None:
            return
        if self.started:
            self.streamer.pump()
            return
        if (self.job_dir / "started").exists():
            self.started = True
            self.say(f"guest {self.index} started its command {time.monotonic() - self.t0:.1f} s after boot")
            return
        if self.proc.poll() is not None:
            why = f"QEMU exited with status {self.proc.returncode} before the command started (QEMU: " \
                  + " | ".join(_tail(self.job_dir / "qemu.log", 5)) + ")"
        elif time.monotonic() - self.t0 > self.boot_timeout:
            why = f"the guest did not start the command within {self.boot_timeout:g} s"
        else:
            return
        _stop(self.proc)
        self.failures.append(why)
        self.say(f"guest {self.index}: boot failed: {why}")
        if self.attempts_left > 0:
            self.boot()
        else:
            self.proc = None

    def finish(self, grace: float, poll: float) -> str:
        """Wait up to `grace` for it to power off, stop it; one line on how it ended."""
        deadline = time.monotonic() + grace
        while self.proc is not None and self.proc.poll() is None and time.monotonic() < deadline:
            self.tick()
            time.sleep(poll)
        self.started = self.started or (self.proc is not None and (self.job_dir / "started").exists())
        if self.proc is None or not self.started:
            self.stop()
            return f"guest {self.index} never started its command: " + "; ".join(self.failures)
        stopped = self.proc.poll() is None
        _stop(self.proc)
        self.streamer.pump()
        status = _read(self.job_dir / "exit_code").decode().strip() or "none"
        return (f"guest {self.index}: its command exited {status}"
                + (f"; stopped by the host {grace:g} s after the first guest's ended" if stopped else ""))

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


def _job_dir_files(job_dir: Path, script: str, timeout: float, out: bool, init: str, net: str = "") -> None:
    (job_dir / "job.sh").write_text(script)
    (job_dir / "timeout").write_text(f"{int(max(1, round(timeout)))}\n")
    (job_dir / "shares").write_text("out\n" if out else "")
    (job_dir / "init").write_text(f"{init}\n")
    if net:
        (job_dir / "net").write_text(net + "\n")


def run_in_guest(shape: str | Shape, argv: list[str] | tuple[str, ...], timeout: float = 600, *,
                 cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                 out_dir: str | os.PathLike | None = None, boot_timeout: float = 180,
                 boot_attempts: int = 2, stream: bool = False, keep_job_dir: bool = False,
                 image: GuestImage | None = None, cache_dir: Path | None = None,
                 qemu: str | None = None, poll_seconds: float = 0.2,
                 quiet: bool = False) -> GuestResult:
    """Boot `shape`, run `argv` in the guest (cwd and env default to ours), return its result.

    The guest's root is a throw-away writable copy of the host's root, so the repo, its
    .venv and the host's Python are where they are here. `out_dir` (a host directory) is
    mounted read-write in the guest at $NUMA_AGENT_VM_OUT for files that must survive
    the run (reports, logs). `qemu` defaults to $NUMA_AGENT_VM_QEMU or qemu-system-x86_64.
    Raises GuestBootError when `boot_attempts` boots never reached the command, GuestError
    when the guest died while the command ran.

    A shape of two guests boots both, joined by their link (10.0.2.11 and .12): the second
    runs `argv` too, with NUMA_AGENT_VM_GUEST=1 (the first: 0), and its out share is
    `out_dir/guest1`. The result is the first guest's; the second is stopped once it ends.
    """
    shape = get_shape(shape) if isinstance(shape, str) else shape
    qemu = qemu or os.environ.get("NUMA_AGENT_VM_QEMU", "qemu-system-x86_64")
    shape.validate()
    argv = tuple(str(a) for a in argv)
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    if out_dir is not None:
        out_dir = Path(out_dir).resolve()
        if not out_dir.is_dir():
            raise ValueError(f"out_dir {out_dir} is not an existing directory")
    host_env = dict(os.environ if env is None else env)
    script = job_script(argv, cwd, guest_env(host_env, shape, cwd, out_dir is not None))
    say = (lambda m: None) if quiet else progress
    image = image or ensure_guest_image(cache_dir)
    jobs = (cache_dir or default_cache_dir()) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix=f"{shape.name}-", dir=jobs))
    if shape.boots_systemd:
        boot_timeout = max(boot_timeout, SYSTEMD_BOOT_SECONDS)
    # The link's sockets live in a private folder of their own: a unix socket's path is
    # limited to 107 bytes, which a deep cache folder would exceed.
    net_dir = Path(tempfile.mkdtemp(prefix="vmnet-")) if shape.guests > 1 else None
    prefix_len = GUEST_NETWORK.rsplit("/", 1)[1]
    _job_dir_files(job_dir, script, timeout, out_dir is not None, shape.init,
                   f"{guest_mac(0)} {guest_address(0)}/{prefix_len}" if net_dir else "")
    args = qemu_args(shape, kernel=image.vmlinux, initrd=image.initrd, job_dir=job_dir,
                     out_dir=out_dir, qemu=qemu, guest=0, net_dir=net_dir)
    peers: list[_Peer] = []
    for index in range(1, shape.guests):
        assert net_dir is not None
        peer_dir = job_dir.with_name(f"{job_dir.name}-guest{index}")
        peer_dir.mkdir()
        peer_out = None
        if out_dir is not None:
            peer_out = out_dir / f"guest{index}"
            peer_out.mkdir(exist_ok=True)
        _job_dir_files(peer_dir, job_script(argv, cwd, guest_env(host_env, shape, cwd, peer_out is not None, index)),
                       timeout, peer_out is not None, shape.init,
                       f"{guest_mac(index)} {guest_address(index)}/{prefix_len}")
        peers.append(_Peer(index, qemu_args(shape, kernel=image.vmlinux, initrd=image.initrd, job_dir=peer_dir,
                                            out_dir=peer_out, qemu=qemu, guest=index, net_dir=net_dir),
                           peer_dir, net_dir / f"guest{index}.sock", boot_timeout, boot_attempts, stream, say))
    try:
        return _run_booted(shape, argv, timeout, job_dir, args, peers, net_dir, boot_timeout=boot_timeout,
                           boot_attempts=boot_attempts, stream=stream, keep_job_dir=keep_job_dir,
                           poll_seconds=poll_seconds, say=say)
    finally:
        for peer in peers:
            peer.stop()
            if not keep_job_dir:
                shutil.rmtree(peer.job_dir, ignore_errors=True)
        if net_dir is not None:
            shutil.rmtree(net_dir, ignore_errors=True)


def _run_booted(shape: Shape, argv: tuple[str, ...], timeout: float, job_dir: Path, args: list[str],
                peers: list[_Peer], net_dir: Path | None, *, boot_timeout: float, boot_attempts: int,
                stream: bool, keep_job_dir: bool, poll_seconds: float, say) -> GuestResult:
    """Boot the first guest (and the others beside it) and collect its command's result."""
    try:
        for peer in peers:
            peer.boot()
    except GuestError:
        shutil.rmtree(job_dir, ignore_errors=True)  # QEMU never ran: no log worth keeping
        raise

    def tick() -> None:
        for peer in peers:
            peer.tick()
    t0 = time.monotonic()
    failures: list[str] = []
    boot = None
    for attempt in range(1, boot_attempts + 1):
        say(f"booting {shape.name} ({shape.cpus} CPUs, {len(shape.nodes)} NUMA nodes), attempt {attempt}")
        try:
            boot = _boot_once(args, job_dir, boot_timeout, timeout, stream, poll_seconds,
                              lambda seconds: say(f"guest started the command {seconds:.1f} s after boot"),
                              tick, net_dir / "guest0.sock" if net_dir else None)
        except GuestError:
            shutil.rmtree(job_dir, ignore_errors=True)  # QEMU never ran: no log worth keeping
            raise
        if boot.started:
            break
        tail = _tail(job_dir / "console.log")
        failures.append(boot.why)
        say(f"boot attempt {attempt} failed: {boot.why}; last {len(tail)} console lines:")
        for line in tail:
            say(f"  | {line}")
    if boot is None or not boot.started:
        raise GuestBootError(
            f"{shape.name}: the guest never started the command in {boot_attempts} boot(s): "
            + "; ".join(failures) + f" (console and QEMU logs kept in {job_dir})",
            _tail(job_dir / "console.log"), job_dir)
    console_tail = _tail(job_dir / "console.log")
    stdout = _read(job_dir / "stdout")
    stderr = _read(job_dir / "stderr")
    exit_text = _read(job_dir / "exit_code").decode().strip()
    if boot.timed_out:
        exit_code = None
    elif exit_text.lstrip("-").isdigit():
        exit_code = int(exit_text)
    else:
        raise GuestError(f"{shape.name}: the guest stopped while the command ran and wrote no exit "
                         f"status (kernel panic or out of memory?); logs kept in {job_dir}",
                         console_tail, job_dir)
    peer_lines = tuple(peer.finish(PEER_GRACE_SECONDS, poll_seconds) for peer in peers)
    for line in peer_lines:
        say(line)
    total = time.monotonic() - t0
    say(f"guest finished in {total:.1f} s (boot {boot.boot_seconds:.1f} s, command {boot.run_seconds:.1f} s"
        + (f", {len(failures) + 1} boots" if failures else "") + ")")
    if not keep_job_dir:
        shutil.rmtree(job_dir, ignore_errors=True)
    return GuestResult(shape.name, argv, exit_code, boot.timed_out, stdout, stderr,
                       boot.boot_seconds, boot.run_seconds, total, len(failures) + 1,
                       console_tail, job_dir if keep_job_dir else None, peer_lines)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
