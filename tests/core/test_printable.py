"""core.printable: what a person reads holds no control, lone surrogate or bidi control,
stays readable (ordinary Unicode kept) and tells distinct inputs apart."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.core.names import is_workload_name
from numa_agent.core.printable import printable, printable_doc

PROPERTY = settings(max_examples=500, derandomize=True, database=None, deadline=None)

BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
HOSTILE = ["\x1b", "\x07", "\r", "\n", "\x00", "\x7f", "\x9b", "\x85", "\u202e", "\u2066", "\u2028",
           "\udc9b", "\t"]
# Text as a hostile name is made of: anything, weighted towards what does harm.
texts = st.text(alphabet=st.one_of(st.characters(codec=None), st.sampled_from(HOSTILE)), max_size=30)


def harmful(ch: str) -> bool:
    code = ord(ch)
    return (unicodedata.category(ch) in ("Cc", "Cs") or code in BIDI or code in (0x2028, 0x2029))


def test_escapes_are_visible_and_named_as_people_read_them():
    assert printable("\x1b]0;owned\x07") == "\\x1b]0;owned\\x07"
    assert printable("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert printable("\x00\x7f\x9b") == "\\x00\\x7f\\x9b"
    assert printable("\u202egnp.exe") == "\\u202egnp.exe"
    assert printable("bad\udcff") == "bad\\udcff"  # an undecodable byte read with surrogateescape


def test_ordinary_text_and_unicode_are_kept():
    for text in ("web-1", "Zoë Ünal", "数据库", "café ☕", "emoji 👩\u200d💻", "tab-less \u00a0nbsp", "a\\b"):
        assert printable(text) == text


@PROPERTY
@given(texts)
def test_output_has_no_control_surrogate_or_bidi_character(text):
    assert not any(harmful(ch) for ch in printable(text))


@PROPERTY
@given(texts)
def test_idempotent(text):
    once = printable(text)
    assert printable(once) == once


@PROPERTY
@given(texts, texts, st.sampled_from(HOSTILE), st.sampled_from(HOSTILE))
def test_inputs_differing_in_a_control_stay_distinct(head, tail, one, other):
    if one != other:
        assert printable(head + one + tail) != printable(head + other + tail)
    assert printable(head + one + tail) != printable(head + tail)


@PROPERTY
@given(texts, texts)
def test_injective_without_backslashes(one, other):
    if "\\" not in one + other and one != other:
        assert printable(one) != printable(other)


@PROPERTY
@given(st.text(max_size=20))
def test_valid_names_are_shown_as_they_are(text):
    if is_workload_name(text):
        assert printable(text) == text


def test_names_refuse_every_harmful_character():
    # Workload and pod names are checked before anything holds them: none can carry one.
    for ch in HOSTILE:
        assert not is_workload_name(f"web{ch}1") and not is_workload_name(f"web1{ch}")


def test_documents_are_escaped_throughout_keys_included():
    doc = {"name": "a\x1b", "n": 3, "list": ["\x07", None, {"k\r": True}], "ok": 1.5}
    assert printable_doc(doc) == {"name": "a\\x1b", "n": 3, "list": ["\\x07", None, {"k\\r": True}], "ok": 1.5}
