"""Power of two choices over learned capacity and peak-EWMA slowdown.

Two distinct replicas that can take the request are drawn, each with probability proportional
to its learned capacity (``Replica.speed``, router/capacity.py), and the one that would finish
the request sooner wins:

    cost = expected_seconds * slowdown

``expected_seconds`` is the work already on the replica plus this request over its learned
rate (``Replica.expected_seconds``). ``slowdown`` compares each finished request's measured
duration with what was expected when it was sent, averaged over a few seconds (a single
request that shared its engine with many later arrivals says little): the peak EWMA of that
(Finagle's and Linkerd's: it jumps at once when a replica turns slow and recovers gradually)
over its plain long-run average for that replica (``Replica.slowdown_factor``, at least 1).
The long-run average takes out what is usual for the replica (requests share the engine with
later arrivals), so only a replica slower *now* than it usually is pays, before its learned
rate catches up.

Why draws by capacity: with uniform draws a replica is a candidate in about 2/n of the picks,
so a card several times faster than the rest could never take its share however well it
compares. Drawn by capacity, a fast card is a candidate as often as its speed warrants.
Ties go to the faster replica.
"""

from __future__ import annotations

import random
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._weights import MaxWeight, draw_weighted
from router.strategies.base import Strategy


def _speed(r: Replica) -> float:
    return r.speed


def _slowdown(r: Replica) -> float:
    return r.slowdown_factor()


class P2CPeakEwma(Strategy):
    name = "p2c-peak-ewma"
    summary = "Best of two capacity-drawn replicas by expected time x peak-EWMA slowdown."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._max = MaxWeight(_speed)

    def rebuild(self) -> None:
        self._max.rebuild(self.pool)

    def update(self, replica: Replica) -> None:
        self._max.update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        first = draw_weighted(
            self.pool, self.rng, self._max.value, lambda r: r.can_take(request), _speed
        )
        if first is None or self.pool.open_count == 1:
            return first
        second = draw_weighted(
            self.pool,
            self.rng,
            self._max.value,
            lambda r: r is not first and r.can_take(request),
            _speed,
        )
        if second is None:
            return first
        return first if self._rank(first, request) <= self._rank(second, request) else second

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return self.cost(replica, request)

    def note(self, request: Request, chosen: Replica | None) -> str:
        if chosen is None:
            return "score = expected seconds at learned capacity x slowdown"
        return f"score = expected seconds x slowdown ({_slowdown(chosen):.2f} on {chosen.id})"

    def cost(self, r: Replica, request: Request) -> float:
        """Expected seconds to finish the request there, corrected by recent slowdown."""
        return r.expected_seconds(request.cost) * _slowdown(r)

    def _rank(self, r: Replica, request: Request) -> tuple[float, float]:
        return (self.cost(r, request), -r.speed)
