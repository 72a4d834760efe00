"""`--sysfs-root` takes a snapshot archive as it is (extracted safely into a
private directory removed at exit), and a snapshot of another machine is not
enforced for real with `--cgroup-root none`."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile

import pytest

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import StartupError, choose_enforcer
from numa_agent.service.snapshot import SnapshotError, extract_snapshot
from tests.conftest import FIXTURES
from tests.support.agent_process import AgentProcess, numa_run
from tests.support.synthetic import make_topology

ARCHIVE = FIXTURES / "sysfs" / "intel-snb-2s-2numa-pci-nvme-nic.tar.gz"


def serve(tmp_path, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
                           "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "s.sock"),
                           "--metrics-address", "", "--no-hotplug", *args],
                          capture_output=True, text=True, timeout=timeout)


def error_line(result, code=1):
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("numa-agent:")]
    assert lines, result.stderr
    return lines[-1]


def test_the_agent_serves_a_snapshot_archive_and_removes_its_extraction(tmp_path):
    agent = AgentProcess(tmp_path / "agent", "--sysfs-root", str(ARCHIVE)).start()
    try:
        code, status = agent.call("GET", "/v1/status")
        assert code == 200 and status["enforcement"] == "simulated"
        assert [n["id"] for n in status["nodes"]] == [0, 1]
        # health names the archive, not its temporary extraction: `topology` shows it
        assert agent.call("GET", "/v1/health")[1]["sysfs_root"] == os.path.abspath(ARCHIVE)
        run = numa_run(agent.socket, "--cpus", "2", "--", "true")
        assert run.returncode == 0, run.stderr
    finally:
        assert agent.stop() == 0
    found = re.search(r"extracted to (\S+)", agent.log())
    assert found, agent.log()
    assert not os.path.exists(found.group(1))


def _archive(path, *members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name, kind, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


@pytest.mark.parametrize("member, says", [
    (_file("/etc/evil"), "unsafe path '/etc/evil'"),
    (_file("snap/../../evil"), "unsafe path"),
    (_special("snap/sys/null", tarfile.CHRTYPE), "not a file, directory or symlink"),
    (_special("snap/sys/fifo", tarfile.FIFOTYPE), "not a file, directory or symlink"),
    (_special("snap/sys/hard", tarfile.LNKTYPE, "snap/sys/x"), "not a file, directory or symlink"),
    (_special("snap/sys/out", tarfile.SYMTYPE, "../../../etc"), "leads outside"),
    (_special("snap/sys/abs", tarfile.SYMTYPE, "/etc/passwd"), "leads outside"),
])
def test_unsafe_members_refuse_the_whole_archive(tmp_path, member, says):
    archive = _archive(tmp_path / "bad.tar.gz", _file("snap/sys/x"), member)
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    with pytest.raises(SnapshotError, match=re.escape(says)):
        extract_snapshot(str(archive))
    after = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    assert not [n for n in after - before if n.startswith("numa-agent-snapshot-")]


def test_symlinks_inside_the_snapshot_are_kept(tmp_path):
    archive = _archive(tmp_path / "ok.tgz", _file("snap/sys/devices/a"),
                       _special("snap/sys/bus/a", tarfile.SYMTYPE, "../devices/a"))
    scratch, root = extract_snapshot(str(archive))
    try:
        assert root == scratch / "snap"
        assert os.readlink(root / "sys/bus/a") == "../devices/a"
        assert (root / "sys/bus/a").read_bytes() == b"x"
    finally:
        import shutil
        shutil.rmtree(scratch)


def test_a_damaged_or_missing_archive_is_one_clear_line(tmp_path):
    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(ARCHIVE.read_bytes()[:5000])
    line = error_line(serve(tmp_path, "--sysfs-root", str(damaged)))
    assert f"sysfs snapshot {damaged} is not a readable tar archive" in line
    line = error_line(serve(tmp_path, "--sysfs-root", str(tmp_path / "nope.tar.gz")))
    assert f"sysfs snapshot {tmp_path / 'nope.tar.gz'} does not exist" in line
    no_sys = _archive(tmp_path / "empty.tar", _file("README"))
    assert "has no sys/ directory" in error_line(serve(tmp_path, "--sysfs-root", str(no_sys)))


def test_affinity_mode_refuses_a_snapshot_with_cpus_this_machine_lacks(tmp_path):
    big = build_machine(make_topology(sockets=2, cores_per_node=len(os.sched_getaffinity(0)) + 8,
                                      threads_per_core=1, memory_per_node_bytes=1 << 30), PolicyConfig())
    cfg = AgentConfig(sysfs_root=str(tmp_path / "snapshot"), cgroup_root="none",
                      state_dir=str(tmp_path / "state"))
    with pytest.raises(StartupError, match="Drop --cgroup-root none: with --sysfs-root the agent "
                                           "enforces into a simulated cgroup tree by default"):
        choose_enforcer(cfg, big)


def test_affinity_mode_refusal_through_serve(tmp_path):
    from numa_agent.discovery.sysfs import read_topology

    scratch, root = extract_snapshot(str(ARCHIVE))
    try:
        snapshot_cpus = set(read_topology(str(root)).usable_cpus.ids())
    finally:
        import shutil
        shutil.rmtree(scratch)
    if snapshot_cpus <= os.sched_getaffinity(0):
        pytest.skip("this machine has every CPU of the snapshot")
    # exit 78: the flags cannot work together, whenever the agent is restarted
    line = error_line(serve(tmp_path, "--sysfs-root", str(ARCHIVE), "--cgroup-root", "none"), code=78)
    assert "is not this machine" in line and "Drop --cgroup-root none" in line
