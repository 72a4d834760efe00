"""Waits between retries that double from a first wait up to a cap.

A value: each caller keeps the one it is at and takes the next from it, so
the rule (double, cap, start again) is written once and the caller's bounds
stay its own. No clock and no random source of its own: the caller adds the
wait to its clock and passes what draws the jitter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Backoff:
    """`delay`, the wait due now, between `first` and `cap` (seconds)."""

    first: float
    cap: float
    delay: float

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.delay <= self.cap:
            raise ValueError(f"a backoff needs 0 < first <= delay <= cap, got first {self.first}, "
                             f"delay {self.delay}, cap {self.cap}")

    @classmethod
    def starting(cls, first: float, cap: float) -> Backoff:
        """The first wait of a backoff from `first` to `cap`."""
        return cls(first, cap, first)

    def doubled(self) -> Backoff:
        """The wait after this one: twice as long, at most the cap."""
        return replace(self, delay=min(self.delay * 2, self.cap))

    def reset(self) -> Backoff:
        """Back to the first wait (what was retried succeeded)."""
        return replace(self, delay=self.first)

    def jittered(self, share: float, draw: Callable[[], float]) -> float:
        """The wait cut by up to `share` of itself, by what `draw()` returns
        in [0, 1) (random.random): callers on many machines fall out of step."""
        if not 0 <= share <= 1:
            raise ValueError(f"a jitter share is between 0 and 1, got {share}")
        return self.delay * (1 - share * draw())


__all__ = ["Backoff"]
