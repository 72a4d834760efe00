"""Sizes as people write them, with the meaning of Kubernetes quantities.

One meaning product-wide (numa-run, numa-agent explain, the config): a bare or
SI suffix is decimal (k/K, M, G, T, P, E and KB, MB, GB, TB, PB, EB: powers of
1000), an IEC suffix binary (Ki, Mi, Gi, Ti, Pi, Ei and KiB ... EiB: powers
of 1024), as the kubelet reads `512M` and `512Mi`. Suffixes are case-sensitive
as in Kubernetes, where `m` is milli: a size is whole bytes, so `512m` is
refused with the sizes that were probably meant. A decimal point or exponent
(`1.5Gi`, `1e9`) is accepted when the result is whole bytes.

The kernel's own `kB` (hugepages-2048kB, /proc/meminfo) is KiB only in a
hugepage size, which names a kernel page size and so must be a power of two.

Pure and dependency-free, so numa-run can import it without slowing its start (re
is imported by the functions that read a size, not by a launch that gives none).
"""

from __future__ import annotations

_DECIMAL = {"k": 10 ** 3, "K": 10 ** 3, "kB": 10 ** 3, "KB": 10 ** 3,
            "M": 10 ** 6, "MB": 10 ** 6, "G": 10 ** 9, "GB": 10 ** 9,
            "T": 10 ** 12, "TB": 10 ** 12, "P": 10 ** 15, "PB": 10 ** 15,
            "E": 10 ** 18, "EB": 10 ** 18}
_BINARY = {f"{p}i{b}": 1 << (10 * i) for i, p in enumerate("KMGTPE", 1) for b in ("", "B")}
_UNITS = {"": 1, "B": 1, **_DECIMAL, **_BINARY}

# Kubernetes' number forms: 12, 1.5, .5, 1e9, 5E-3 (an "E" without digits is exa).
_SIZE = r"(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?:[eE](?P<exp>[+-]?[0-9]+))?\s*(?P<unit>[A-Za-z]*)"
_MAX = (1 << 63) - 1  # a Kubernetes quantity's int64
_ACCEPTED = ("use a whole number of bytes with an optional unit: k/K, M, G, T (decimal: 1000, "
             "1000^2 ... as in Kubernetes) or Ki, Mi, Gi, Ti (binary: 1024, 1024^2 ...), "
             "e.g. 512Mi or 16Gi")


