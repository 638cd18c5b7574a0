"""Least-connections and weighted least-connections, over a heap of open replicas.

Both count requests in flight relative to the replica's learned capacity
(``Replica.speed``, router/capacity.py): a card measured three times as fast is as loaded with
three times the requests. Counting alone would hold the same number of requests on a fast card
as on a slow one, and so load the slow one past what it can do.
"""

from __future__ import annotations

import random
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies.base import Strategy


class LeastConnections(Strategy):
    name = "least-connections"
    summary = "Fewest requests in flight per unit of learned capacity; ties: idle longest."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._index = ScoreIndex(self.key)

    def key(self, r: Replica) -> float:
        return r.in_flight / r.speed

    def rebuild(self) -> None:
        self._index.rebuild(self.pool)

    def update(self, replica: Replica) -> None:
        self._index.update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        return self._index.best(request)

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return self.key(replica)


class WeightedLeastConnections(LeastConnections):
    name = "weighted-least-connections"
    summary = "Fewest requests in flight, this one counted, per unit of learned capacity."

    def key(self, r: Replica) -> float:
        # Counting the request about to be placed makes an idle fast replica beat an idle
        # slow one, instead of both scoring zero.
        return (r.in_flight + 1) / r.speed
