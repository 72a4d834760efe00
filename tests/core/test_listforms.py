import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_agent.core.cpuset import CpuSet
from numa_agent.core.listforms import ListFormError, parse_list_form, resolve

ids = st.sets(st.integers(min_value=0, max_value=255), min_size=1, max_size=40)


@st.composite
def machines(draw):
    """A machine's ids and an allowed subset of them (its cpuset)."""
    machine = draw(ids)
    allowed = draw(st.sets(st.sampled_from(sorted(machine)), min_size=1))
    return CpuSet(machine), CpuSet(allowed)


def parse(text, machine, allowed):
    return resolve(parse_list_form(text), machine=machine, allowed=allowed)


@given(machines(), st.data())
def test_plain_list_round_trips_through_cpuset(m, data):
    machine, allowed = m
    chosen = CpuSet(data.draw(st.sets(st.sampled_from(machine.ids()), min_size=1)))
    form = parse_list_form(chosen.format())
    assert not form.needs_context
    assert parse(chosen.format(), machine, allowed) == chosen


@given(machines(), st.data())
def test_inversion_is_the_machine_minus_the_list(m, data):
    machine, allowed = m
    chosen = CpuSet(data.draw(st.sets(st.sampled_from(machine.ids()), min_size=1)))
    rest = machine - chosen
    if rest:
        assert parse("!" + chosen.format(), machine, allowed) == rest
    else:
        with pytest.raises(ListFormError, match="names no CPU"):
            parse("!" + chosen.format(), machine, allowed)


@given(machines(), st.data())
def test_relative_list_picks_positions_in_the_allowed_set(m, data):
    machine, allowed = m
    positions = CpuSet(data.draw(st.sets(st.integers(0, len(allowed) - 1), min_size=1)))
    expected = CpuSet(allowed.ids()[i] for i in positions)
    assert parse("+" + positions.format(), machine, allowed) == expected
    assert expected.issubset(allowed)
    if machine - expected:
        assert parse("!+" + positions.format(), machine, allowed) == machine - expected


@given(machines())
def test_all_is_the_allowed_set_and_its_inverse_the_rest(m):
    machine, allowed = m
    assert parse("all", machine, allowed) == allowed
    assert parse("+all", machine, allowed) == allowed
    if machine - allowed:
        assert parse("!all", machine, allowed) == machine - allowed


def test_relative_position_beyond_the_allowed_set_is_refused():
    with pytest.raises(ListFormError, match="position 3 is beyond the 2 allowed"):
        parse("+0,3", CpuSet.parse("0-7"), CpuSet.parse("4-5"))


@pytest.mark.parametrize("text", ["", "!", "+", "a", "1-", "0-99999999", "3-1", "al", "all,1"])
def test_not_a_list(text):
    with pytest.raises(ListFormError, match="invalid CPU list"):
        parse_list_form(text)


def test_hex_mask_is_refused_with_the_list_it_stands_for():
    # numactl's -C reads numbers with strtoul(base 0): "0x3" is CPU 3 to it, never a mask.
    with pytest.raises(ListFormError, match=r"no hex mask.*0x3 is CPUs 0-1"):
        parse_list_form("0x3")
    with pytest.raises(ListFormError, match=r"0xff,00000000 is CPUs 32-39"):
        parse_list_form("0xff,00000000")
    with pytest.raises(ListFormError, match="not a node list"):
        parse_list_form("0x1", what="NUMA node")


def test_ids_above_the_bound_are_refused_before_parsing():
    with pytest.raises(ListFormError):
        parse_list_form("1024", what="NUMA node", highest=1023)
    assert parse_list_form("1023", what="NUMA node", highest=1023).ids == CpuSet([1023])
