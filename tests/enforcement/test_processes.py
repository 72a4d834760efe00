"""Process identity: a PID plus what a recycled PID cannot repeat."""

import os
import subprocess

from numa_agent.enforcement.processes import process_identity


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
