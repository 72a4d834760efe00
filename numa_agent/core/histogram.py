"""A histogram of observations in fixed buckets, kept as Prometheus exposes one."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class Histogram:
    """Observations in fixed buckets; snapshot() gives them cumulative, as Prometheus does."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1

    def snapshot(self) -> dict:
        cumulative, running = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            cumulative.append([bound, running])
        return {"buckets": cumulative, "sum": self.sum, "count": self.count}
