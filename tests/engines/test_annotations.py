"""A container's numa-agent.io/ annotations -> the admission body: numa-run's syntax, errors that
name the annotation, its value and the expected syntax."""

from __future__ import annotations

import pytest

from numa_agent.cli import common, numa_run
from numa_agent.engines.annotations import KNOWN, AnnotationError, admission_body, ours


def test_no_annotation_of_ours_is_not_ours():
    assert ours({"io.podman.annotations.init": "FALSE"}) == {}
    assert ours(None) == {}


def test_every_annotation_to_the_body():
    body = admission_body({
        "numa-agent.io/cpus": "4", "numa-agent.io/memory": "1Gi", "numa-agent.io/hugepages-2Mi": "16",
        "numa-agent.io/hugepages-1Gi": "1", "numa-agent.io/devices": "gpu=1, nic", "numa-agent.io/policy":
        "single-numa-node", "numa-agent.io/pod": "p1", "numa-agent.io/membind": "0,250",
        "io.podman.annotations.init": "FALSE"})
    assert body == {"cpus": 4, "shared": False, "memory_bytes": 1 << 30, "hugepages": {"2048": 16, "1048576": 1},
                    "devices": {"gpu": 1, "nic": 1}, "policy": "single-numa-node", "pod": "p1",
                    "membind": [0, 250]}


def test_no_cpus_is_the_shared_pool():
    assert admission_body({"numa-agent.io/memory": "512M"}) == {
        "cpus": 0, "shared": True, "memory_bytes": 512_000_000, "hugepages": {}, "devices": {}}


@pytest.mark.parametrize("option,key,value", [
    (["--cpus", "3"], "numa-agent.io/cpus", "3"),
    (["--memory", "1.5Gi"], "numa-agent.io/memory", "1.5Gi"),
    (["--memory", "512M"], "numa-agent.io/memory", "512M"),
    (["--hugepages", "2048kB=8"], "numa-agent.io/hugepages-2048kB", "8"),
    (["--device", "gpu=2", "--device", "nic=1"], "numa-agent.io/devices", "gpu=2,nic=1"),
    (["--policy", "restricted"], "numa-agent.io/policy", "restricted"),
    (["--numa-allocation-strategy", "most-allocated"], "numa-agent.io/numa-allocation-strategy", "most-allocated"),
    (["--pod", "web"], "numa-agent.io/pod", "web"),
    (["-m", "0,250"], "numa-agent.io/membind", "0,250"),
    (["-m", "0-1"], "numa-agent.io/membind", "0-1"),
])
def test_an_annotation_means_what_numa_run_means(option, key, value):
    """The same words give the same request fields as numa-run's option."""
    expected = common.build_request(numa_run.parse_args([*option, "true"]))
    body = admission_body({key: value})
    for field in ("cpus", "memory_bytes", "hugepages", "devices", "policy", "pod", "membind",
                  "numa_allocation_strategy"):
        assert body.get(field) == expected.get(field), field


@pytest.mark.parametrize("key,value,problem,syntax", [
    ("numa-agent.io/cpus", "two", "invalid CPU count 'two'", "N, a whole number"),
    ("numa-agent.io/cpus", "-1", "expected a whole number >= 0", "N, a whole number"),
    ("numa-agent.io/memory", "512m", "m is milli", "SIZE, e.g. 16Gi"),
    ("numa-agent.io/memory", "lots", "invalid size 'lots'", "SIZE, e.g. 16Gi"),
    ("numa-agent.io/hugepages-2M", "4", "did you mean 2Mi?", "COUNT pages"),
    ("numa-agent.io/hugepages-2Mi", "x", "invalid hugepage count 'x'", "COUNT pages"),
    ("numa-agent.io/devices", "gpu=0", "invalid device count '0'", "RESOURCE=COUNT"),
    ("numa-agent.io/numa-allocation-strategy", "spread", "unknown numa-allocation-strategy 'spread'",
     "one of none, least-allocated, most-allocated"),
    ("numa-agent.io/devices", "gpu=1,gpu=2", "device gpu given twice", "RESOURCE=COUNT"),
    ("numa-agent.io/devices", "=1", "invalid device '=1'", "RESOURCE=COUNT"),
    ("numa-agent.io/policy", "strict", "unknown topology manager policy 'strict'", "one of none, best-effort"),
    ("numa-agent.io/pod", "Web/1", "invalid pod name 'Web/1'", "a pod name (1-63 characters"),
    ("numa-agent.io/membind", "all", "name the nodes by number", "NODES, NUMA node ids"),
    ("numa-agent.io/membind", "0,x", "NUMA node", "NODES, NUMA node ids"),
    ("numa-agent.io/cpu", "2", "unknown numa-agent annotation", "one of numa-agent.io/cpus, numa-agent.io/memory"),
])
def test_a_bad_annotation_names_itself_its_value_and_the_syntax(key, value, problem, syntax):
    with pytest.raises(AnnotationError) as caught:
        admission_body({key: value})
    message = str(caught.value)
    assert message.startswith(f"annotation {key}={value!r}: ")
    assert problem in message and f"(syntax: {syntax}" in message


def test_the_unknown_annotation_error_lists_every_known_one():
    with pytest.raises(AnnotationError) as caught:
        admission_body({"numa-agent.io/gpus": "1"})
    assert all(known in str(caught.value) for known in KNOWN)


def test_two_spellings_of_one_hugepage_size_are_refused():
    with pytest.raises(AnnotationError, match="given twice"):
        admission_body({"numa-agent.io/hugepages-2Mi": "1", "numa-agent.io/hugepages-2048kB": "1"})


def test_a_value_that_is_not_a_string_is_refused():
    with pytest.raises(AnnotationError, match="not a string"):
        admission_body({"numa-agent.io/cpus": 2})


def test_a_long_value_is_cut_in_the_message():
    with pytest.raises(AnnotationError) as caught:
        admission_body({"numa-agent.io/memory": "9" * 5000})
    assert len(str(caught.value)) < 1000


@pytest.mark.parametrize("key, value", [
    ("numa-agent.io/\x1b]0;owned\x07\nnuma-agent: admitted", "1"),  # unknown: the key is shown
    ("numa-agent.io/cpus", "2\x1b[2J\n"),
    ("numa-agent.io/memory", "1Gi\x00\x7f"),
    ("numa-agent.io/policy", "best\x1b[8m-effort"),
    ("numa-agent.io/hugepages-2Mi\x1b[1A", "1"),
    ("numa-agent.io/" + "k" * 100_000, "1"),
])
def test_a_hostile_annotation_is_one_printable_bounded_line(key, value):
    """What the engine logs or shows: no control character of the container's author's
    (a forged log line, a terminal escape) and no megabyte of it."""
    with pytest.raises(AnnotationError) as caught:
        admission_body({key: value})
    message = str(caught.value)
    assert message.isprintable() and len(message) < 2000
