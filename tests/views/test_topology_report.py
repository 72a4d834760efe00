"""`numa-agent topology` and its JSON/text views."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from numa_agent.cli.numa_agent import main
from numa_agent.core.cpuset import CpuSet
from numa_agent.core.units import format_bytes as size_text  # the one size formatter
from numa_agent.views.topology_report import render_text, topology_to_json
from tests.support.synthetic import make_topology

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"


def _sized(text: str) -> str:
    """"L3 (<32768K>)" -> "L3 (32.0 MiB)", in whatever form the view writes sizes."""
    return re.sub(r"<(\d+)K>", lambda m: size_text(int(m.group(1)) << 10), text)


@pytest.mark.parametrize("name", ["intel-skx-2s-ht-2numa-pci-nec-ve", "power9-2s-smt4-gpu-numa-nodes"])
def test_json_output_matches_expected_node_cpulists(snapshot, capsys, name):
    root, exp = snapshot(name)
    assert main(["topology", "--sysfs-root", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {str(n["id"]): n["cpus"] for n in out["numa_nodes"]}
    assert got == {k: v["cpulist"] for k, v in exp["numa"]["nodes"].items()}
    assert [d["address"] for d in out["pci_devices"]] == sorted(d["bdf"] for d in exp["pci"]["devices"])
    online = {c["id"] for c in out["cpus"] if c["online"]}
    assert CpuSet(online) == CpuSet.parse(exp["online_cpus"])


def test_power9_gpu_memory_nodes_are_memory_only_in_json_and_text(snapshot, capsys):
    root, _ = snapshot("power9-2s-smt4-gpu-numa-nodes")
    assert main(["topology", "--sysfs-root", str(root), "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["numa_nodes"]
    assert {n["id"]: n["kind"] for n in nodes} == {0: "cpu", 8: "cpu", 250: "memory-only", 251: "memory-only",
                                                    252: "memory-only", 253: "memory-only",
                                                    254: "memory-only", 255: "memory-only"}
    assert nodes[2]["distances"]["0"] == 80
    text = _topology_text(capsys, root)
    assert "\nNUMA node 250 (memory-only): cpus (none), memory 15 GiB" in text
    assert "\nNUMA node 0: cpus " in text


@pytest.mark.parametrize("name", ["intel-snb-2s-2numa-pci-nvme-nic", "intel-haswell-2s-offline-cpus-node0"])
def test_text_output(snapshot, capsys, name):
    root, exp = snapshot(name)
    assert main(["topology", "--sysfs-root", str(root)]) == 0
    out = capsys.readouterr().out
    ids = exp["numa"]["node_ids"]
    assert out.startswith(f"available: {len(ids)} nodes (")
    for node_id, facts in exp["numa"]["nodes"].items():
        listed = " ".join(str(c) for c in CpuSet.parse(facts["cpulist"]))
        assert f"node {node_id} cpus: {listed}\n" in out
        assert f"node {node_id} size: {facts['MemTotal_bytes'] >> 20} MB\n" in out
    assert "node distances:" in out


def _topology_text(capsys, root, *options) -> str:
    assert main(["topology", "--sysfs-root", str(root), *options]) == 0
    return capsys.readouterr().out


# A tiny pci.ids: the NVMe SSD and the i350's vendor, device and class, the
# Mellanox vendor without its device.
PCI_IDS = """\
8086  Intel Corporation
\t0953  PCIe Data Center SSD
\t1521  I350 Gigabit Network Connection
15b3  Mellanox Technologies
C 01  Mass storage controller
\t08  Non-Volatile memory controller
C 02  Network controller
\t00  Ethernet controller
"""


@pytest.fixture
def pci_ids(tmp_path):
    path = tmp_path / "pci.ids"
    path.write_text(PCI_IDS)
    return str(path)


def test_text_shows_the_devices_work_is_placed_by_and_counts_the_rest(snapshot, capsys, tmp_path):
    root, exp = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    out = _topology_text(capsys, root, "--pci-ids", str(tmp_path / "none.ids"))
    shown = ("0000:00:02.0", "0000:00:1f.2", "0000:02:00.0", "0000:02:00.3", "0000:05:00.0",
             "0000:82:00.0", "0000:83:00.0")  # NVMe, SATA, 2 NICs, VGA, IB, Xeon Phi
    assert f"({len(exp['pci']['devices']) - len(shown)} other PCI devices not shown: bridges, uncore, " \
           "DMA engines, USB, ...; --all-devices lists them)" in out
    for address in shown:
        assert address in out
    assert "0000:00:01.0" not in out  # a 0x060400 root port
    assert "0000:00:04.0" not in out  # an ioatdma engine
    assert ("    0000:00:02.0  nvme0n1  class 0x010802 [8086:0953]  driver nvme  host bridge pci0000:00"
            "  (node from local_cpulist)\n") in out
    assert "    0000:02:00.0  eth0  class 0x020000 [8086:1521]  driver igb  host bridge pci0000:00\n" in out
    assert ("    0000:82:00.0  ib0,mlx4_0  class 0x028000 [15b3:1003]  driver mlx4_core"
            "  host bridge pci0000:80\n") in out
    assert "    0000:83:00.0  mic0  class 0x0b4000 [8086:225c]  driver mic  host bridge pci0000:80\n" in out


def test_text_names_devices_from_pci_ids(snapshot, capsys, pci_ids):
    root, _ = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    out = _topology_text(capsys, root, "--pci-ids", pci_ids)
    assert ("    0000:00:02.0  nvme0n1  Non-Volatile memory controller: Intel Corporation "
            "PCIe Data Center SSD [8086:0953]  driver nvme  host bridge pci0000:00  (node from local_cpulist)\n") in out
    assert ("    0000:02:00.0  eth0  Ethernet controller: Intel Corporation "
            "I350 Gigabit Network Connection [8086:1521]  driver igb  host bridge pci0000:00\n") in out
    # The vendor is known, the device and the subclass are not.
    assert ("    0000:82:00.0  ib0,mlx4_0  Network controller: Mellanox Technologies device 1003 [15b3:1003]"
            "  driver mlx4_core  host bridge pci0000:80\n") in out


def test_all_devices_lists_bridges_and_dma_engines(snapshot, capsys, tmp_path):
    root, exp = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    out = _topology_text(capsys, root, "--all-devices", "--pci-ids", str(tmp_path / "none.ids"))
    for device in exp["pci"]["devices"]:
        assert device["bdf"] + "  " in out
    assert "    0000:00:04.0  class 0x088000 [8086:3c20]  driver ioatdma  host bridge pci0000:00\n" in out
    assert "not shown" not in out


def test_numactl_block_is_unchanged_by_caches_and_devices(snapshot, capsys, tmp_path, pci_ids):
    root, _ = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    plain = _topology_text(capsys, root, "--pci-ids", str(tmp_path / "none.ids")).split("\n\n")[0]
    named = _topology_text(capsys, root, "--all-devices", "--pci-ids", pci_ids).split("\n\n")[0]
    assert plain == named
    assert plain.splitlines()[0] == "available: 2 nodes (0-1)"
    assert plain.splitlines()[-3:] == ["node   0   1", "  0:  10  21", "  1:  21  10"]


@pytest.mark.parametrize("name, lines", [
    ("intel-clx-2s-ht-snc2-4numa", [  # SNC: the package's L3 seen from each of its nodes
        "      L3 0 (<28160K>): cpus 0,4,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64,68,72,76",
        "        L2 (<1024K>) + L1d (<32K>) + core 0: threads 0,40",
        "      L3 0 (<28160K>): cpus 2,6,10,14,18,22,26,30,34,38,42,46,50,54,58,62,66,70,74,78"]),
    ("amd-magnycours-4s-8numa-sparse-ids", [
        "    L3 0 (<5118K>): cpus 0-5",
        "      L2 (<512K>) + L1d (<64K>) + core 0: threads 0"]),
    ("arm64-kunpeng920-2s-4numa-clusters", [
        "    L3 0 (<32768K>): cpus 0-31",
        "      cluster 138: cpus 0-3",
        "        L2 (<512K>) + L1d (<64K>) + core 0: threads 0"]),
    ("intel-raptorlake-hybrid-1s", [  # P-cores with their own L2, E-cores sharing one per four
        "          L2 (<1280K>) + L1d (<48K>) + core 0: threads 0-1",
        "          L2 12 (<2048K>): cpus 12-15",
        "            L1d (<32K>) + core 12: threads 12"]),
    ("power9-2s-smt4-gpu-numa-nodes", [  # an L2 over two SMT4 cores
        "      L2 0 (<512K>): cpus 0-7",
        "        L1d (<32K>) + core 0: threads 0-3"]),
])
def test_text_shows_caches_lstopo_style(snapshot, capsys, tmp_path, name, lines):
    root, _ = snapshot(name)
    out = _topology_text(capsys, root, "--pci-ids", str(tmp_path / "none.ids")).splitlines()
    for line in lines:
        assert _sized(line) in out


def test_text_without_cache_information(snapshot, capsys, tmp_path):
    root, _ = snapshot("ia64-superdome-64s-17numa-cpuless")
    out = _topology_text(capsys, root, "--pci-ids", str(tmp_path / "none.ids"))
    assert "L1d" not in out and "L3" not in out
    assert "\n  package 0: cpus 0-1\n    core 0: threads 0\n    core 1: threads 1\n" in out


def test_a_snapshot_archive_is_read_as_serve_reads_it(snapshot, capsys):
    # The README's --sysfs-root takes the .tar.gz for scripts/agent; topology takes the same.
    root, _ = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    archive = FIXTURES / "intel-snb-2s-2numa-pci-nvme-nic.tar.gz"
    assert main(["topology", "--sysfs-root", str(archive), "--json"]) == 0
    from_archive = capsys.readouterr().out
    assert main(["topology", "--sysfs-root", str(root), "--json"]) == 0
    assert from_archive == capsys.readouterr().out
    assert main(["topology", "--sysfs-root", str(FIXTURES / "missing.tar.gz")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"numa-agent topology: sysfs snapshot {FIXTURES / 'missing.tar.gz'} does not exist")


def test_bad_root_is_one_line_on_stderr(tmp_path, capsys):
    assert main(["topology", "--sysfs-root", str(tmp_path / "nowhere")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("numa-agent topology: ") and "sys/devices/system/cpu: not found" in lines[0]
    assert "Traceback" not in captured.err


def test_json_keys_follow_the_design_contract():
    topo = make_topology(hugepages_2m_per_node=8, devices=[("0x030200", "0x10de", "0x20b0", 1, "nvidia")])
    out = topology_to_json(topo)
    node = out["numa_nodes"][0]
    assert node == {"id": 0, "cpus": "0-3,8-11", "online_cpus": "0-3,8-11",
                    "memory_total_bytes": 64 << 30, "memory_free_bytes": (64 << 30) - 16 * (1 << 20),
                    "hugepages": {"2048kB": {"total": 8, "free": 8, "surplus": 0},
                                  "1048576kB": {"total": 0, "free": 0, "surplus": 0}},
                    "distances": {"0": 10, "1": 21}, "kind": "cpu"}
    assert out["cpus"][0] == {"id": 0, "online": True, "package": 0, "die": 0, "cluster": None, "core_id": 0,
                              "core": 0, "numa_node": 0, "l3": 0, "siblings": "0,8", "isolated": False}
    assert out["packages"] == [{"id": 0, "cpus": "0-3,8-11"}, {"id": 1, "cpus": "4-7,12-15"}]
    gpu = out["pci_devices"][0]
    assert {k: gpu[k] for k in ("address", "class", "vendor", "device", "numa_node", "driver", "local_cpus")} == {
        "address": "0000:01:00.0", "class": "0x030200", "vendor": "0x10de", "device": "0x20b0",
        "numa_node": 1, "driver": "nvidia", "local_cpus": "4-7,12-15"}
    assert {k: gpu[k] for k in ("kind", "os_names", "class_name", "vendor_name", "device_name")} == {
        "kind": "gpu", "os_names": [], "class_name": None, "vendor_name": None, "device_name": None}
    assert gpu["pci_root"] is None  # a synthetic device of no known place in the PCI tree
    assert out["caches"][:3] == [
        {"name": "L1d", "level": 1, "type": "data", "id": 0, "size_bytes": 48 << 10, "cpus": "0,8"},
        {"name": "L1d", "level": 1, "type": "data", "id": 1, "size_bytes": 48 << 10, "cpus": "1,9"},
        {"name": "L1d", "level": 1, "type": "data", "id": 2, "size_bytes": 48 << 10, "cpus": "2,10"}]
    assert {(c["name"], c["type"]) for c in out["caches"]} == {
        ("L1d", "data"), ("L1i", "instruction"), ("L2", "unified"), ("L3", "unified")}
    assert out["caches"][-1] == {"name": "L3", "level": 3, "type": "unified", "id": 4,
                                 "size_bytes": 32 << 20, "cpus": "4-7,12-15"}
    assert out["allowed_cpus"] is None and out["allowed_mems"] is None
    json.dumps(out)  # serialisable as is


def test_json_has_device_names_kinds_and_cache_bytes(snapshot, capsys, pci_ids):
    root, _ = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    assert main(["topology", "--sysfs-root", str(root), "--json", "--pci-ids", pci_ids]) == 0
    out = json.loads(capsys.readouterr().out)
    devices = {d["address"]: d for d in out["pci_devices"]}
    assert len(devices) == 137  # every device, whatever the text shows
    keys = ("kind", "os_names", "class_name", "vendor_name", "device_name")
    assert {k: devices["0000:00:02.0"][k] for k in keys} == {
        "kind": "storage", "os_names": ["nvme0n1"], "class_name": "Non-Volatile memory controller",
        "vendor_name": "Intel Corporation", "device_name": "PCIe Data Center SSD"}
    assert {k: devices["0000:82:00.0"][k] for k in keys} == {
        "kind": "infiniband", "os_names": ["ib0", "mlx4_0"], "class_name": "Network controller",
        "vendor_name": "Mellanox Technologies", "device_name": None}
    assert devices["0000:00:04.0"]["kind"] is None
    # The host bridge each device is under: the NVMe on socket 0's, the HCA on socket 1's.
    assert (devices["0000:00:02.0"]["pci_root"], devices["0000:82:00.0"]["pci_root"]) == ("pci0000:00", "pci0000:80")
    l3 = [c for c in out["caches"] if c["name"] == "L3"]
    assert l3 == [{"name": "L3", "level": 3, "type": "unified", "id": 0, "size_bytes": 20480 << 10, "cpus": "0-7"},
                  {"name": "L3", "level": 3, "type": "unified", "id": 8, "size_bytes": 20480 << 10, "cpus": "8-15"}]


def test_render_text_numactl_part_and_tree():
    topo = make_topology(sockets=2, cores_per_node=2, memory_per_node_bytes=8 << 30,
                         node_ids=(0, 8), cpuless_node_ids=(250,))
    text = render_text(topo)
    head = text.split("\n\n")[0].splitlines()
    assert head == [
        "available: 3 nodes (0,8,250)",
        "node 0 cpus: 0 1 4 5",
        "node 0 size: 8192 MB",
        "node 0 free: 8192 MB",
        "node 8 cpus: 2 3 6 7",
        "node 8 size: 8192 MB",
        "node 8 free: 8192 MB",
        "node 250 cpus: ",
        "node 250 size: 8192 MB",
        "node 250 free: 8192 MB",
        "node distances:",
        "node   0   8 250",
        "  0:  10  21  40",
        "  8:  21  10  40",
        "250:  40  40  10",
    ]
    assert "NUMA node 0: cpus 0-1,4-5, memory 8 GiB (free 8 GiB)\n" + _sized(
           "  package 0: cpus 0-1,4-5\n    die 0: cpus 0-1,4-5\n      L3 0 (<32768K>): cpus 0-1,4-5\n"
           "        L2 (<2048K>) + L1d (<48K>) + L1i (<32K>) + core 0: threads 0,4\n"
           "        L2 (<2048K>) + L1d (<48K>) + L1i (<32K>) + core 1: threads 1,5\n") in text
    assert "NUMA node 250 (memory-only): cpus (none), memory 8 GiB" in text


def test_render_text_of_a_topology_made_without_caches_shows_its_l3_groups():
    text = render_text(make_topology(sockets=1, cores_per_node=2, with_caches=False))
    assert "    die 0: cpus 0-3\n      L3 0: cpus 0-3\n        core 0: threads 0,2\n" in text