def parse_size(text: str | int) -> int:
    """Bytes from a size; ValueError naming the text and the accepted forms otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"invalid size {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"invalid size {text}: must not be negative")
        return text
    stripped = str(text).strip()
    if stripped.startswith("-"):
        raise ValueError(f"invalid size {text!r}: must not be negative")
    import re  # compiled once, in re's own cache

    m = re.fullmatch(_SIZE, stripped)
    if m is None or not (m["int"] or m["frac"]) or len(m["int"] + (m["frac"] or "")) > 30 \
            or (m["exp"] is not None and (m["unit"] or abs(int(m["exp"])) > 30)):
        raise ValueError(f"invalid size {text!r}: {_ACCEPTED}")
    unit = m["unit"]
    if unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}: {_unit_hint(stripped[:m.start('unit')].strip(), unit)}")
    frac = m["frac"] or ""
    scale = int(m["exp"] or 0) - len(frac)  # value = digits * 10^scale * unit
    numerator = int(m["int"] + frac or "0") * _UNITS[unit]
    if scale >= 0:
        value = numerator * 10 ** scale
    else:
        value, rest = divmod(numerator, 10 ** -scale)
        if rest:
            raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    if value > _MAX:
        raise ValueError(f"invalid size {text!r}: larger than {_MAX} bytes")
    return value


def _unit_hint(number: str, unit: str) -> str:
    """Why `unit` is not a unit, and what was probably meant."""
    if unit == "m":
        return (f"m is milli (a thousandth) in Kubernetes quantities and a size is whole bytes; "
                f"did you mean {number}M (10^6) or {number}Mi (2^20)?")
    near = [u for u in _UNITS if u and u.lower() == unit.lower() and unit != "e"]  # 1e: no exa
    if near:
        return f"units are case-sensitive, as in Kubernetes; did you mean {' or '.join(number + u for u in near)}?"
    return _ACCEPTED


def parse_hugepage_size(text: str | int) -> int:
    """A hugepage size in KiB: "2Mi", "1Gi", the kernel's "2048kB" (KiB here),
    or bytes. A size that is not a power of two (`2M` is 2,000,000 bytes) is
    refused with the binary spelling that was probably meant."""
    stripped = str(text).strip()
    if isinstance(text, str) and stripped.endswith("kB") and stripped[:-2].isascii() and stripped[:-2].isdigit():
        size = int(stripped[:-2]) * 1024  # the kernel's kB, as in hugepages-2048kB
    else:
        size = parse_size(text)
    if size >= 1024 and size & (size - 1) == 0:
        return size // 1024
    import re

    m = re.fullmatch(_SIZE, stripped)
    hint = ""
    if m and m["unit"] in _DECIMAL:  # 2M -> 2Mi, 1GB -> 1Gi, when that is a page size
        meant = f"{stripped[:m.start('unit')].strip()}{m['unit'][0].upper()}i"
        if (bytes_meant := parse_size(meant)) & (bytes_meant - 1) == 0:
            hint = f"; did you mean {meant}?"
    raise ValueError(f"invalid hugepage size {text!r}: {size} bytes is not a power of two of at "
                     f"least 1 KiB{hint}")


# The names a page size goes by outside the product's own syntax. The kernel
# writes KB, MB, GB (hugetlb.2MB.max, runc's page sizes) and kB (sysfs
# hugepages-2048kB, /proc/meminfo) for binary units; Kubernetes names the
# resource hugepages-2Mi. Only here, where the text can only be a page size.
_KERNEL_PAGE = r"([0-9]{1,19})\s*([kKMGT])B"
_HUGEPAGES = "hugepages-"
_PAGE_NAMES = "expected a page size such as 2Mi, 1Gi, 2048kB, 2MB, hugepages-2Mi or hugepages-2048kB"


def page_size_kb(text: str) -> int:
    """A hugepage size in KiB from any name it goes by: the kernel's sysfs
    directory `hugepages-2048kB` or its `2048kB`, the hugetlb controller's
    `2MB`, `1GB`, `64KB` (binary, as in hugetlb.2MB.max), a Kubernetes
    resource `hugepages-2Mi`, `hugepages-1Gi`, or what parse_hugepage_size
    takes (`2Mi`, bytes). ValueError naming the text otherwise, and for a size
    that is not a power of two."""
    import re

    size = str(text).strip()
    size = size[len(_HUGEPAGES):] if size.startswith(_HUGEPAGES) else size
    m = re.fullmatch(_KERNEL_PAGE, size)
    if m is None:
        try:
            return parse_hugepage_size(size)
        except ValueError as exc:  # its reason, for the text as given
            reason = str(exc).removeprefix(f"invalid size {size!r}: ")
            reason = reason.removeprefix(f"invalid hugepage size {size!r}: ")
            raise ValueError(f"invalid hugepage size {text!r}: "
                             f"{_PAGE_NAMES if reason == _ACCEPTED else reason}") from None
    size_kb = int(m[1]) << (10 * "KMGT".index(m[2].upper()))
    if not size_kb or size_kb & (size_kb - 1):
        raise ValueError(f"invalid hugepage size {text!r}: not a power of two")
    if size_kb << 10 > _MAX:
        raise ValueError(f"invalid hugepage size {text!r}: larger than {_MAX} bytes")
    return size_kb


# Sizes for people: one formatter for every message, table and log line
# (JSON and metrics keep bytes). Binary units with their IEC names, never the
# ambiguous M or G, whichever way the size was written.
_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int) -> str:
    """"512 B", "2 GiB", "6.5 GiB", "24 GiB": the largest binary unit the
    size reaches, one decimal below 10 of it and none above; a whole number
    of the unit is written without a decimal, so "1.0 GiB" is a rounded
    size and "1 GiB" an exact one. Integer arithmetic: exact at any size."""
    if n < 0:
        return "-" + format_bytes(-n)
    power = min((n.bit_length() - 1) // 10, len(_IEC) - 1) if n else 0
    while True:
        unit = 1 << (10 * power)
        if n % unit == 0:
            return f"{n // unit} {_IEC[power]}"
        tenths = (n * 10 + unit // 2) // unit  # rounded half up
        if tenths < 100:
            return f"{tenths // 10}.{tenths % 10} {_IEC[power]}"
        whole = (n + unit // 2) // unit
        if whole < 1024 or power == len(_IEC) - 1:
            return f"{whole} {_IEC[power]}"
        power += 1  # 1023.6 MiB rounds to 1024 MiB: say 1.0 GiB


def page_size_text(size_kb: int) -> str:
    """"2 MiB (2048kB)": a hugepage size for people, then as the kernel and the API name it."""
    return f"{format_bytes(size_kb << 10)} ({size_kb}kB)"
