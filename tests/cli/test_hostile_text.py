"""Text anyone can choose (process names, user names, reasons quoting them) reaches a
person's terminal escaped: in `status`, `explain`, refusals, error lines and the OCI
hook's lines, no control character, no forged line, no bidi override."""

from __future__ import annotations

import io
import json
import unicodedata
from contextlib import redirect_stderr
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.cli import common, oci_hook_cmd
from numa_agent.cli.status_cmd import format_status

EVIL = "\x1b]0;owned\x07\x1b[2J\r\nforged line\u202e"
BIDI_AND_BREAKS = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029}
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\r\\nforged line\\u202e"


def assert_printable_lines(lines: list[str]) -> None:
    for line in lines:
        bad = [ch for ch in line if unicodedata.category(ch) in ("Cc", "Cs") or ord(ch) in BIDI_AND_BREAKS]
        assert not bad, repr(line)


def hostile_status(evil: str = EVIL) -> dict:
    return {
        "enforcement": "affinity", "policy": {"topology": "none", "scope": "container"}, "shared_pool": "0",
        "nodes": [{"id": 0, "cpus": {"capacity": 2, "reserved": 1, "allocated": 1, "free": 0}}],
        "workloads": [{
            "name": "web", "owner": evil, "cpus": "1", "exclusive": True, "numa_nodes": [0],
            "intruders": [{"pid": 7, "tid": 7, "command": evil, "cpu": 1}],
            "kernel_threads": [{"pid": 9, "tid": 9, "command": evil, "cpu": 1}],
            "memory_numa": {"bytes": {"0": 4096}},
            "rebuilt": True, "unknown": [evil],
        }],
        "quotas": [{"owner": evil, "cpus": {"used": 1}}],
        "released": [{"pid": 7, "name": "web", "reason": evil, "released_unix": 1}],
        "quarantined": [{"name": "web", "cpus": "1", "pid": 7, "marked": evil, "affinity": "1",
                         "reason": evil, "remedy": evil}],
        "isolation": {"restore_failures": [{"knob": evil, "original": "0", "error": evil}],
                      "irqbalance": evil},
    }


def test_status_text_escapes_every_text_and_keeps_its_columns():
    lines = format_status(hostile_status(), now=100.0, intruders=True)
    assert_printable_lines(lines)
    assert f"pid 7 tid 7 ({SHOWN})" in "\n".join(lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
    # the OWNER column is as wide as the escaped owner: the next column starts after it
    assert lines[header].index("POD") == lines[header + 1].index(SHOWN) + len(SHOWN) + 2


def test_explain_and_refusal_lines_escape_the_agent_texts():
    record = {"name": "web", "cpus": "1", "exclusive": True, "dry_run": True,
              "isolation": {"asked": ["irqs"], "done": [], "not_done": [EVIL]},
              "explanation": {"providers": [{"provider": EVIL, "hints": [EVIL]}]}}
    lines = common.decision_lines(record)
    assert_printable_lines(lines)
    assert f"  isolation not done: {SHOWN}" in lines
    refused = common.refusal_lines("numa-agent explain: would refuse",
                                   {"code": "admission_refused", "message": EVIL,
                                    "details": {"reason": EVIL, "topology": {"policy": EVIL}}})
    assert_printable_lines(refused)
    assert refused[0] == f"numa-agent explain: would refuse: {SHOWN}"


def test_an_error_is_one_escaped_line():
    err = io.StringIO()
    with redirect_stderr(err):
        common.print_error("numa-run", f"{EVIL}: command not found")
    assert err.getvalue() == f"numa-run: error: {SHOWN}: command not found\n"


def test_the_oci_hook_lines_are_escaped_on_stderr_and_in_the_system_log():
    err, logged = io.StringIO(), []
    args = mock.Mock(stage="createRuntime", socket=None)
    with redirect_stderr(err), \
            mock.patch.object(oci_hook_cmd.oci_hook, "run", return_value=(1, [f"refused: {EVIL}"])), \
            mock.patch.object(oci_hook_cmd, "_to_system_log", logged.extend), \
            mock.patch.object(oci_hook_cmd.sys, "stdin", mock.Mock(buffer=io.BytesIO(b"{}"))):
        assert oci_hook_cmd.run(args) == 1
    assert err.getvalue() == f"refused: {SHOWN}\n"
    assert logged == [f"refused: {SHOWN}"]


def test_json_keeps_the_exact_value():
    out = io.StringIO()
    common.print_json({"command": EVIL}, out)
    assert json.loads(out.getvalue()) == {"command": EVIL}
    assert "\x1b" not in out.getvalue()  # JSON's own escaping


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.text(alphabet=st.one_of(st.sampled_from("\x1b\x07\r\n\x00\x7f\x85\x9b\u202e\u2069\u2028\udc80"),
                                  st.characters(codec="utf-8")), max_size=20))
def test_status_text_is_printable_whatever_the_names_hold(text):
    assert_printable_lines(format_status(hostile_status(text), now=100.0, intruders=True))
    assert_printable_lines(format_status(hostile_status(text), now=100.0, intruders=False))
