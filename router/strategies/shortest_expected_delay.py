"""Shortest expected delay: the replica that would finish the request soonest.

The expected delay on replica ``r`` is ``(outstanding_cost(r) + request.cost) / weight(r)``:
the work queued there, this request included, over the replica's capacity. Counting the
incoming request is what sends a long request to a strong card even when a weak one has a
little less work queued.

Because the score depends on the request, no single heap key orders it. The pick is an exact
branch and bound instead: a heap keyed by ``outstanding_cost / weight`` is read in ascending
order; each replica's exact score is ``key + cost / weight``, and no replica later in the heap
can score below ``key_next + cost / max_weight``, so the scan stops once that bound reaches the
best exact score seen. Floating-point addition and division are monotone, so the bound holds
for the computed scores too. Replicas whose keys are close to the minimum are all that is read:
O(k log n), where k is small unless many replicas sit between the best key and the best score.
"""

from __future__ import annotations

import random
from contextlib import closing
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies._weights import MaxWeight
from router.strategies.base import Strategy


def _backlog(r: Replica) -> float:
    return r.outstanding_cost / r.weight


class ShortestExpectedDelay(Strategy):
    name = "shortest-expected-delay"
    summary = "Least (queued work + this request) / weight: where it would finish soonest."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._index = ScoreIndex(_backlog)
        self._max = MaxWeight()

    def rebuild(self) -> None:
        self._max.rebuild(self.pool)
        self._index.rebuild(self.pool)

    def update(self, replica: Replica) -> None:
        self._max.update(replica)
        self._index.update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        cost = request.cost
        floor = cost / self._max.value if self._max.value > 0 else 0.0
        best: Replica | None = None
        best_score = 0.0
        with closing(self._index.ascending(request)) as ordered:
            for r in ordered:
                backlog = _backlog(r)
                if best is not None and backlog + floor >= best_score:
                    break
                score = backlog + cost / r.weight
                if best is None or score < best_score:
                    best, best_score = r, score
        return best

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return _backlog(replica) + request.cost / replica.weight
