"""Least-connections and weighted least-connections, over a heap of open replicas."""

from __future__ import annotations

import random
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies.base import Strategy


class LeastConnections(Strategy):
    name = "least-connections"
    summary = "Fewest requests in flight; ties go to the replica idle longest."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._index = ScoreIndex(self.key)

    def key(self, r: Replica) -> float:
        return float(r.in_flight)

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
    summary = "Fewest requests in flight per unit of weight: strong cards take more."

    def key(self, r: Replica) -> float:
        # Counting the request about to be placed makes an idle heavy replica beat an idle
        # light one, instead of both scoring zero.
        return (r.in_flight + 1) / r.weight
