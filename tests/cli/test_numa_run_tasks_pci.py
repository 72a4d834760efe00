"""numa-run --tasks N --device gpu=1 --device nic=1 against the real agent on a written
machine whose NUMA node 0 has two GPUs and two NICs under two PCIe host bridges: each
rank's NIC is the one under its GPU's host bridge (GPUDirect RDMA), as GET /v1/topology
tells where each device sits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from numa_agent.core.topology import PciDevice
from tests.support.agent_process import DEVICES_CONFIG, AgentProcess
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

REPO = Path(__file__).resolve().parents[2]
CONFIG = '[topology_manager]\npolicy = "best-effort"\n' + DEVICES_CONFIG
ROOT_A = ("pci0000:00", "0000:00:01.0")
ROOT_B = ("pci0000:80", "0000:80:01.0")


def device(address: str, cls: str, vendor: str, path: tuple[str, ...]) -> PciDevice:
    return PciDevice(address=address, pci_class=cls, vendor=vendor, device="0x0001", numa_node=0,
                     driver="nvidia" if vendor == "0x10de" else "mlx5_core", pci_path=path)


# The addresses in no order of their roots: by address alone rank 0 would get GPU 01 (A)
# and NIC 03 (B).
DEVICES = (device("0000:01:00.0", "0x030200", "0x10de", ROOT_A),
           device("0000:02:00.0", "0x030200", "0x10de", ROOT_B),
           device("0000:03:00.0", "0x020000", "0x15b3", ROOT_B),
           device("0000:04:00.0", "0x020000", "0x15b3", ROOT_A))


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    work = tmp_path_factory.mktemp("tasks-pci-agent")
    topo = make_topology(sockets=2, nodes_per_socket=1, cores_per_node=4, threads_per_core=1,
                         memory_per_node_bytes=8 << 30, devices=DEVICES)
    a = AgentProcess(work, "--sysfs-root", str(write_sysfs(topo, work / "machine")), config=CONFIG).start()
    yield a
    a.stop()


def test_each_rank_gets_the_nic_under_its_gpus_host_bridge(agent, tmp_path):
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                          "--tasks", "2", "--device", "gpu=1", "--device", "nic=1", "--",
                          "sh", "-c", 'echo "$NUMA_AGENT_DEVICES $NUMA_AGENT_MEMS" > "$0/$NUMA_RUN_TASK"',
                          str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    code, topology = agent.call("GET", "/v1/topology")
    assert code == 200
    root_of = {d["address"]: d["pci_root"] for d in topology["pci_devices"]}
    ranks = {int(p.name): p.read_text().split() for p in tmp_path.iterdir()}
    assert sorted(ranks) == [0, 1]
    seen = []
    for rank, (devices, mems) in sorted(ranks.items()):
        gpu, nic = sorted(devices.split(","))
        assert mems == "0"  # block: both ranks on node 0, which has the devices
        assert root_of[gpu] == root_of[nic], (rank, gpu, nic)
        seen.append((gpu, nic))
    assert seen == [("0000:01:00.0", "0000:04:00.0"), ("0000:02:00.0", "0000:03:00.0")]
