"""Backoff: the doubling waits between retries, as a value."""

from __future__ import annotations

import pytest

from numa_agent.core.backoff import Backoff


def test_each_wait_doubles_the_last_up_to_the_cap():
    backoff, waits = Backoff.starting(0.25, 4.0), []
    for _ in range(7):
        waits.append(backoff.delay)
        backoff = backoff.doubled()
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_cap_between_doublings_is_reached_not_passed():
    assert [Backoff.starting(0.5, 30.0).doubled().doubled().doubled().doubled().doubled().doubled().delay,
            Backoff(0.5, 30.0, 16.0).doubled().delay] == [30.0, 30.0]


def test_a_reset_starts_again_from_the_first_wait():
    worn = Backoff.starting(0.5, 30.0).doubled().doubled()
    assert worn.delay == 2.0
    assert worn.reset() == Backoff.starting(0.5, 30.0)


def test_a_value_is_not_changed_by_its_successors():
    first = Backoff.starting(1.0, 8.0)
    first.doubled()
    assert first.delay == 1.0


@pytest.mark.parametrize("draw, wait", [(0.0, 10.0), (0.5, 9.0), (0.999, 8.002)])
def test_jitter_cuts_a_wait_by_up_to_its_share_as_the_random_source_draws(draw, wait):
    assert Backoff(0.5, 30.0, 10.0).jittered(0.2, lambda: draw) == pytest.approx(wait)


@pytest.mark.parametrize("first, cap, delay", [(0.0, 1.0, 0.0), (2.0, 1.0, 2.0), (1.0, 4.0, 8.0),
                                               (1.0, 4.0, 0.5)])
def test_bounds_that_are_no_backoff_are_refused(first, cap, delay):
    with pytest.raises(ValueError):
        Backoff(first, cap, delay)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_jitter_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError):
        Backoff.starting(1.0, 2.0).jittered(share, lambda: 0.5)
