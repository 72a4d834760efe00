"""The collector over the real AgentService (fake cgroup tree): the contract between
metrics_snapshot() and the exported families holds end to end."""

import os

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.api.validation import AdmitRequest
from numa_agent.enforcement.cgroup import CgroupV2
from numa_agent.enforcement.enforcer import CgroupEnforcer
from numa_agent.enforcement.fake_cgroupfs import FakeCgroupfs, make_fake_cgroup_root
from numa_agent.service.agent_service import AgentService
from numa_agent.service.caller import Caller
from numa_agent.service.recovery import restore
from numa_agent.state.checkpoint import CheckpointStore
from numa_agent.testing.synthetic import make_topology
from numa_agent.views.metrics import build_registry


def test_scrape_of_a_real_service_after_one_admission(tmp_path):
    topo = make_topology(sockets=2, cores_per_node=4, threads_per_core=2, memory_per_node_bytes=8 << 30)
    machine = build_machine(topo, PolicyConfig(topology_policy="single-numa-node"))
    root = make_fake_cgroup_root(tmp_path / "cg", machine.usable_cpus, [0, 1])
    enforcer = CgroupEnforcer(CgroupV2(root, FakeCgroupfs(root)))
    store = CheckpointStore(tmp_path / "state")
    enforcer.setup()
    state, _ = restore(machine, store, enforcer)
    service = AgentService(machine, store, enforcer)
    service.install(state)
    out = service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=1 << 30),
                        Caller(pid=os.getpid(), uid=1000, gid=1000))
    (node,) = out["numa_nodes"]

    text = generate_latest(build_registry(service.metrics_snapshot)).decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value

    status = service.status()
    for n in status["nodes"]:
        for state_name, count in n["cpus"].items():
            assert values[("numa_agent_cpus", (("numa_node", str(n["id"])), ("state", state_name)))] == count
    assert values[("numa_agent_cpus", (("numa_node", str(node)), ("state", "allocated")))] == 2
    assert values[("numa_agent_memory_bytes", (("numa_node", str(node)), ("state", "allocated")))] == 1 << 30
    assert values[("numa_agent_admission_requests_total", (("result", "admitted"),))] == 1
    assert values[("numa_agent_admission_duration_seconds_count", ())] == 1
    assert values[("numa_agent_workloads", ())] == 1
    info = [labels for (name, labels) in values if name == "numa_agent_info"]
    assert info and dict(info[0])["enforcement"] == "simulated"
