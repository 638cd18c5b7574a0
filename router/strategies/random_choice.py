"""Random and weighted random: a draw among the replicas that can take the request.

Both sample the pool's open index in O(1) and reject replicas that cannot take this particular
request (it failed there, or it does not fit). Rejection keeps the draw exact: conditioned on
acceptance every eligible replica is equally likely (or weight-proportional), and the O(n)
fallback scan after a bounded number of tries draws from the same distribution.
"""

from __future__ import annotations

import random
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._weights import DRAW_TRIES, MaxWeight, draw_weighted
from router.strategies.base import Strategy


class RandomChoice(Strategy):
    name = "random"
    books_kv = False
    summary = "Uniformly at random among replicas with a free slot; ignores speed and load."

    def pick(self, request: Request, now: float) -> Replica | None:
        pool, rng = self.pool, self.rng
        n = pool.open_count
        if n == 0:
            return None
        for _ in range(DRAW_TRIES):
            r = pool.open_at(rng.randrange(n))
            if r.can_take(request):
                return r
        candidates = (pool.open_at(i) for i in range(n))
        eligible = [r for r in candidates if r.can_take(request)]
        return rng.choice(eligible) if eligible else None


class WeightedRandom(Strategy):
    name = "weighted-random"
    books_kv = False
    summary = "At random, with odds proportional to weight: strong cards are drawn more often."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._max = MaxWeight()

    def rebuild(self) -> None:
        self._max.rebuild(self.pool)

    def update(self, replica: Replica) -> None:
        self._max.update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        return draw_weighted(self.pool, self.rng, self._max.value, lambda r: r.can_take(request))
