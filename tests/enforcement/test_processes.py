"""Process identity: a PID plus what a recycled PID cannot repeat."""

import os
import subprocess

import pytest

from numa_agent.enforcement.processes import (
    CAPABILITIES,
    capability_set,
    exited_among,
    missing_capabilities,
    pidfd_alive,
    pidfd_exited,
    process_identity,
)


def test_identity_is_stable_for_a_process_and_differs_for_another():
    a = subprocess.Popen(["sleep", "30"])
    b = subprocess.Popen(["sleep", "30"])
    try:
        ident = process_identity(a.pid)
        assert ident is not None and ident == process_identity(a.pid)
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        assert ident.startswith(boot + ":")
        assert process_identity(os.getpid()) != ident
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    assert process_identity(a.pid) is None or process_identity(a.pid) != ident


def test_identity_reads_the_start_time_after_a_hostile_command_name(tmp_path):
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("b00t\n")
    rest = " ".join(["S"] + [str(i) for i in range(4, 22)] + ["987654"] + ["0"] * 30)
    (proc / "4242" / "stat").write_text(f"4242 (evil) 1 2 3) {rest}\n")
    assert process_identity(4242, str(proc)) == "b00t:987654"
    assert process_identity(4243, str(proc)) is None


def test_capability_masks_are_read_by_name():
    status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000800001\nCapBnd:\t0000020000000005\n"
    assert capability_set(status) == {"CAP_CHOWN", "CAP_SYS_NICE"}
    assert capability_set(status, "CapBnd") == {"CAP_CHOWN", "CAP_DAC_READ_SEARCH", "cap_41"}
    assert capability_set(status, "CapInh") == frozenset()
    assert capability_set(status, "CapAmb") is None
    assert capability_set("CapEff:\t000001ffffffffff\n") == set(CAPABILITIES)


def test_missing_capabilities_reads_the_effective_set():
    status = "Name:\tx\nCapEff:\t0000000000800001\nCapBnd:\t000001ffffffffff\n"
    wanted = ("CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE", "CAP_SYS_NICE")
    assert missing_capabilities(status, wanted) == ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"]
    assert missing_capabilities("CapEff:\t000001ffffffffff\n", wanted) == []
    assert missing_capabilities("Name:\tx\n", wanted) == list(wanted)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a check as another user")
def test_pidfd_alive_for_another_users_process_without_the_right_to_signal_it():
    # The unit grants no CAP_KILL: signal 0 to a caller of another uid fails with EPERM,
    # which must read as alive; only ESRCH means the process is gone.
    target = subprocess.Popen(["sleep", "30"])
    fd = os.pidfd_open(target.pid)
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit status
            try:
                os.setresuid(65534, 65534, 65534)  # no capabilities left, root's process not ours
                os._exit(0 if pidfd_alive(fd) else 1)
            finally:
                os._exit(2)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        target.kill()
        target.wait()
        assert not pidfd_alive(fd)
    finally:
        os.close(fd)
        if target.poll() is None:
            target.kill()
            target.wait()


def test_one_poll_tells_the_exited_among_live_and_zombie_processes():
    live = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    fds = {os.pidfd_open(live.pid): live, os.pidfd_open(gone.pid): gone}
    try:
        os.waitid(os.P_PID, gone.pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
        exited = exited_among(fds)
        assert [fds[fd] for fd in exited] == [gone]
        assert [pidfd_exited(fd) for fd in fds] == [False, True]
    finally:
        live.kill()
        for proc in (live, gone):
            proc.wait()
        for fd in fds:
            os.close(fd)
