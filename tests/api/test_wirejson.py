"""The client's JSON (numa_agent.api.wirejson) against the json module: the same text
written, the same values read, the same errors raised. Derandomized."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_agent.api import wirejson

CORPUS = settings(max_examples=1000, derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])

# Every code point, surrogates and controls included (hypothesis leaves surrogates out
# unless asked).
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
                   max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(10 ** 30), 10 ** 30),
                    any_text, st.sampled_from(["", '"', "\\", "\x7f", "é", "\U0001F600", "\udc80"]))
requests = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(any_text, inner, max_size=4)), max_leaves=20)
answers = st.recursive(
    st.one_of(scalars, st.floats(allow_nan=False), st.floats(allow_nan=False, width=32)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)),
    max_leaves=20)


def outcome(read, text):
    """What reading `text` gives: ("value", its repr: order and float spelling count) or
    ("error", the exception's type and message)."""
    try:
        return "value", repr(read(text))
    except Exception as exc:  # compared, not swallowed
        return "error", type(exc), str(exc)


# ---------------------------------------------------------------- writing
@CORPUS
@given(requests)
def test_dumps_writes_what_json_writes(value):
    assert wirejson.dumps(value) == json.dumps(value)


@pytest.mark.parametrize("value", [1.5, {"x": [float("inf")]}, {1: "a"}, {"a": {2: 3}}, b"x",
                                   {("a",): 1}, {True: 1}, {None: 2}])
def test_what_it_does_not_write_itself_json_writes_or_refuses(value):
    assert outcome(wirejson.dumps, value) == outcome(json.dumps, value)


def test_a_cycle_is_json_s_error():
    cycle: list = []
    cycle.append(cycle)
    assert outcome(wirejson.dumps, cycle) == outcome(json.dumps, cycle)


# ---------------------------------------------------------------- reading
@CORPUS
@given(answers, st.sampled_from([{}, {"indent": 1}, {"separators": (",", ":")},
                                 {"ensure_ascii": False}, {"indent": "\t", "ensure_ascii": False}]))
def test_loads_reads_what_json_reads(value, style):
    text = json.dumps(value, **style)
    assert outcome(wirejson.loads, text) == outcome(json.loads, text)
    raw = text.encode("utf-8", "surrogatepass")
    assert outcome(wirejson.loads, raw) == outcome(json.loads, raw)


JSONISH = st.lists(st.sampled_from(list('{}[]:,"\\/ \t\n\r-+.eE0123456789abfnrtu') + [
    "true", "false", "null", "NaN", "Infinity", "\\u00e9", "\\ud83d", "\\ude00", "\\u", "\x01",
    "\ufeff", "é"]), max_size=30).map("".join)


@CORPUS
@given(JSONISH)
def test_anything_else_gets_json_s_answer_or_error(text):
    assert outcome(wirejson.loads, text) == outcome(json.loads, text)
    raw = text.encode("utf-8", "surrogatepass")
    assert outcome(wirejson.loads, raw) == outcome(json.loads, raw)


@pytest.mark.parametrize("raw", [
    b'{"a": 1}', b' \n{"a": [1, -0, 2.5e3, 1E-2, true, false, null]} ', b'"\\ud83d\\ude00"',
    b'"\\ud83d"', b"[1,]", b"01", b"-", b"1.", b"1e", b'{"a" 1}', b"[1 2]", b"", b"  ",
    b"\xef\xbb\xbf{}", b'{"a": 1}\xff', "{}".encode("utf-16"), b"\x00\x00\x00[", b"[" * 100000,
    b"1" * 5000, b'"\x1f"', b'"\\x"', b'"\\u12G4"', b"NaN", b"[-Infinity]", b'{"a": 1, "a": 2}',
])
def test_edge_cases_read_as_json_reads_them(raw):
    assert outcome(wirejson.loads, raw) == outcome(json.loads, raw)


def test_an_admission_record_is_read_without_the_json_module():
    record = {"name": "true-1", "cpus": "1", "exclusive": True, "mems": [0], "created_unix": 1796375475.604009,
              "command": ["sh", "-c", "echo \"é\" \\ \t"], "isolation": None, "explanation": {
                  "free": {"0": {"cpus": 1, "memory_bytes": 9086771200}}}}
    assert wirejson._Reader(json.dumps(record)).document() == record


def test_a_large_answer_is_left_to_json(monkeypatch):
    monkeypatch.setattr(wirejson, "_Reader", None)  # reading it here would fail
    raw = json.dumps({"workloads": [{"name": f"w{i}", "cpus": "1"} for i in range(2000)]}).encode()
    assert len(raw) > wirejson.LARGE
    assert wirejson.loads(raw) == json.loads(raw)
