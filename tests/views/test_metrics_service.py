"""The collector over the real AgentService (fake cgroup tree): the contract between
metrics_snapshot() and the exported families holds end to end."""

import os

from numa_agent.core.caller import Caller
from numa_agent.service.requests import AdmitRequest, PodBudget
from tests.support.metrics_service import metrics_service, scrape

CALLER = Caller(pid=os.getpid(), uid=1000, gid=1000)


def test_scrape_of_a_real_service_after_one_admission(tmp_path):
    service = metrics_service(tmp_path)
    out = service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=1 << 30), CALLER)
    (node,) = out["numa_nodes"]

    values = scrape(service)

    status = service.status()
    for n in status["nodes"]:
        for state_name, count in n["cpus"].items():
            name = "numa_agent_cpus_capacity" if state_name == "capacity" else "numa_agent_cpus"
            labels = (("numa_node", str(n["id"])),) + ((("state", state_name),) if state_name != "capacity" else ())
            assert values[(name, labels)] == count
    assert values[("numa_agent_cpus", (("numa_node", str(node)), ("state", "allocated")))] == 2
    assert values[("numa_agent_memory_bytes", (("numa_node", str(node)), ("state", "allocated")))] == 1 << 30
    assert values[("numa_agent_admission_requests_total", (("result", "admitted"),))] == 1
    assert values[("numa_agent_admission_duration_seconds_count", ())] == 1
    assert values[("numa_agent_workloads", ())] == 1
    info = [labels for (name, labels) in values if name == "numa_agent_info"]
    assert info and dict(info[0])["enforcement"] == "simulated"


def test_kubelet_families_count_as_the_kubelet_counts(tmp_path):
    service = metrics_service(tmp_path, cpu_options={"full-pcpus-only": "true"})

    def admit(dry_run=False, **fields):
        try:
            service.admit(AdmitRequest(**fields), CALLER, dry_run=dry_run)
        except Exception as exc:  # a refusal: what it counted is checked below
            return exc
        return None

    def kubelet():
        values = scrape(service)
        aligned = {labels: v for (name, labels), v in values.items()
                   if name == "numa_agent_aligned_compute_resources_total"}
        failed = {labels: v for (name, labels), v in values.items()
                  if name == "numa_agent_aligned_compute_resources_failures_total"}
        counts = {name[len("numa_agent_"):]: v for (name, labels), v in values.items() if not labels and (
            "_manager_" in name and not name.endswith(("_sum", "_bucket")))}
        return counts, aligned, failed

    counts, aligned, failed = kubelet()
    # Every series from the first scrape on, at 0; the pool is every usable CPU (16).
    assert counts["cpu_manager_shared_pool_size_millicores"] == 16000
    assert set(aligned) == set(failed) == {
        (("boundary", "numa_node"), ("scope", "container")), (("boundary", "numa_node"), ("scope", "pod")),
        (("boundary", "physical_cpu"), ("scope", "container"))}
    assert not any(aligned.values()) and not any(failed.values())

    assert admit(name="web", cpus=2, memory_bytes=1 << 30) is None
    assert admit(name="dry", cpus=2, dry_run=True) is None  # dry runs are not admissions
    assert admit(name="plain", shared=True) is None  # nothing to pin
    assert admit(name="huge", cpus=10) is not None  # no node has 10 CPUs: the merge refuses
    # best of nothing: no merge refusal, the CPUs are given, the memory manager refuses 20 GiB
    assert admit(name="greedy", cpus=2, memory_bytes=20 << 30, policy="none") is not None
    assert admit(name="odd", cpus=3, policy="none") is not None  # full-pcpus-only: whole cores only
    assert admit(name="m1", pod="p", cpus=2, pod_budget=PodBudget(cpus=4)) is None
    assert admit(name="m2", pod="p") is None  # a later member: no merge, nothing pinned
    assert admit(name="bad", cpus=1, cpunodebind=[7]) is not None  # no node 7: never reaches the managers

    counts, aligned, failed = kubelet()
    assert counts["topology_manager_admission_requests_total"] == 7  # web plain huge greedy odd m1 m2
    assert counts["topology_manager_admission_errors_total"] == 3  # huge greedy odd
    assert counts["topology_manager_admission_duration_seconds_count"] == 7
    assert counts["cpu_manager_pinning_requests_total"] == 4  # web greedy odd m1
    assert counts["cpu_manager_pinning_errors_total"] == 1  # odd
    assert counts["memory_manager_pinning_requests_total"] == 2  # web greedy
    assert counts["memory_manager_pinning_errors_total"] == 1  # greedy
    assert counts["cpu_manager_exclusive_cpus"] == 2 + 4  # web, the pod's budget
    assert counts["cpu_manager_shared_pool_size_millicores"] == (16 - 6) * 1000
    # As the kubelet's container scope: every admission merged under single-numa-node counts,
    # the shared one too (its hints allow any node, so the merge admits).
    assert aligned == {(("boundary", "numa_node"), ("scope", "container")): 2,  # web plain
                       (("boundary", "numa_node"), ("scope", "pod")): 1,  # p's budget, once
                       (("boundary", "physical_cpu"), ("scope", "container")): 3}  # web greedy m1
    assert failed == {(("boundary", "numa_node"), ("scope", "container")): 1,  # huge
                      (("boundary", "numa_node"), ("scope", "pod")): 0,
                      (("boundary", "physical_cpu"), ("scope", "container")): 1}  # odd


def test_scrape_is_byte_identical_to_one_over_the_full_status_view(tmp_path):
    """The metrics' own status (counts kept in the state's memo) gives the same
    exposition as the full per-workload status view it replaced."""
    from prometheus_client import CollectorRegistry, generate_latest

    from numa_agent.service.agent_service import VERSION
    from numa_agent.views.metrics import AgentCollector

    service = metrics_service(tmp_path)

    def full_view() -> dict:
        state = service.state
        status = service._status(state, None)
        status["quotas"] = service._quota_views(state, {}) if service.quotas else []
        return {"status": service._observed(state, status), "counters": service.counters.snapshot(),
                "isolation_knobs": service.isolation.knob_counts(state) if service.isolation else {},
                "info": {"version": VERSION, "enforcement": service.enforcer.mode}}

    def text(snapshot_fn) -> bytes:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(AgentCollector(snapshot_fn, "x"))
        return generate_latest(registry)

    assert text(service.metrics_snapshot) == text(full_view)
    for i in range(4):
        service.admit(AdmitRequest(name=f"w{i}", cpus=1 + i % 2, memory_bytes=(i + 1) << 28), CALLER)
        assert text(service.metrics_snapshot) == text(full_view)
    service.admit(AdmitRequest(name="m0", pod="p", cpus=1, pod_budget=PodBudget(cpus=2)), CALLER)
    service.release("w1", CALLER)
    assert text(service.metrics_snapshot) == text(full_view)
