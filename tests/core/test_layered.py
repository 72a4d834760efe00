"""Layered behaves exactly like a dict copied and changed, along any run of
changes, across the folds of its top layer into a new base."""

from __future__ import annotations

import random

import pytest

from numa_agent.core.layered import FOLD, Layered


@pytest.mark.parametrize("seed", range(6))
def test_a_run_of_changes_matches_copied_dicts(seed):
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(40)]
    ref = {k: rng.random() for k in keys[:20]}
    layered = Layered(ref)
    history = [(layered, dict(ref))]
    for _ in range(5 * FOLD):
        changes = {rng.choice(keys): rng.random() for _ in range(rng.randrange(0, 3))}
        removed = rng.sample(keys, rng.randrange(0, 3))
        layered = layered.updated(changes, removed)
        ref = {k: v for k, v in ref.items() if k not in removed}
        ref.update(changes)
        history.append((layered, dict(ref)))
    for mapping, expected in history:  # the earlier mappings are unchanged by the later ones
        assert dict(mapping) == expected and mapping == expected and len(mapping) == len(expected)
        items = mapping.items()
        assert dict(items) == expected and sorted(items) == sorted(expected.items()) and len(items) == len(expected)
        for key in keys:
            assert (key in mapping) == (key in expected)
            assert mapping.get(key) == expected.get(key)
            if key in expected:
                assert mapping[key] == expected[key]
            else:
                with pytest.raises(KeyError):
                    mapping[key]


def test_the_top_layer_stays_small():
    layered = Layered({i: i for i in range(1000)})
    for i in range(10 * FOLD):
        layered = layered.updated({i: -i}, [1000 - i])
        assert len(layered._top) <= FOLD
