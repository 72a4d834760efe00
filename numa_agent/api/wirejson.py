"""JSON for the client's requests and answers without the json module, whose import
(it imports re, with enum and the rest) costs numa-run more than its whole request.

`dumps` writes what json.dumps writes with its defaults, for what a request holds:
dicts with str keys, lists, tuples, str, int, bool and None; anything else (a
float, another type) goes to json.dumps itself. `loads` reads what json.loads
reads, or leaves the text to json.loads whenever it meets anything it does not
take with certainty: floats' special names, a \\u escape of a surrogate, an
encoding other than UTF-8, a syntax error (json then raises its own error).
tests/api/test_wirejson.py holds both to json's answers.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import Any

# json.dumps' escapes with ensure_ascii: its short ones, else \uXXXX (a character
# beyond the BMP as its UTF-16 surrogate pair).
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                  "\b": "\\b", "\f": "\\f"}
_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_UNESCAPE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Unsure(Exception):
    """Left to the json module."""


# ------------------------------------------------------------------ encoding
def dumps(value: Any) -> str:
    """json.dumps(value)."""
    try:
        return _encode(value)
    except (_Unsure, RecursionError):  # json's own error for a cycle, or its own way
        import json

        return json.dumps(value)


def _encode(value: Any) -> str:
    # bool before int: True is an int; exact types, as a subclass may print otherwise.
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int:
        return int.__repr__(value)
    if kind is list or kind is tuple:
        return "[" + ", ".join(_encode(item) for item in value) + "]"
    if kind is dict:
        if not all(type(key) is str for key in value):
            raise _Unsure  # json converts other keys its own way
        return "{" + ", ".join(f"{_string(key)}: {_encode(item)}" for key, item in value.items()) + "}"
    raise _Unsure


def _string(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'  # nothing to escape: the common case
    out = []
    for char in text:
        code = ord(char)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
    return '"' + "".join(out) + '"'


# ------------------------------------------------------------------ decoding
# Reading here costs about ten times json's C reader per byte: past this size (a
# listing of many workloads, not an admission) json's import is the smaller cost.
LARGE = 32 * 1024


def loads(raw: bytes | str) -> Any:
    """json.loads(raw)."""
    if len(raw) > LARGE:
        import json

        return json.loads(raw)
    try:
        return _Reader(_text(raw)).document()
    except (_Unsure, RecursionError, ValueError):
        import json

        return json.loads(raw)


def _text(raw: bytes | str) -> str:
    if isinstance(raw, str):
        return raw
    # json.loads reads bytes as UTF-8 unless a BOM or NUL bytes say UTF-16 or 32.
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or raw[:3] == b"\xef\xbb\xbf" or b"\0" in raw[:4]:
        raise _Unsure
    return raw.decode("utf-8", "surrogatepass")


class _Reader:
    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def document(self) -> Any:
        self.skip_space()
        value = self.value()
        self.skip_space()
        if self.pos != len(self.text):
            raise _Unsure  # extra data
        return value

    def skip_space(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        self.pos = pos

    def value(self) -> Any:
        text, pos = self.text, self.pos
        char = text[pos:pos + 1]
        if char == '"':
            return self.string()
        if char == "{":
            return self.object()
        if char == "[":
            return self.array()
        if char == "-" or (char and char in _DIGITS):
            return self.number()
        for word, value in (("true", True), ("false", False), ("null", None)):
            if text.startswith(word, pos):
                self.pos = pos + len(word)
                return value
        raise _Unsure  # NaN, Infinity, or not JSON

    def object(self) -> dict[str, Any]:
        self.pos += 1  # {
        result: dict[str, Any] = {}
        self.skip_space()
        if self.text[self.pos:self.pos + 1] == "}":
            self.pos += 1
            return result
        while True:
            if self.text[self.pos:self.pos + 1] != '"':
                raise _Unsure
            key = self.string()
            self.skip_space()
            if self.text[self.pos:self.pos + 1] != ":":
                raise _Unsure
            self.pos += 1
            self.skip_space()
            result[key] = self.value()
            self.skip_space()
            if not self.end_or_comma("}"):
                return result

    def array(self) -> list[Any]:
        self.pos += 1  # [
        result: list[Any] = []
        self.skip_space()
        if self.text[self.pos:self.pos + 1] == "]":
            self.pos += 1
            return result
        while True:
            result.append(self.value())
            self.skip_space()
            if not self.end_or_comma("]"):
                return result

    def end_or_comma(self, close: str) -> bool:
        """After an item: True at a comma (another item follows), False at `close`."""
        char = self.text[self.pos:self.pos + 1]
        self.pos += 1
        if char == close:
            return False
        if char != ",":
            raise _Unsure
        self.skip_space()
        return True

    def number(self) -> int | float:
        text, start = self.text, self.pos
        pos = start + 1 if text[start] == "-" else start
        digits = self.digits(pos)
        if digits == pos or (text[pos] == "0" and digits > pos + 1):
            raise _Unsure  # "-" alone, or a leading zero
        pos, is_float = digits, False
        if text[pos:pos + 1] == ".":
            if self.digits(pos + 1) == pos + 1:
                raise _Unsure
            pos, is_float = self.digits(pos + 1), True
        if text[pos:pos + 1] in ("e", "E"):
            sign = pos + 2 if text[pos + 1:pos + 2] in ("+", "-") else pos + 1
            if self.digits(sign) == sign:
                raise _Unsure
            pos, is_float = self.digits(sign), True
        self.pos = pos
        return float(text[start:pos]) if is_float else int(text[start:pos])

    def digits(self, pos: int) -> int:
        """The end of the ASCII digits from `pos`."""
        text = self.text
        while pos < len(text) and text[pos] in _DIGITS:
            pos += 1
        return pos

    def string(self) -> str:
        text = self.text
        start = self.pos + 1  # after the opening quote
        end = text.find('"', start)
        if end < 0:
            raise _Unsure
        plain = text[start:end]
        if "\\" not in plain:
            if not plain.isprintable() and any(ord(c) < 0x20 for c in plain):
                raise _Unsure  # a control character: json refuses it
            self.pos = end + 1
            return plain
        parts: list[str] = []
        pos = start
        while True:
            end = pos
            while end < len(text) and text[end] not in '"\\' and ord(text[end]) >= 0x20:
                end += 1
            parts.append(text[pos:end])
            char = text[end:end + 1]
            if char == '"':
                self.pos = end + 1
                return "".join(parts)
            if char != "\\":
                raise _Unsure  # the end of the text, or a control character
            escape = text[end + 1:end + 2]
            if escape in _UNESCAPE:
                parts.append(_UNESCAPE[escape])
                pos = end + 2
            elif escape == "u":
                hex_digits = text[end + 2:end + 6]
                if len(hex_digits) != 4 or any(c not in _HEX for c in hex_digits):
                    raise _Unsure
                code = int(hex_digits, 16)
                if 0xD800 <= code <= 0xDFFF:
                    raise _Unsure  # surrogates, paired or not: json's rules
                parts.append(chr(code))
                pos = end + 6
            else:
                raise _Unsure
