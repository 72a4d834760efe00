"""Boot control (markers, retries, timeouts, results, CLI statuses) against a fake QEMU that
runs the real job script on this host; no guest is booted."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from vmharness import boot
from vmharness.__main__ import main
from vmharness.boot import GuestBootError, GuestError, guest_env, job_script, run_in_guest
from vmharness.build import GuestImage
from vmharness.shapes import SHAPES

FAKE = Path(__file__).with_name("fake_qemu.py")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """-> set_modes(*modes); run_in_guest keyword arguments that use the fake QEMU."""
    qemu = tmp_path / "qemu"
    qemu.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    qemu.chmod(0o755)
    image = GuestImage("test", tmp_path / "vmlinux", tmp_path / "initrd")
    monkeypatch.setattr(boot, "ensure_guest_image", lambda cache=None: image)
    monkeypatch.setenv("NUMA_AGENT_VM_QEMU", str(qemu))
    monkeypatch.setenv("NUMA_AGENT_VM_CACHE", str(tmp_path / "cache"))
    return lambda *modes: monkeypatch.setenv("FAKE_QEMU_MODES", ",".join(modes))


def jobs_left(tmp_path):
    return list((tmp_path / "cache" / "jobs").iterdir())


def test_command_runs_with_our_cwd_and_env_and_its_status_comes_back(fake, tmp_path, monkeypatch):
    fake("ok")
    monkeypatch.setenv("SOME_SETTING", "a b'c")
    monkeypatch.setenv("NUMA_AGENT_VM", "1")
    result = run_in_guest("2node", ["sh", "-c", 'pwd; echo "$SOME_SETTING|${NUMA_AGENT_VM-unset}|'
                                    '$NUMA_AGENT_IN_VM|$NUMA_AGENT_VM_SHAPE"; echo oops >&2; exit 7'],
                          timeout=30, cwd=tmp_path, quiet=True)
    assert result.exit_code == 7 and result.returncode == 7 and not result.timed_out and not result.ok
    assert result.stdout.decode().splitlines() == [str(tmp_path), "a b'c|unset|1|2node"]
    assert result.stderr == b"oops\n"
    assert result.attempts == 1 and result.argv[0] == "sh"
    assert "fake: mode ok" in result.console_tail
    assert jobs_left(tmp_path) == []  # job folder removed unless kept


def test_a_hung_boot_is_reported_with_its_console_and_booted_again(fake, tmp_path, capsys):
    fake("hang", "ok")
    result = run_in_guest("4node", ["true"], timeout=30, boot_timeout=2, keep_job_dir=True)
    assert result.ok and result.attempts == 2
    err = capsys.readouterr().err
    assert "boot attempt 1 failed: the guest did not start the command within 2 s" in err
    assert "  | fake kernel boot 1" in err
    assert result.job_dir is not None and (result.job_dir / "console.log").exists()


def test_two_hung_boots_raise_a_boot_error_that_keeps_the_logs(fake, tmp_path):
    fake("hang", "hang")
    with pytest.raises(GuestBootError, match=r"2node: the guest never started the command in 2 boot\(s\): "
                                             r"the guest did not start the command within 2 s; ") as info:
        run_in_guest("2node", ["true"], timeout=30, boot_timeout=2, quiet=True)
    assert info.value.console_tail == ("fake kernel boot 2", "fake: mode hang", "fake: init chroot")
    assert (info.value.job_dir / "job.sh").exists()


def test_qemu_refusing_to_start_is_quoted(fake):
    fake("exit", "exit")
    with pytest.raises(GuestBootError, match=r"QEMU exited with status 1 before the command started "
                                             r"\(QEMU: qemu-system-x86_64: -device nvme: fake refusal\)"):
        run_in_guest("2node", ["true"], timeout=30, quiet=True)


def test_a_command_over_its_timeout_is_killed_and_reported(fake):
    fake("ok")
    result = run_in_guest("2node", ["sh", "-c", "echo before; exec sleep 30"], timeout=1, quiet=True)
    assert result.timed_out and result.exit_code is None and result.returncode == 124
    assert result.stdout == b"before\n"


def test_a_guest_that_never_powers_off_is_stopped_by_the_host(fake, monkeypatch):
    fake("stuck")
    monkeypatch.setattr(boot, "HOST_GRACE_SECONDS", 0.5)
    result = run_in_guest("2node", ["true"], timeout=1, quiet=True)
    assert result.timed_out and result.returncode == 124


def test_a_guest_that_dies_mid_command_is_not_mistaken_for_a_result(fake):
    fake("die")
    with pytest.raises(GuestError, match="the guest stopped while the command ran and wrote no exit status"):
        run_in_guest("2node", ["true"], timeout=30, quiet=True)


def test_output_is_streamed_while_the_command_runs(fake, capfd):
    fake("ok")
    result = run_in_guest("2node", ["sh", "-c", "echo to-out; echo to-err >&2"], timeout=30, stream=True,
                          quiet=True)
    captured = capfd.readouterr()
    assert captured.out == "to-out\n" and captured.err == "to-err\n"
    assert result.stdout == b"to-out\n"


@pytest.mark.parametrize("kwargs, message", [
    (dict(argv=[]), "no command given to run in the guest"),
    (dict(argv=["A=B", "x"]), r"the command name 'A=B' contains '='"),
    (dict(argv=["true"], timeout=0), "timeout must be positive, got 0"),
    (dict(argv=["true"], out_dir="/nonexistent/out"), "out_dir /nonexistent/out is not an existing directory"),
])
def test_bad_requests_are_refused_before_booting(fake, kwargs, message):
    fake("exit")
    with pytest.raises(ValueError, match=message):
        run_in_guest("2node", **kwargs, quiet=True)


def test_guest_env_drops_the_opt_in_switch_and_names_the_out_share():
    env = guest_env({"PATH": "/usr/bin", "NUMA_AGENT_VM": "1", "BAD NAME": "x", "OLDPWD": "/"},
                    SHAPES["cpuless"], "/work", with_out=True)
    assert env == {"PATH": "/usr/bin", "PWD": "/work", "NUMA_AGENT_IN_VM": "1",
                   "NUMA_AGENT_VM_SHAPE": "cpuless", "NUMA_AGENT_VM_OUT": "/run/vmharness/out",
                   "NUMA_AGENT_VM_JOB": "/run/vmharness/job"}


def test_job_script_quotes_every_word(tmp_path):
    script = job_script(["printf", "%s|", "it's", "$HOME", "a b"], str(tmp_path), {"PATH": os.environ["PATH"]})
    (tmp_path / "job.sh").write_text(script)
    out = subprocess.run(["/bin/sh", str(tmp_path / "job.sh")], capture_output=True, text=True, check=True)
    assert out.stdout == "it's|$HOME|a b|"


def test_job_script_reports_a_missing_working_directory(tmp_path):
    (tmp_path / "job.sh").write_text(job_script(["true"], str(tmp_path / "gone"), {}))
    out = subprocess.run(["/bin/sh", str(tmp_path / "job.sh")], capture_output=True, text=True)
    assert out.returncode == 125
    assert f"vmharness: cannot enter {tmp_path / 'gone'} in the guest" in out.stderr


def test_cli_exit_statuses(fake, capsys):
    fake("ok")
    assert main(["run", "--quiet", "--shape", "4node", "--", "sh", "-c", "exit 5"]) == 5
    fake("ok")
    assert main(["run", "--quiet", "--timeout", "1", "--", "sleep", "30"]) == 124
    assert "did not finish within 1 s in the 2node guest and was killed (exit 124)" in capsys.readouterr().err
    fake("hang", "hang")
    assert main(["run", "--quiet", "--boot-timeout", "0.5", "--", "true"]) == 3
    assert "the guest never started the command in 2 boot(s)" in capsys.readouterr().err
    assert main(["run", "--shape", "big", "--", "true"]) == 2
    assert "unknown machine shape 'big'" in capsys.readouterr().err


def test_a_missing_qemu_binary_is_a_guest_error(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("NUMA_AGENT_VM_QEMU", "/nonexistent/qemu-system-x86_64")
    with pytest.raises(GuestError, match="cannot start /nonexistent/qemu-system-x86_64: "):
        run_in_guest("2node", ["true"], timeout=30, quiet=True)
    assert jobs_left(tmp_path) == []


def test_the_systemd_shape_asks_the_guest_for_systemd_and_names_its_out_share(fake, tmp_path):
    fake("ok")
    out = tmp_path / "out"
    out.mkdir()
    result = run_in_guest("systemd", ["sh", "-c", 'echo "$NUMA_AGENT_VM_OUT"'], timeout=30,
                          cwd=tmp_path, out_dir=out, quiet=True)
    assert result.ok
    assert "fake: init systemd" in result.console_tail
    # systemd mounts /run afresh, so the share cannot live below it
    assert result.stdout.decode().strip() == "/vmharness/out"
    chroot = run_in_guest("2node", ["true"], timeout=30, cwd=tmp_path, quiet=True)
    assert "fake: init chroot" in chroot.console_tail


def test_a_two_guest_shape_boots_both_and_tells_each_which_it_is(fake, tmp_path):
    fake("ok")
    out = tmp_path / "out"
    out.mkdir()
    script = 'echo "$NUMA_AGENT_VM_GUEST|$NUMA_AGENT_VM_ADDRESSES|$NUMA_AGENT_VM_SHAPE|${NUMA_AGENT_VM_OUT-none}"'
    result = run_in_guest("slurm2", ["sh", "-c", script], timeout=30, cwd=tmp_path, out_dir=out,
                          keep_job_dir=True, quiet=True)
    # The result is the first guest's; the second ran the same command with its own index
    # and out share (a folder of the first one's).
    assert result.ok and result.stdout.decode() == "0|10.0.2.11 10.0.2.12|slurm2|/run/vmharness/out\n"
    second = result.job_dir.with_name(result.job_dir.name + "-guest1")
    assert (second / "stdout").read_text() == "1|10.0.2.11 10.0.2.12|slurm2|/run/vmharness/out\n"
    assert (out / "guest1").is_dir() and (second / "shares").read_text() == "out\n"
    # what each guest's init gives its end of the link (found by MAC)
    assert (result.job_dir / "net").read_text() == "52:54:00:00:02:0b 10.0.2.11/24\n"
    assert (second / "net").read_text() == "52:54:00:00:02:0c 10.0.2.12/24\n"
    assert result.peers == ("guest 1: its command exited 0",)
    one = run_in_guest("2node", ["sh", "-c", script], timeout=30, cwd=tmp_path, keep_job_dir=True, quiet=True)
    assert one.stdout.decode() == "||2node|none\n" and not (one.job_dir / "net").exists() and one.peers == ()


def test_a_second_guest_whose_boot_hangs_is_booted_again_and_one_that_never_ends_is_stopped(
        fake, tmp_path, monkeypatch, capsys):
    fake("hang", "ok")  # per guest: its first boot hangs
    monkeypatch.setattr(boot, "PEER_GRACE_SECONDS", 0.5)
    result = run_in_guest("slurm2", ["sh", "-c", '[ "$NUMA_AGENT_VM_GUEST" = 0 ] || exec sleep 5'], timeout=30,
                          cwd=tmp_path, boot_timeout=2, quiet=False)
    assert result.ok and result.attempts == 2
    err = capsys.readouterr().err
    assert "guest 1: boot failed: the guest did not start the command within 2 s" in err
    assert "guest 1 started its command" in err
    assert result.peers == ("guest 1: its command exited none; stopped by the host 0.5 s after the first "
                            "guest's ended",)
    assert jobs_left(tmp_path) == []  # both job folders removed


def test_a_second_guest_that_never_boots_is_named_in_the_result(fake, tmp_path, monkeypatch):
    fake("ok")
    monkeypatch.setenv("FAKE_QEMU_PEER_MODES", "hang")
    result = run_in_guest("slurm2", ["sh", "-c", "sleep 4"], timeout=30, cwd=tmp_path, boot_timeout=2,
                          boot_attempts=1, quiet=True)
    assert result.ok
    assert result.peers == ("guest 1 never started its command: the guest did not start the command within 2 s",)
