"""Sizes as people write them: "512M", "16Gi", "1G", "2048kB", "4096".

Binary units throughout (K = KiB, M = MiB ...), as numactl, the kernel's
meminfo and hugepage directory names use them. Pure and dependency-free, so
numa-run can import it without slowing its start.
"""

from __future__ import annotations

_UNITS = {"": 1, "b": 1,
          "k": 1 << 10, "ki": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
          "m": 1 << 20, "mi": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gi": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "ti": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from a size; ValueError with the accepted forms otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"invalid size {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"invalid size {text}: must not be negative")
        return text
    stripped = str(text).strip()
    digits = len(stripped) - len(stripped.lstrip("0123456789"))
    number, unit = stripped[:digits], stripped[digits:].strip().lower()
    if not number or unit not in _UNITS or len(number) > 18:
        raise ValueError(f"invalid size {text!r}: use a whole number with an optional unit "
                         "K/Ki/KB, M/Mi/MB, G/Gi/GB, T (all binary), e.g. 512M or 16Gi")
    return int(number) * _UNITS[unit]
