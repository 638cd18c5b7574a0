"""A Prometheus histogram that takes many equal observations at once.

An engine step gives every decoding sequence one token, so the inter-token latency histogram
gets the step's duration once per sequence: up to hundreds of equal observations a step.
prometheus_client's ``Histogram`` observes one at a time; this one adds ``n`` in O(log
buckets).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["WeightedHistogram", "one_two_five"]


class WeightedHistogram:
    """Bucket counts and a sum, observed ``n`` at a time."""

    def __init__(self, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must be increasing: {buckets}")
        self.bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value``."""
        self._counts[bisect.bisect_left(self.bounds, value)] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self._counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(bound, observations at or below it)`` for every bound, then ``+Inf``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self._counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def one_two_five(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit``: vLLM's buckets for token counts."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10
