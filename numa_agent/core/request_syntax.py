"""The syntax of a request's resource values, written once: numa-run's options,
`numa-agent explain` and the container engines' annotations read them here.

Pure, dependency-light (numa-run imports it before every workload). Each parser
raises ValueError whose message names the text and the expected form.
"""

from __future__ import annotations

from numa_agent.core import units

COUNT_DIGITS = 18  # what the API's 64-bit counts hold


def parse_count(text: str, what: str, low: int = 0) -> int:
    """A whole number >= `low`: "4" -> 4."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < low:
        raise ValueError(f"invalid {what} {text!r}: expected a whole number >= {low}")
    if len(text) > COUNT_DIGITS:
        raise ValueError(f"invalid {what} {text!r}: at most {COUNT_DIGITS} digits")
    return int(text)


def parse_hugepages_item(text: str) -> tuple[str, int]:
    """"2Mi=512" -> ("2048", 512): page size in kB as the API wants it."""
    size_text, sep, count_text = text.partition("=")
    if not sep:
        raise ValueError(f"invalid hugepages {text!r}: expected SIZE=COUNT, e.g. 2Mi=512")
    size_kb = units.parse_hugepage_size(size_text)
    return str(size_kb), parse_count(count_text, "hugepage count")


def parse_device_item(text: str) -> tuple[str, int]:
    """"gpu=1" -> ("gpu", 1); a bare "gpu" means one."""
    resource, sep, count_text = text.partition("=")
    if not resource.strip():
        raise ValueError(f"invalid device {text!r}: expected RESOURCE=COUNT, e.g. gpu=1")
    return resource.strip(), parse_count(count_text, "device count", low=1) if sep else 1
