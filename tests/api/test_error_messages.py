"""What the API says to a person (the error's message) is escaped; what it says to a
program (the details) keeps the exact value."""

from __future__ import annotations

from numa_agent.api.errors import BadRequest
from numa_agent.api.refusals import api_error
from numa_agent.service.refusals import InConflict

# A rootless engine's user may name its cgroups as it likes: only "/" and NUL are refused.
EVIL = "/user.slice/\x1b]0;owned\x07\r\nforged\u202e"
SHOWN = "/user.slice/\\x1b]0;owned\\x07\\r\\nforged\\u202e"


def test_a_refusal_quoting_a_cgroup_is_answered_escaped_with_exact_details():
    refusal = InConflict(f"cgroup {EVIL} is held by workload web", details={"cgroup": EVIL})
    body = api_error(refusal).to_dict()["error"]
    assert body["message"] == f"cgroup {SHOWN} is held by workload web"
    assert body["details"] == {"cgroup": EVIL}
    assert body["code"] == "name_in_use"


def test_every_api_error_message_is_printable():
    error = BadRequest(f"bad {EVIL}")
    assert str(error) == error.message == f"bad {SHOWN}"
