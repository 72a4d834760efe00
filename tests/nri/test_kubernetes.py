"""kubernetes.py: a container read as the kubelet's static managers read it,
the names, the annotations, the answers and the refusals' lines."""

from __future__ import annotations

import hashlib

import pytest

from numa_agent.engines.annotations import AnnotationError
from numa_agent.nri import kubernetes as k8s
from numa_agent.nri import nri_api_pb2 as api
from numa_agent.service.refusals import InvalidInput, NoCapacity, TopologyRefused
from tests.nri.fake_api import container, resources, sandbox

GIB = 1 << 30


@pytest.mark.parametrize(("path", "qos"), [
    ("/kubepods/besteffort/poduid-1", k8s.BEST_EFFORT),
    ("/kubepods/burstable/poduid-1", k8s.BURSTABLE),
    ("/kubepods/poduid-1", k8s.GUARANTEED),
    ("kubepods-besteffort-poduid_1.slice", k8s.BEST_EFFORT),
    ("kubepods-burstable-poduid_1.slice", k8s.BURSTABLE),
    ("kubepods-poduid_1.slice", k8s.GUARANTEED),
    ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid_1.slice", k8s.BURSTABLE),
    ("/kubepods.slice/kubepods-poduid_1.slice", k8s.GUARANTEED),
    ("kubepods-poduid_1.slice:cri-containerd:0123abcd", k8s.GUARANTEED),  # a container's systemd path
    ("/kubepods/burstable/poduid-1/0123abcd", k8s.BURSTABLE),             # a container's cgroupfs path
    ("/custom-root/kubepods/poduid-1", k8s.GUARANTEED),                   # the kubelet's --cgroup-root
    ("/kubepods", None),
    ("/system.slice/containerd.service", None),
    ("", None),
])
def test_the_qos_class_is_the_kubelets_cgroup_level(path, qos):
    assert k8s.qos_of_cgroup(path) == qos


def test_the_containers_path_serves_when_the_pod_has_no_parent():
    pod = api.PodSandbox(id="p")
    ctr = api.Container(id="c", linux=api.LinuxContainer(cgroups_path="/kubepods/besteffort/podx/c"))
    assert k8s.pod_qos(pod, ctr) == k8s.BEST_EFFORT


# (qos, resources) -> exclusive CPUs, and a word of why not
TABLE = [
    ("besteffort", resources(), 0, "BestEffort"),
    ("burstable", resources(cpus=2, memory=GIB), 0, "Burstable"),
    ("burstable", resources(cpus=2, shares=1024, memory=GIB), 0, "Burstable"),
    (None, resources(cpus=2, memory=GIB), 0, "kubepods"),
    ("guaranteed", resources(cpus=1.5, memory=GIB), 0, "fractional CPU limit (1.5 CPUs)"),
    ("guaranteed", resources(cpus=0.25, memory=GIB), 0, "fractional"),
    ("guaranteed", resources(cpus=2, memory=GIB), 2, "2 whole CPUs"),
    ("guaranteed", resources(cpus=1, memory=GIB), 1, "1 whole CPU"),
    ("guaranteed", resources(cpus=2, shares=None, memory=GIB), 2, "2 whole CPUs"),  # no shares: the QoS says it
    ("guaranteed", resources(memory=GIB), 0, "no CPU limit"),                        # no quota
    ("guaranteed", resources(cpus=2, period=None, memory=GIB), 0, "without a period"),
    ("guaranteed", resources(cpus=2, period=0, memory=GIB), 0, "without a period"),
    ("guaranteed", resources(cpus=2, shares=1000, memory=GIB), 0, "shares 1000"),  # request 1.95 CPUs
    ("guaranteed", resources(cpus=-2, shares=None, memory=GIB), 0, "no CPU limit"),  # absurd: negative quota
    ("guaranteed", resources(cpus=10**6, shares=None, memory=GIB), 0, "more than a request can hold"),
    ("guaranteed", resources(cpus=2, memory=-1), 0, "memory limit of -1 bytes"),
    ("guaranteed", resources(cpus=2, memory=1 << 62), 0, "which no request can hold"),
    ("guaranteed", resources(cpus=2, memory=GIB, hugepages={"2MB": 3 << 20}), 0, "not a whole number"),
    ("guaranteed", resources(cpus=2, memory=GIB, hugepages={"3MB": 6 << 20}), 0, "not a power of two"),
]


@pytest.mark.parametrize(("qos", "res", "cpus", "why"), TABLE)
def test_exclusive_cpus_only_for_a_guaranteed_pods_whole_cpus(qos, res, cpus, why):
    pod = sandbox(1, qos)
    placement = k8s.classify(pod, container(1, pod, res))
    assert placement.cpus == cpus
    assert placement.exclusive is bool(cpus)
    assert why in placement.why


def test_an_exclusive_container_books_its_memory_limit_and_hugepages():
    pod = sandbox(1)
    res = resources(cpus=4, memory=2 * GIB, hugepages={"2MB": 8 << 20, "1GB": 0, "1Gi": 2 * GIB})
    placement = k8s.classify(pod, container(1, pod, res))
    assert (placement.cpus, placement.memory_bytes) == (4, 2 * GIB)
    assert placement.hugepages == {"2048": 4, "1048576": 2}  # zero limits (sizes not asked) book nothing


def test_new_resources_are_read_instead_of_the_containers():
    pod = sandbox(1)
    ctr = container(1, pod, resources(cpus=2, memory=GIB))
    assert k8s.classify(pod, ctr, resources(cpus=4, memory=2 * GIB)).cpus == 4


