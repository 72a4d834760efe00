"""`numa-agent topology` and its JSON/text views."""

from __future__ import annotations

import json

import pytest

from numa_agent.cli.numa_agent import main
from numa_agent.core.cpuset import CpuSet
from numa_agent.testing.synthetic import make_topology
from numa_agent.views.topology_report import render_text, topology_to_json


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


def test_text_hides_bridges_and_marks_derived_nodes(snapshot, capsys):
    root, exp = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    main(["topology", "--sysfs-root", str(root)])
    out = capsys.readouterr().out
    bridges = sum(1 for d in exp["pci"]["devices"] if d["class"].startswith(("0x0600", "0x0604")))
    assert bridges > 0
    assert f"({bridges} PCI bridges hidden: classes 0x0600, 0x0604)" in out
    assert "0000:00:01.0" not in out  # a 0x060400 root port
    assert "0000:00:02.0  class 0x010802  8086:0953  driver nvme  block nvme0n1  (node from local_cpulist)" in out


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
                    "distances": {"0": 10, "1": 21}}
    assert out["cpus"][0] == {"id": 0, "online": True, "package": 0, "die": 0, "cluster": None, "core_id": 0,
                              "core": 0, "numa_node": 0, "l3": 0, "siblings": "0,8", "isolated": False}
    assert out["packages"] == [{"id": 0, "cpus": "0-3,8-11"}, {"id": 1, "cpus": "4-7,12-15"}]
    gpu = out["pci_devices"][0]
    assert {k: gpu[k] for k in ("address", "class", "vendor", "device", "numa_node", "driver", "local_cpus")} == {
        "address": "0000:01:00.0", "class": "0x030200", "vendor": "0x10de", "device": "0x20b0",
        "numa_node": 1, "driver": "nvidia", "local_cpus": "4-7,12-15"}
    assert out["allowed_cpus"] is None and out["allowed_mems"] is None
    json.dumps(out)  # serialisable as is


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
    assert "NUMA node 0: cpus 0-1,4-5, memory 8 GiB (free 8 GiB)\n" \
           "  package 0: cpus 0-1,4-5\n    die 0: cpus 0-1,4-5\n      L3 0: cpus 0-1,4-5\n" \
           "        core 0: threads 0,4\n        core 1: threads 1,5\n" in text
    assert "NUMA node 250: cpus (none), memory 8 GiB" in text
