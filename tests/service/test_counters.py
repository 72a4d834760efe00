"""Counters.decided: one admission, counted where the kubelet's managers count it."""

from numa_agent.service.counters import Counters, ManagerOutcome


def counted(*outcomes: ManagerOutcome) -> dict:
    counters = Counters()
    for outcome in outcomes:
        counters.decided(outcome, 0.001)
    snap = counters.snapshot()
    return {key: snap[key] for key in snap if key.startswith(("topology_", "pinning_", "aligned_compute"))}


def test_a_pod_refused_by_a_single_numa_node_merge_is_a_pod_scope_failure():
    snap = counted(ManagerOutcome(merge_refused=True, guaranteed=True, scope="pod", full_pcpus_only=True))
    assert snap["topology_manager_admission_requests_total"] == 1
    assert snap["topology_manager_admission_errors_total"] == 1
    assert snap["pinning_requests_total"] == {"cpu": 0, "memory": 0}  # no manager allocated
    assert ["pod", "numa_node", 1] in snap["aligned_compute_resources_failures_total"]
    assert all(v == 0 for *_, v in snap["aligned_compute_resources_total"])
    assert snap["topology_manager_admission_duration_seconds"]["count"] == 1


def test_an_allocation_refusal_is_no_alignment_failure_but_the_managers_count_it():
    # best-effort merged, the CPUs given (whole cores), then the memory manager refused
    snap = counted(ManagerOutcome(pinned=frozenset({"cpu"}), failed="memory", full_pcpus_only=True))
    assert snap["topology_manager_admission_errors_total"] == 1
    assert snap["pinning_requests_total"] == {"cpu": 1, "memory": 1}
    assert snap["pinning_errors_total"] == {"cpu": 0, "memory": 1}
    assert ["container", "physical_cpu", 1] in snap["aligned_compute_resources_total"]
    assert all(v == 0 for *_, v in snap["aligned_compute_resources_failures_total"])
    # devices have no kubelet pinning family; without full-pcpus-only no physical_cpu count
    snap = counted(ManagerOutcome(pinned=frozenset({"cpu", "devices"})))
    assert snap["pinning_requests_total"] == {"cpu": 1, "memory": 0}
    assert all(v == 0 for *_, v in snap["aligned_compute_resources_total"])
