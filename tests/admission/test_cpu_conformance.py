"""Every kubelet vector case of the CPU manager's three sections, through the
same functions the conformance runner calls."""

import json
from pathlib import Path

import pytest

from tests.support.conformance.cpu_sections import SECTIONS

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "kubelet-vectors.json"
DOC = json.loads(VECTORS.read_text())
EXPECTED_COUNTS = {
    "cpu_take_by_topology_packed": 24,
    "cpu_take_by_topology_numa_distributed": 13,
    "cpu_static_policy_topology_hints": 11,
}
CASES = [(section, case) for section in SECTIONS for case in DOC[section]]


def test_every_case_is_collected():
    assert {s: len(DOC[s]) for s in SECTIONS} == EXPECTED_COUNTS


@pytest.mark.parametrize("section, case", CASES, ids=[c["id"] for _, c in CASES])
def test_vector(section, case):
    failure = SECTIONS[section](case, DOC)
    assert failure is None, f"{case['id']} ({case['name']}): {failure}"


def _case(section, case_id):
    return next(c for c in DOC[section] if c["id"] == case_id)


def test_a_wrong_expectation_is_reported():
    section = "cpu_take_by_topology_packed"
    case = dict(_case(section, "cpu-packed-004"), expected=[0])  # the real answer is [6]
    assert SECTIONS[section](case, DOC) == "expected cpus 0, got 6"


def test_a_missing_error_is_reported():
    section = "cpu_take_by_topology_packed"
    case = dict(_case(section, "cpu-packed-004"), expected_error="not enough cpus")
    assert "expected error" in SECTIONS[section](case, DOC)


def test_wrong_hints_are_reported():
    section = "cpu_static_policy_topology_hints"
    case = dict(DOC[section][0], expected_hints=[{"mask": [1], "preferred": True}])
    assert SECTIONS[section](case, DOC).startswith("expected hints [{1} preferred], got ")
