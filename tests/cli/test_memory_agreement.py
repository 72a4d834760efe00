"""`numa-agent topology` and `numa-agent status` on the same simulated machine
agree on each node's memory: status carries topology's MemTotal, and its
capacity is that less the hugepage pools (said in the text), its reserved the
configured reserved_memory; after a memory hotplug both show the new size."""

import json
import shutil
import time

import pytest

from numa_agent.admission.machine import PolicyConfig
from numa_agent.cli import status_cmd
from numa_agent.cli.numa_agent import main
from numa_agent.daemon.config import AgentConfig
from numa_agent.daemon.startup import Agent
from numa_agent.hotplug.events import FakeEventSource, HotplugEvent
from tests.support.synthetic import make_topology, with_node_memory
from tests.support.sysfs_writer import write_sysfs

GiB, MiB = 1 << 30, 1 << 20


def topology_json(capsys, root):
    assert main(["topology", "--json", "--sysfs-root", str(root)]) == 0
    return {n["id"]: n for n in json.loads(capsys.readouterr().out)["numa_nodes"]}


@pytest.fixture
def agent(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=2, threads_per_core=2, memory_per_node_bytes=16 * GiB,
                         hugepages_2m_per_node=256)  # 512 MiB of 2 MiB pages per node
    root = write_sysfs(topo, tmp_path / "machine")
    source = FakeEventSource()
    cfg = AgentConfig(sysfs_root=str(root), state_dir=str(tmp_path / "state"), socket=str(tmp_path / "sock"),
                      metrics_address=None, hotplug=True,
                      policy=PolicyConfig(reserved_memory={0: {"memory": GiB}}))
    agent = Agent(cfg, hotplug_source=source).start()
    yield agent, topo, root, source, tmp_path
    agent.stop()


def test_status_and_topology_agree_on_each_node_memory(agent, capsys):
    agent, topo, root, source, tmp = agent
    shown = topology_json(capsys, root)
    status = agent.service.status()
    for node in status["nodes"]:
        total = shown[node["id"]]["memory_total_bytes"]
        pools = sum(int(label.removesuffix("kB")) * 1024 * pool["total"]
                    for label, pool in shown[node["id"]]["hugepages"].items())
        assert node["memory_total_bytes"] == total == 16 * GiB
        assert node["memory_bytes"]["capacity"] == total - pools == 16 * GiB - 512 * MiB
    assert [n["memory_bytes"]["reserved"] for n in status["nodes"]] == [GiB, 0]
    text = "\n".join(status_cmd.format_status(status, now=time.time()))
    assert ("node 0 memory capacity is its MemTotal 16 GiB (as `numa-agent topology` shows it) "
            "less its hugepage pools 512 MiB") in text


def test_both_show_the_new_size_after_a_memory_hotplug(agent, capsys):
    agent, topo, root, source, tmp = agent
    staging = write_sysfs(with_node_memory(topo, 1, 20 * GiB), tmp / "staging")
    shutil.rmtree(root)
    staging.rename(root)
    for block in range(200, 232):  # 4 GiB in 128 MiB blocks
        source.push(HotplugEvent("memory", "online", f"/sys/devices/system/memory/memory{block}", block))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and agent.service.status()["nodes"][1]["memory_total_bytes"] != 20 * GiB:
        time.sleep(0.02)
    node = agent.service.status()["nodes"][1]
    assert topology_json(capsys, root)[1]["memory_total_bytes"] == node["memory_total_bytes"] == 20 * GiB
    assert node["memory_bytes"]["capacity"] == 20 * GiB - 512 * MiB
