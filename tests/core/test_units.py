"""Sizes mean what Kubernetes quantities mean: decimal SI suffixes, binary IEC
ones, whole bytes only; a hugepage size is a power of two (kernel kB = KiB).
Sizes printed for people are binary with IEC names (format_bytes)."""

from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from numa_agent.core.units import format_bytes, page_size_kb, parse_hugepage_size, parse_size

DECIMAL = {"k": 10 ** 3, "K": 10 ** 3, "KB": 10 ** 3, "M": 10 ** 6, "MB": 10 ** 6,
           "G": 10 ** 9, "GB": 10 ** 9, "T": 10 ** 12, "TB": 10 ** 12}
BINARY = {"Ki": 1 << 10, "KiB": 1 << 10, "Mi": 1 << 20, "MiB": 1 << 20, "Gi": 1 << 30,
          "GiB": 1 << 30, "Ti": 1 << 40, "TiB": 1 << 40}


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), ("0", 0), ("10B", 10), (" 16Gi ", 16 << 30),
    ("512M", 512_000_000), ("512MB", 512_000_000), ("512Mi", 512 << 20), ("512MiB", 512 << 20),
    ("1G", 10 ** 9), ("2048kB", 2_048_000),  # kB is the kernel's KiB only in hugepage sizes
    ("1.5Gi", 3 << 29), (".5k", 500), ("1e9", 10 ** 9), ("15E-1", None), ("2E", 2 * 10 ** 18),
])
def test_kubernetes_meanings(text, expected):
    if expected is None:
        with pytest.raises(ValueError, match="not a whole number of bytes"):
            parse_size(text)
    else:
        assert parse_size(text) == expected


@given(st.integers(0, 10 ** 6), st.sampled_from(sorted({**DECIMAL, **BINARY})))
def test_every_suffix_is_its_power(n, unit):
    assert parse_size(f"{n}{unit}") == n * {**DECIMAL, **BINARY}[unit]


@given(st.integers(0, (1 << 63) - 1))
def test_plain_bytes_and_integers_round_trip(n):
    assert parse_size(str(n)) == parse_size(n) == n


