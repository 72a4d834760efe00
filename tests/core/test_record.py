from __future__ import annotations

import copy
import pickle

import pytest

from numa_agent.core.listforms import ListForm
from numa_agent.core.mempolicy import MemoryPolicy
from numa_agent.core.record import Record
from numa_agent.enforcement.mempolicy import PolicyResult


class Pair(Record):
    __slots__ = ("left", "right")
    DEFAULTS = {"right": 0}


class Other(Record):
    __slots__ = ("left", "right")


def test_built_by_position_name_and_default():
    assert Pair(1, 2).values() == (1, 2)
    assert Pair(1, right=3).values() == (1, 3)
    assert Pair(left=4).values() == (4, 0)


@pytest.mark.parametrize("args,kwargs", [((), {}), ((1, 2, 3), {}), ((1,), {"left": 2}),
                                         ((1,), {"middle": 2})])
def test_wrong_arguments_are_a_type_error(args, kwargs):
    with pytest.raises(TypeError):
        Pair(*args, **kwargs)


def test_equal_and_hashed_by_type_and_values():
    assert Pair(1, 2) == Pair(1, 2) and hash(Pair(1, 2)) == hash(Pair(1, 2))
    assert Pair(1, 2) != Pair(1, 3)
    assert Pair(1, 2) != Other(1, 2)
    assert Pair(1, 2) != (1, 2)
    assert len({Pair(1, 2), Pair(1, 2), Pair(2, 1)}) == 2


def test_immutable():
    pair = Pair(1, 2)
    with pytest.raises(AttributeError):
        pair.left = 5
    with pytest.raises(AttributeError):
        del pair.right
    assert pair.left == 1


def test_printed_with_its_fields():
    assert repr(Pair(1, "x")) == "Pair(left=1, right='x')"


@pytest.mark.parametrize("value", [MemoryPolicy(3, (0, 1)), PolicyResult(False, "why", "EINVAL"),
                                   ListForm("0-1", None, relative=True)])
def test_copied_and_pickled_as_itself(value):
    assert copy.copy(value) == value
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value


def test_a_falsy_result_stays_falsy():
    assert not PolicyResult(False, "why") and PolicyResult(True)
