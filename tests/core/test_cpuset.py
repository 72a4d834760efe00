import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.hints import NumaMask

cpu_ids = st.sets(st.integers(min_value=0, max_value=2048), max_size=200)


@given(cpu_ids)
def test_list_round_trip(ids):
    s = CpuSet(ids)
    assert CpuSet.parse(s.format()) == s
    assert set(s) == ids


@given(cpu_ids)
def test_mask_round_trip(ids):
    s = CpuSet(ids)
    assert CpuSet.parse_mask(s.format_mask()) == s


@given(cpu_ids, cpu_ids)
def test_algebra_agrees_with_python_sets(a, b):
    x, y = CpuSet(a), CpuSet(b)
    assert set(x | y) == a | b
    assert set(x & y) == a & b
    assert set(x - y) == a - b
    assert set(x ^ y) == a ^ b
    assert x.issubset(y) == (a <= b)
    assert x.isdisjoint(y) == a.isdisjoint(b)
    assert len(x) == len(a)


@given(cpu_ids)
def test_format_is_sorted_ranges(ids):
    text = CpuSet(ids).format()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        assert not hi or int(lo) < int(hi)


@pytest.mark.parametrize("text, expected", [
    ("0-3,8-11\n", "0-3,8-11"),
    ("0-3\n\x00", "0-3"),
    ("\x00\n", ""),
    ("", ""),
    (" 1 , 3-4 ", "1,3-4"),
    ("0-7:2", "0,2,4,6"),
    (b"5\n", "5"),
])
def test_parse_tolerates_kernel_noise(text, expected):
    assert CpuSet.parse(text).format() == expected


@pytest.mark.parametrize("text, expected", [
    ("ff,ffffffff\n", "0-39"),
    ("00000000,0000ffff", "0-15"),
    ("00000003\x00\n", "0-1"),
    ("0", ""),
])
def test_parse_mask(text, expected):
    assert CpuSet.parse_mask(text).format() == expected


@pytest.mark.parametrize("bad", ["a", "3-1", "1,,2", "-1", "0-", "1:0"])
def test_bad_lists_raise_clear_error(bad):
    with pytest.raises(CpuSetParseError, match="CPU list"):
        CpuSet.parse(bad)


def test_bad_mask_raises():
    with pytest.raises(CpuSetParseError, match="CPU mask"):
        CpuSet.parse_mask("zz,00")


@pytest.mark.parametrize("make, message", [(CpuSet, "CPU id must be >= 0, got -1"),
                                           (NumaMask, "NUMA node id must be >= 0, got -1")])
def test_a_negative_id_is_refused_naming_what_it_is(make, message):
    with pytest.raises(ValueError, match=message):
        make([0, -1])


def test_cpu_sets_and_numa_masks_keep_one_bit_per_id():
    assert CpuSet([3, 0, 3]).bits == NumaMask((0, 3)).bits == 0b1001