@pytest.mark.parametrize("text,message", [
    ("512m", "milli.*did you mean 512M \\(10\\^6\\) or 512Mi"),
    ("100m", "milli"),
    ("16gi", "case-sensitive.*did you mean 16Gi\\?"),
    ("1g", "did you mean 1G\\?"), ("3mib", "did you mean 3MiB\\?"),
    ("1.5", "not a whole number of bytes"), ("-1G", "must not be negative"),
    ("", "e.g. 512Mi"), ("M", "e.g. 512Mi"), ("12Q", "e.g. 512Mi"), ("0x10", "e.g. 512Mi"),
    ("1e9Gi", "e.g. 512Mi"), ("1e99", "e.g. 512Mi"), ("1e", "e.g. 512Mi"),
    ("10E", "larger than"), ("\uff11G", "e.g. 512Mi"),  # a fullwidth digit is not a digit here
])
def test_refusals_name_the_text_and_what_was_meant(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_size(text)
    assert repr(text) in str(info.value)


def test_booleans_and_negative_integers_are_refused():
    for value in (True, -1):
        with pytest.raises(ValueError):
            parse_size(value)


@pytest.mark.parametrize("text,kb", [
    ("2Mi", 2048), ("1Gi", 1 << 20), ("2048kB", 2048), ("64Ki", 64), (str(2 << 20), 2048),
    ("1GiB", 1 << 20),
])
def test_hugepage_sizes_in_kib(text, kb):
    assert parse_hugepage_size(text) == kb


@pytest.mark.parametrize("text,message", [
    ("2M", "2000000 bytes is not a power of two.*did you mean 2Mi\\?"),
    ("1GB", "did you mean 1Gi\\?"), ("2048K", "did you mean 2048Ki\\?"),
    ("3000kB", "not a power of two of at least 1 KiB$"), ("512", "at least 1 KiB"),
    ("2m", "milli"),
])
def test_a_hugepage_size_must_be_a_page_size(text, message):
    with pytest.raises(ValueError, match=message):
        parse_hugepage_size(text)


@given(st.integers(10, 40))
def test_every_power_of_two_page_size_parses_in_each_spelling(shift):
    size = 1 << shift
    spellings = [str(size), f"{size >> 10}Ki", f"{size >> 10}kB"]
    spellings += [f"{size >> 20}Mi"] if shift >= 20 else []
    assert {parse_hugepage_size(s) for s in spellings} == {size >> 10}


# ---- page_size_kb: a page size by any of its names (the kernel's, the cgroup's, Kubernetes')

@pytest.mark.parametrize("text,kb", [
    ("hugepages-2048kB", 2048), ("hugepages-1048576kB", 1 << 20),  # sysfs directories
    ("2048kB", 2048), ("2048 kB", 2048), ("64KB", 64), ("2048KB", 2048),  # the kernel's kB is KiB
    ("2MB", 2048), ("1GB", 1 << 20), ("2 MB", 2048), ("1TB", 1 << 30),  # hugetlb.2MB.max, runc
    ("hugepages-2Mi", 2048), ("hugepages-1Gi", 1 << 20),  # Kubernetes resource names
    ("2Mi", 2048), ("1GiB", 1 << 20), (str(2 << 20), 2048), (" 2MB ", 2048),  # as numa-run takes
])
def test_a_page_size_by_each_of_its_names(text, kb):
    assert page_size_kb(text) == kb


@pytest.mark.parametrize("text,message", [
    ("0KB", "not a power of two"), ("3MB", "not a power of two"), ("hugepages-3Mi", "not a power"),
    ("2M", "did you mean 2Mi\\?"), ("hugepages-2M", "did you mean 2Mi\\?"), ("huge", "'huge': expected a page size"),
    ("hugepages-", "invalid hugepage size"), ("\u0662MB", "invalid hugepage size"),
    ("1099511627776TB", "invalid hugepage size .*: larger than"),
])
def test_what_names_no_page_size_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        page_size_kb(text)


# ---- format_bytes: the one size formatter for people

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"),
    (KiB, "1 KiB"), (2 * MiB, "2 MiB"), (16 * GiB, "16 GiB"), (3 * TiB, "3 TiB"),
    (GiB + GiB // 2, "1.5 GiB"), (int(6.5 * GiB), "6.5 GiB"), (8455716864, "7.9 GiB"),
    (100 * GiB, "100 GiB"), (24 * GiB + 5, "24 GiB"), (10 * GiB + GiB // 2, "11 GiB"),
    (GiB + 1, "1.0 GiB"),            # rounded: the decimal says so
    (MiB - 1, "1.0 MiB"),            # 1023.99 KiB rounds up into the next unit
    (GiB - MiB // 2, "1.0 GiB"),
    (1 << 70, "1024 EiB"), (-2 * KiB, "-2 KiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@given(st.integers(0, 4), st.integers(1, 1023))  # parse_size stops at T
def test_whole_units_are_exact_and_read_back(power, count):
    n = count << (10 * power)
    text = format_bytes(n)
    assert "." not in text
    assert parse_size(text.replace(" ", "")) == n


UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


@given(st.integers(1024, 1 << 62))
@example(1792)  # 1.75 KiB shown as 1.8: off by exactly half a step
def test_one_decimal_below_ten_none_above_within_rounding(n):
    number, unit = format_bytes(n).split(" ")
    scale = 1 << (10 * (UNITS.index(unit) + 1))
    whole, _, decimals = number.partition(".")
    if decimals:
        assert len(decimals) == 1 and int(whole) < 10
        # Exact arithmetic: a half-step rounding is exactly scale/20 off, which floats overshoot.
        assert abs(Fraction(number) * scale - n) <= Fraction(scale, 20)
    else:
        assert int(whole) >= 10 or n % scale == 0
        assert abs(int(whole) * scale - n) <= scale / 2
