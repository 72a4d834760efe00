"""`numa-agent release --slurm-job ID` (what the shipped Epilog runs) and
`numa-agent slurm-node` (slurm.conf's NodeName line agreeing with the agent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numa_agent.cli import release_cmd
from numa_agent.cli.numa_agent import main as numa_agent_main
from tests.cli.test_admin_commands import admit, run

REPO = Path(__file__).resolve().parents[2]
EPILOG = REPO / "contrib" / "slurm" / "epilog"
SKX = REPO / "tests" / "fixtures" / "sysfs" / "intel-skx-2s-ht-2numa-pci-nec-ve.tar.gz"


# ------------------------------------------------------------ release --slurm-job
def test_release_slurm_job_releases_every_workload_of_the_job_and_only_those(server, fake, capsys):
    for name in ("slurm-12-0-0", "slurm-12-0-1", "slurm-12-batch-0", "slurm-120-0-0", "web-1"):
        admit(server, {"name": name, "cpus": 1 if name != "web-1" else 0, "shared": name == "web-1"})
    assert run(release_cmd, ["release", "--slurm-job", "12"], server) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out] == ["slurm-12-0-0", "slurm-12-0-1", "slurm-12-batch-0"]
    assert all(line.startswith("released ") for line in out)
    assert sorted(fake.workloads) == ["slurm-120-0-0", "web-1"]  # job 120 is not job 12


def test_release_slurm_job_with_nothing_to_release_exits_0(server, fake, capsys):
    admit(server, {"name": "slurm-7-0-0", "cpus": 1})
    assert run(release_cmd, ["release", "--slurm-job", "8"], server) == 0
    assert capsys.readouterr().out == "no workloads of Slurm job 8\n"
    assert list(fake.workloads) == ["slurm-7-0-0"]


def test_release_slurm_job_json(server, capsys):
    admit(server, {"name": "slurm-5-0-0", "cpus": 1})
    assert run(release_cmd, ["release", "--slurm-job", "5", "--json"], server) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["slurm_job"] == "5" and [w["name"] for w in doc["released"]] == ["slurm-5-0-0"]


@pytest.mark.parametrize("argv", [["release"], ["release", "x", "--slurm-job", "1"],
                                  ["release", "--slurm-job", "1x"]])
def test_release_needs_one_name_or_a_numeric_job(server, fake, capsys, argv):
    assert run(release_cmd, argv, server) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert "release" not in fake.service_calls()


def test_release_slurm_job_unreachable_exits_1(sock_dir, monkeypatch, capsys):
    monkeypatch.setenv("NUMA_AGENT_SOCKET", f"{sock_dir}/absent.sock")
    monkeypatch.setenv("NUMA_AGENT_RETRY_SECONDS", "0")
    assert run(release_cmd, ["release", "--slurm-job", "3"]) == 1
    assert capsys.readouterr().err.count("\n") == 1


# ------------------------------------------------------------ the Epilog
def _epilog(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The shipped Epilog with a numa-agent that is this checkout's, and slurmd's bare
    environment (no PATH of the caller's)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "numa-agent"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m numa_agent.cli.numa_agent \"$@\"\n")
    shim.chmod(0o755)
    return subprocess.run([str(EPILOG)], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={"NUMA_AGENT_BIN": str(shim), "PYTHONPATH": str(REPO), **env})


def test_epilog_releases_the_job(server, fake, tmp_path):
    admit(server, {"name": "slurm-44-0-0", "cpus": 1})
    done = _epilog({"SLURM_JOB_ID": "44", "NUMA_AGENT_SOCKET": server.socket_path}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "released slurm-44-0-0" in done.stdout
    assert fake.workloads == {}


def test_epilog_exits_0_when_the_agent_is_unreachable_and_says_so(sock_dir, tmp_path):
    done = _epilog({"SLURM_JOB_ID": "44", "NUMA_AGENT_SOCKET": f"{sock_dir}/absent.sock",
                    "NUMA_AGENT_RETRY_SECONDS": "0"}, tmp_path)
    assert done.returncode == 0
    assert "numa-agent epilog: job 44:" in done.stderr and "absent.sock" in done.stderr


def test_epilog_without_a_job_id_exits_0(tmp_path):
    done = _epilog({}, tmp_path)
    assert done.returncode == 0 and "SLURM_JOB_ID" in done.stderr


# ------------------------------------------------------------ slurm-node
def test_slurm_node_takes_the_reserved_cpus_from_the_agents_config(tmp_path, capsys):
    config = tmp_path / "config.toml"
    # The kernel's 0 and 16 are one core's threads; Slurm numbers them 0 and 1.
    config.write_text('[cpu_manager]\nreserved_cpus = "0,16"\n\n'
                      '[[memory_manager.reserved_memory]]\nnuma_node = 0\nmemory = "1Gi"\n')
    assert numa_agent_main(["slurm-node", "--config", str(config), "--sysfs-root", str(SKX),
                            "--node-name", "c1"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("NodeName=c1 CPUs=32 Boards=1 SocketsPerBoard=2 CoresPerSocket=8 ThreadsPerCore=2 ")
    assert line.rstrip().endswith(" CpuSpecList=0-1 MemSpecLimit=1024") and line.count("\n") == 1


def test_slurm_node_default_reservation_is_the_agents_one_cpu(tmp_path, capsys):
    config = tmp_path / "empty.toml"
    config.write_text("")
    assert numa_agent_main(["slurm-node", "--config", str(config), "--sysfs-root", str(SKX),
                            "--node-name", "c1"]) == 0
    out, err = capsys.readouterr()
    fields = dict(item.split("=", 1) for item in out.split())
    assert fields["CpuSpecList"] == "0" and "MemSpecLimit" not in fields
    # CPU 0's core is 0,16: Slurm keeps both, the agent hands out 16
    assert err.startswith("numa-agent slurm-node: note: Slurm keeps whole cores") and "0,16" in err


@pytest.mark.parametrize("config_text,message", [
    ('[cpu_manager]\nreserved_cpus = "200"\n', "configuration does not fit this machine"),
    ('[cpu_manager]\nreserved_cpuz = "1"\n', "reserved_cpuz"),
])
def test_slurm_node_config_errors_are_one_line_exit_1(tmp_path, capsys, config_text, message):
    config = tmp_path / "config.toml"
    config.write_text(config_text)
    assert numa_agent_main(["slurm-node", "--config", str(config), "--sysfs-root", str(SKX)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("numa-agent slurm-node: ") and message in err and err.count("\n") == 1


def test_slurm_node_refuses_an_unevenly_shaped_machine(capsys):
    hybrid = REPO / "tests" / "fixtures" / "sysfs" / "intel-raptorlake-hybrid-1s.tar.gz"
    assert numa_agent_main(["slurm-node", "--config", os.devnull, "--sysfs-root", str(hybrid)]) == 1
    assert "not evenly shaped" in capsys.readouterr().err


# ------------------------------------------------------------ slurm-node --gres, --gres-conf
GRES_CONFIG = ('[devices.gpu]\nvendor = "0x10de"\n\n[devices.nvme]\nclass_prefixes = ["0x0108"]\n\n'
               '[devices.nic]\nclass_prefixes = ["0x0200"]\n')


@pytest.fixture(scope="module")
def gpu_machine(tmp_path_factory, snapshots):
    """The Skylake-SP snapshot (2 x 8 cores x 2 threads, CPU 0's sibling is 16) with two
    NVIDIA GPUs as their driver shows them, an NVMe controller and a NIC."""
    import dataclasses

    from numa_agent.core.topology import PciDevice
    from numa_agent.discovery.sysfs import read_topology
    from tests.support.sysfs_writer import write_sysfs

    tmp = tmp_path_factory.mktemp("gres")
    base = read_topology(snapshots.root(SKX.name.removesuffix(".tar.gz")))

    def dev(address, cls, vendor, node, **kw):
        return PciDevice(address=address, pci_class=cls, vendor=vendor, device="0x20b0", numa_node=node,
                         local_cpus=base.node(node).cpus, **kw)
    devices = (dev("0000:18:00.0", "0x020000", "0x8086", 0, net=("eth0",)),
               dev("0000:3b:00.0", "0x030200", "0x10de", 0, driver="nvidia", nvidia_minor=0),
               dev("0000:5e:00.0", "0x010802", "0x8086", 1, other_children=("nvme/nvme0",), block=("nvme0n1",)),
               dev("0000:d8:00.0", "0x030200", "0x10de", 1, driver="nvidia", nvidia_minor=1))
    root = write_sysfs(dataclasses.replace(base, pci_devices=devices), tmp / "machine")
    config = tmp / "config.toml"
    config.write_text(GRES_CONFIG)
    return root, config


def test_slurm_node_gres_adds_the_counts_to_the_node_line(gpu_machine, capsys):
    root, config = gpu_machine
    assert numa_agent_main(["slurm-node", "--gres", "--config", str(config), "--sysfs-root", str(root),
                            "--node-name", "c1"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and out.startswith("NodeName=c1 CPUs=32 ")
    assert out.rstrip().endswith(" CpuSpecList=0 Gres=gpu:2,nic:1,nvme:1")
    assert "GresTypes=gpu,nic,nvme" in err and "--gres-conf" in err


def test_slurm_node_gres_conf_prints_one_line_per_device(gpu_machine, capsys):
    root, config = gpu_machine
    assert numa_agent_main(["slurm-node", "--gres-conf", "--config", str(config), "--sysfs-root", str(root),
                            "--node-name", "c1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "NodeName=c1 Name=gpu File=/dev/nvidia0 Cores=0-7",
        "NodeName=c1 Name=gpu File=/dev/nvidia1 Cores=8-15",
        "NodeName=c1 Name=nic Count=1 Cores=0-7",
        "NodeName=c1 Name=nvme File=/dev/nvme0 Cores=8-15",
    ]
    assert err == ""


@pytest.mark.parametrize("flag", ["--gres", "--gres-conf"])
@pytest.mark.parametrize("config_text, message", [
    ("", "the configuration has no [devices] resources"),
    ('[devices.fpga]\nclass_prefixes = ["0x1200"]\n', "the [devices] resources (fpga) select no device"),
])
def test_slurm_node_gres_without_devices_is_one_line_exit_1(tmp_path, capsys, flag, config_text, message):
    config = tmp_path / "config.toml"
    config.write_text(config_text)
    assert numa_agent_main(["slurm-node", flag, "--config", str(config), "--sysfs-root", str(SKX)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err
    assert err.startswith("numa-agent slurm-node: no device resources to give Slurm: ")
