"""Power of two choices over peak-EWMA latency (Finagle's and Linkerd's balancer).

Two distinct replicas that can take the request are drawn, each with probability
proportional to its weight, and the one with the lower expected cost wins:

    cost = latency * (in_flight + 1)

where ``latency`` is the replica's peak EWMA of seconds per unit of request cost. Drawing by
weight means a slow card is drawn less often, so it cannot win on luck of the draw as often as
it would under uniform draws; comparing measured latency corrects the weights when they are
wrong. A replica with no sample yet gets a prior: the median of the known latencies scaled by
``median weight / its weight`` (a card twice as heavy is assumed twice as fast), or
``prior_latency / weight`` while no replica has a sample. Ties go to the heavier replica.

The prior needs medians; they are kept in sorted lists updated only when a replica's latency
value changes (at completions), so a pick stays O(1) expected plus two bisections.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, insort
from collections.abc import Mapping
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._weights import MaxWeight, draw_weighted
from router.strategies.base import Strategy


class _Median:
    """A sorted multiset of floats with O(log n) search; the memmove on change is C-fast."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: list[float] = []

    def add(self, value: float) -> None:
        insort(self._values, value)

    def remove(self, value: float) -> None:
        del self._values[bisect_left(self._values, value)]

    def median(self) -> float | None:
        v = self._values
        if not v:
            return None
        mid = len(v) // 2
        return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


class P2CPeakEwma(Strategy):
    name = "p2c-peak-ewma"
    summary = "Best of two weight-drawn replicas by latency x (in flight + 1)."

    def __init__(
        self, rng: random.Random | None = None, *, prior_latency: float = 1.0, **params: Any
    ) -> None:
        super().__init__(rng, **params)
        if isinstance(prior_latency, bool) or not isinstance(prior_latency, int | float):
            raise ValueError(f"prior_latency must be a number, not {prior_latency!r}")
        if not (math.isfinite(prior_latency) and prior_latency > 0):
            raise ValueError(f"prior_latency must be a positive number, not {prior_latency!r}")
        self.prior_latency = float(prior_latency)
        self._max = MaxWeight()
        self._known: dict[int, tuple[float, float]] = {}  # index -> (latency, weight) as filed
        self._latencies = _Median()
        self._weights = _Median()

    @classmethod
    def describe_params(cls) -> Mapping[str, str]:
        return {
            "prior_latency": "seconds per unit of cost assumed for a weight-1 replica while no "
            "replica has a latency sample (default 1.0; only ratios matter then)",
        }

    def rebuild(self) -> None:
        self._max.rebuild(self.pool)
        self._known.clear()
        self._latencies = _Median()
        self._weights = _Median()
        for r in self.pool:
            self._file(r)

    def update(self, replica: Replica) -> None:
        self._max.update(replica)
        self._file(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        first = draw_weighted(self.pool, self.rng, self._max.value, lambda r: r.can_take(request))
        if first is None or self.pool.open_count == 1:
            return first
        second = draw_weighted(
            self.pool, self.rng, self._max.value, lambda r: r is not first and r.can_take(request)
        )
        if second is None:
            return first
        return first if self._rank(first) <= self._rank(second) else second

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return self._cost(replica)

    def note(self, request: Request, chosen: Replica | None) -> str:
        if chosen is None or chosen.latency.value is not None:
            return ""
        return "no latency sample yet: prior from the fleet's median, scaled by weight"

    def latency_estimate(self, r: Replica) -> float:
        """Measured seconds per unit of cost, or the weight-scaled prior before any sample."""
        value = r.latency.value
        if value is not None:
            return value
        median = self._latencies.median()
        if median is None:
            return self.prior_latency / r.weight
        median_weight = self._weights.median()
        assert median_weight is not None  # filed together with the latencies
        return median * median_weight / r.weight

    def _cost(self, r: Replica) -> float:
        return self.latency_estimate(r) * (r.in_flight + 1)

    def _rank(self, r: Replica) -> tuple[float, float]:
        return (self._cost(r), -r.weight)

    def _file(self, r: Replica) -> None:
        """Keep the medians current; a no-op unless the latency or weight changed."""
        value = r.latency.value
        now = None if value is None else (value, r.weight)
        old = self._known.get(r.index)
        if now == old:
            return
        if old is not None:
            self._latencies.remove(old[0])
            self._weights.remove(old[1])
        if now is None:
            del self._known[r.index]
            return
        self._known[r.index] = now
        self._latencies.add(now[0])
        self._weights.add(now[1])
