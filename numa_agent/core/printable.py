"""Text from processes, containers and users made safe to show a person.

A process name, a command line, a user name from a directory service, a cgroup path,
an annotation: anyone can put ESC, BEL, CR or a bidi override in them, and a terminal
or a log reader that gets them raw retitles or clears the screen, forges a second log
line or shows the text reversed. `printable` renders those characters as visible
escapes and leaves every other character, ordinary Unicode included, as it is:

- C0 controls, DEL and C1 controls: `\\t`, `\\n`, `\\r`, else `\\xHH`;
- lone surrogates (undecodable bytes read with surrogateescape): `\\udcHH`;
- the bidi controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) and the
  line and paragraph separators (U+2028, U+2029): `\\uHHHH`.

A backslash is left as it is, so `printable` is idempotent (a message quoting
`repr(name)`, or text escaped once already, is not escaped again) and distinct inputs
without a backslash stay distinct; a name holding the four characters `\\x1b` reads
like one holding ESC, which does no harm.

It is applied where text reaches a person (the commands' renderers, the log formatter,
metrics label values), never to the state: the JSON API keeps the exact value, which
JSON's own escaping carries safely. Standard library only, no import: numa-run's error
path uses it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import Any

_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_FORMAT = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)


def _escape(code: int) -> str:
    return _NAMED.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


# One str.translate table: C0, DEL, C1 and the format characters above (surrogates
# are handled apart: 2048 entries would only slow the table's build).
_TABLE = {code: _escape(code) for code in (*range(0x20), *range(0x7F, 0xA0), *_FORMAT)}


def printable(text: str) -> str:
    """`text` with every control, lone surrogate and bidi control as a visible escape."""
    if text.isprintable():  # the usual case: nothing to escape (every escaped character is not)
        return text
    out = text.translate(_TABLE)
    if any("\ud800" <= ch <= "\udfff" for ch in out):
        out = "".join(f"\\u{ord(ch):04x}" if "\ud800" <= ch <= "\udfff" else ch for ch in out)
    return out


def printable_doc(value: Any) -> Any:
    """A JSON-like document (dicts, lists, strings, numbers) with every string in it,
    keys included, made `printable`: for renderers that lay it out as text."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_doc(k) if isinstance(k, str) else k: printable_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_doc(v) for v in value]
    if isinstance(value, tuple):
        return tuple(printable_doc(v) for v in value)
    return value
