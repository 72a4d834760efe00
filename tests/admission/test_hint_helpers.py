"""NumaMask's bit helpers and HintSet's typed fields, as the managers use them."""

from numa_agent.admission.memory_manager import MemoryAllocation, usage_from
from numa_agent.core.hints import HintSet, NumaMask, TopologyHint


def test_bit_helpers_agree_with_the_mask():
    m = NumaMask([0, 3, 9, 63])
    assert NumaMask.nodes_of(m.bits) == m.nodes() == (0, 3, 9, 63)
    assert NumaMask.lowest_node(m.bits) == 0 and NumaMask.lowest_node(0b1000) == 3
    assert m.lowest() == 0 and NumaMask().lowest() is None
    assert list(NumaMask.single_bits(0b1010)) == [0b10, 0b1000]
    assert NumaMask.bits_of([1, 2]) == 0b110 == NumaMask.bits_of(NumaMask([1, 2]))
    assert NumaMask.is_subset_bits(0b10, 0b110) and not NumaMask.is_subset_bits(0b1, 0b110)
    assert NumaMask([1]).issubset(NumaMask([1, 2])) and not NumaMask([0]).issubset(NumaMask([1]))


def test_generated_hint_set_fields_are_called_directly():
    hs = HintSet.generated(NumaMask([0, 1]), lambda m: 1 in m, 1,
                           also_preferred=lambda m: m.count() == 2, monotone=True)
    assert hs.fits is not None and hs.fits(NumaMask([1])) and not hs.fits(NumaMask([0]))
    assert hs.is_preferred(NumaMask([0, 1])) and hs.contains_fit is None
    assert [str(h) for h in hs.hints()] == ["{1} preferred", "{0,1} preferred"]


def test_memory_usage_exposes_read_only_indexes():
    usage = usage_from([MemoryAllocation(NumaMask([0, 1]), ((0, "memory", 5),))])
    assert dict(usage.allocated_index) == {(0, "memory"): 5}
    assert dict(usage.group_bits) == {0: 0b11, 1: 0b11}
    try:
        usage.group_bits[2] = 1  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("group_bits must be read-only")


def test_a_mask_copies_and_pickles_as_the_value_it_is():
    # Immutable, so it cannot be filled in field by field: copy and pickle build it anew,
    # as the other value types do (a decision that holds masks can be deep-copied or sent).
    import copy
    import pickle

    mask = NumaMask([0, 2, 63])
    for clone in (copy.copy(mask), copy.deepcopy(mask), pickle.loads(pickle.dumps(mask))):
        assert clone == mask and clone.nodes() == (0, 2, 63) and hash(clone) == hash(mask)
    hint = TopologyHint(mask, True)
    assert copy.deepcopy(hint) == hint
