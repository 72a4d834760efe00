"""An admission naming a container its runtime enforces (NRI) is checked
where the API decodes bodies: the runtime writes its cgroup, so it names no
engine cgroup nor in_place, and it is never a shared container."""

from __future__ import annotations

import json

import pytest

from numa_agent.api.errors import BadRequest
from numa_agent.api.validation import parse_admit_request
from numa_agent.service.requests import RuntimeRef

RUNTIME = {"runtime": "nri", "container_id": "c0ffee", "sandbox_id": "5andb0x", "namespace": "prod",
           "pod": "web-0", "pod_uid": "uid-1", "container": "app"}


def parsed(**body):
    return parse_admit_request(json.dumps({"name": "ctr-a", "cpus": 2, "runtime": RUNTIME, **body}).encode())


def test_a_runtime_admission_decodes_into_its_runtime_ref():
    req = parsed()
    assert req.runtime == RuntimeRef(**RUNTIME)


@pytest.mark.parametrize("body, field", [
    ({"cgroup": "/kubepods/pod1/ctr"}, "runtime"),
    ({"in_place": True}, "runtime"),
    ({"shared": True, "cpus": 0}, "shared"),
    ({"runtime": {**RUNTIME, "container_id": ""}}, "runtime.container_id"),
    ({"runtime": {**RUNTIME, "sandbox_id": ""}}, "runtime.sandbox_id"),
])
def test_what_a_runtime_admission_cannot_be_is_one_line_naming_the_field(body, field):
    with pytest.raises(BadRequest) as err:
        parsed(**body)
    assert err.value.details == {"field": field}
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("runtime", [
    {**RUNTIME, "runtime": "docker"},  # only NRI
    {**RUNTIME, "extra": 1},  # no unknown field
    {**RUNTIME, "pod": "x" * 257},  # bounded
    {"runtime": "nri", "container_id": "c"},  # the sandbox is required
])
def test_a_malformed_runtime_ref_is_refused(runtime):
    with pytest.raises(BadRequest, match="runtime"):
        parsed(runtime=runtime)