def test_names_are_the_oci_hooks():
    long = "ab" * 32
    assert k8s.workload_name(long) == "ctr-" + long[:12]
    assert k8s.request_id(long) == long
    digest = hashlib.sha256(b"not-hex").hexdigest()
    assert (k8s.workload_name("not-hex"), k8s.request_id("not-hex")) == ("ctr-" + digest[:12], digest)
    assert k8s.pod_name("cd" * 32) == "sbx-" + "cd" * 6


def test_the_pod_budget_needs_whole_cpus_in_the_pods_totals():
    assert k8s.pod_budget(sandbox(1)) is None  # not given
    total = resources(cpus=3, memory=3 * GIB, hugepages={"2MB": 4 << 20})
    assert k8s.pod_budget(sandbox(1, pod_resources=total)) == {"cpus": 3, "memory_bytes": 3 * GIB,
                                                               "hugepages": {"2048": 2}}
    assert k8s.pod_budget(sandbox(1, pod_resources=resources(cpus=2.5, memory=GIB))) is None


def test_annotations_are_read_by_the_oci_hooks_parser():
    pod = sandbox(1, annotations={"numa-agent.io/policy": "single-numa-node", "numa-agent.io/membind": "1",
                                  "numa-agent.io/devices": "gpu=1", "other.io/x": "y"})
    body = k8s.annotations_of(pod)
    assert k8s.placement_fields(body) == {"policy": "single-numa-node", "membind": [1], "devices": {"gpu": 1}}
    with pytest.raises(AnnotationError, match="numa-agent.io/policy"):
        k8s.annotations_of(sandbox(1, annotations={"numa-agent.io/policy": "nearest"}))


def test_asking_for_exclusive_cpus_a_shared_container_cannot_have_refuses_it():
    pod = sandbox(1, "burstable", annotations={"numa-agent.io/cpus": "2"})
    shared = k8s.classify(pod, container(1, pod, resources(cpus=2, memory=GIB, shares=512)))
    body = k8s.annotations_of(pod)
    assert "asks for exclusive CPUs" in k8s.annotation_refusal(body, shared)
    guaranteed = sandbox(2, annotations={"numa-agent.io/cpus": "2"})
    exclusive = k8s.classify(guaranteed, container(2, guaranteed, resources(cpus=2, memory=GIB)))
    assert k8s.annotation_refusal(body, exclusive) is None
    assert k8s.annotation_refusal({"cpus": 0}, shared) is None


def test_annotations_without_effect_are_named():
    pod = sandbox(1, "besteffort")
    shared = k8s.classify(pod, container(1, pod))
    body = {"cpus": 0, "memory_bytes": 1 << 30, "policy": "restricted", "pod": "x"}
    notes = k8s.annotation_notes(body, shared)
    assert [n.split(" ")[0] for n in notes] == ["numa-agent.io/memory", "numa-agent.io/pod", "numa-agent.io/policy"]
    exclusive = k8s.Placement(k8s.GUARANTEED, cpus=2)
    assert [n.split(" ")[0] for n in k8s.annotation_notes(body, exclusive)] == ["numa-agent.io/memory",
                                                                                "numa-agent.io/pod"]


def test_the_adjustment_and_updates_set_the_cpuset():
    adjust = k8s.adjustment("2-3", k8s.mems_text([0, 1, 3]))
    assert (adjust.linux.resources.cpu.cpus, adjust.linux.resources.cpu.mems) == ("2-3", "0-1,3")
    up = k8s.update("c1", "0-7", ignore_failure=True)
    assert (up.container_id, up.linux.resources.cpu.cpus, up.linux.resources.cpu.mems, up.ignore_failure) == \
        ("c1", "0-7", "", True)


@pytest.mark.parametrize(("refusal", "reason"), [
    (TopologyRefused("no node fits", details={"reason_code": "topology_affinity_error"}),
     "TopologyAffinityError: numa-agent refused container app: no node fits [topology_affinity_error]"),
    (NoCapacity("odd CPUs", details={"reason_code": "smt_alignment_error"}),
     "SMTAlignmentError: numa-agent refused container app: odd CPUs [smt_alignment_error]"),
    (NoCapacity("too few\nCPUs", details={"reason_code": "insufficient_cpus"}),
     "UnexpectedAdmissionError: numa-agent refused container app: too few CPUs [insufficient_cpus]"),
    (InvalidInput("bad"), "UnexpectedAdmissionError: numa-agent refused container app: bad"),
])
def test_a_refusal_is_one_line_in_the_kubelets_words(refusal, reason):
    assert k8s.service_refusal_line("container app", refusal) == reason


def test_an_update_replaces_what_it_sets_and_keeps_the_rest():
    current = resources(cpus=2, memory=GIB, hugepages={"2MB": 4 << 20})
    assert k8s.updated_resources(current, api.LinuxResources()) == current
    memory_only = api.LinuxResources()
    memory_only.memory.limit.value = 2 * GIB
    after = k8s.updated_resources(current, memory_only)
    assert (after.cpu.quota.value, after.memory.limit.value, len(after.hugepage_limits)) == (200_000, 2 * GIB, 1)
    pages = k8s.updated_resources(current, api.LinuxResources(hugepage_limits=[api.HugepageLimit(
        page_size="2MB", limit=8 << 20)]))
    assert [(h.page_size, h.limit) for h in pages.hugepage_limits] == [("2MB", 8 << 20)]
