"""End to end: the real agent loses its checkpoint while a workload runs (the
agent is killed with SIGKILL, the checkpoint deleted or corrupted) and rebuilds
the workload from the cgroup tree (simulated, on a written sysfs tree of a
small 2-node machine like the QEMU guest's): memory booking, owner and the
cgroup's memory.max survive, and the node's memory is not booked twice."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.agent_process import AgentProcess, numa_run
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

MIB = 1 << 20
LIMIT = 576 * MIB  # 603979776


@pytest.fixture
def agent(tmp_path):
    topo = make_topology(sockets=1, nodes_per_socket=2, cores_per_node=2, threads_per_core=1,
                         memory_per_node_bytes=961 * MIB)
    root = write_sysfs(topo, tmp_path / "machine")
    a = AgentProcess(tmp_path, "--sysfs-root", str(root)).start()
    yield a
    a.stop()


def status_json(agent):
    out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "status", "--socket",
                          agent.socket, "--json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("how, cpus", [("deleted", ()), ("corrupted", ("--cpus", "1"))])
def test_checkpoint_lost_under_a_running_workload(agent, how, cpus):
    proc = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", agent.socket,
                             "--name", "web", *cpus, "--memory", "576Mi", "-N", "0", "-m", "0", "--",
                             "sleep", "60"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not any(w["pid"] == proc.pid for w in status_json(agent)["workloads"]):
            assert proc.poll() is None and time.monotonic() < deadline, "numa-run was not admitted"
            time.sleep(0.05)
        (before,) = status_json(agent)["workloads"]
        assert before["memory_bytes"] == {"0": LIMIT} and before["owner_uid"] == os.getuid()
        cgroup = agent.state_dir / "cgroupfs" / "numa-agent" / ("wl-web" if cpus else "shared/web")
        memory_max = cgroup / "memory.max"
        assert memory_max.read_text().strip() == str(LIMIT)

        agent.kill()
        checkpoint = agent.state_dir / "checkpoint.json"
        (agent.state_dir / "checkpoint.json.prev").unlink(missing_ok=True)  # the tree is the only source
        if how == "deleted":
            checkpoint.unlink()
        else:
            checkpoint.write_text(checkpoint.read_text()[:-20] + "garbage")
        agent.start()

        (after,) = status_json(agent)["workloads"]
        assert after["name"] == "web" and after["pid"] == proc.pid and after["cpus"] == before["cpus"]
        assert after["memory_bytes"] == {"0": LIMIT} and after["memory_limit_bytes"] == LIMIT
        assert after["owner_uid"] == os.getuid()
        assert memory_max.read_text().strip() == str(LIMIT)  # not loosened to "max"
        assert status_json(agent)["nodes"][0]["memory_bytes"]["allocated"] == LIMIT
        # A second 576 MiB on node 0 would overcommit its 961 MiB: refused.
        second = numa_run(agent.socket, "--name", "again", "--memory", "576Mi", "-N", "0", "-m", "0",
                          "--", "true")
        assert second.returncode != 0, second.stdout
        assert [w["name"] for w in status_json(agent)["workloads"]] == ["web"]
        assert "adopted web" in agent.log()
    finally:
        proc.kill()
        proc.wait()
