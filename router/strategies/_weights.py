"""Weight bookkeeping shared by the weighted strategies: the fleet's largest weight, and
drawing an open replica with probability proportional to its weight.

"Weight" is a function of the replica: the fixed splits use the effective weight
(``Replica.weight``), power of two choices the learned speed (``Replica.speed``).

Drawing is rejection sampling over the pool's open index: pick an open replica uniformly in
O(1), keep it with probability ``weight / max_weight``. Conditioned on acceptance that is
exactly weight-proportional, so a bounded number of tries followed by an exact O(n) scan gives
an exactly weight-proportional draw overall, at O(1) expected cost while the open replicas'
mean weight is not tiny next to the largest one.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Callable, Iterable

from router.pool import ReplicaPool
from router.replica import Replica

WeightOf = Callable[[Replica], float]


def effective_weight(r: Replica) -> float:
    return r.weight


DRAW_TRIES = 16
"""Rejection tries before the exact scan; at acceptance 1/2 all fail with odds 1.5e-5."""
SCAN_BELOW = 4
"""Open replicas up to which the exact scan is cheaper than rejection tries that may miss."""


class MaxWeight:
    """The largest effective weight among some replicas, kept current as weights change."""

    __slots__ = ("_weights", "value", "weight_of")

    def __init__(self, weight_of: WeightOf = effective_weight) -> None:
        self.weight_of = weight_of
        self._weights: dict[int, float] = {}
        self.value = 0.0

    def rebuild(self, replicas: Iterable[Replica]) -> None:
        self._weights = {r.index: self.weight_of(r) for r in replicas}
        self.value = max(self._weights.values(), default=0.0)

    def update(self, replica: Replica) -> None:
        old = self._weights[replica.index]
        new = self.weight_of(replica)
        if new == old:
            return
        self._weights[replica.index] = new
        if new > self.value:
            self.value = new
        elif old == self.value:
            # The heaviest replica got lighter: O(n), but weights change on operator or tuner
            # time scales (seconds), not per request.
            self.value = max(self._weights.values())


def draw_weighted(
    pool: ReplicaPool,
    rng: random.Random,
    max_weight: float,
    accept: Callable[[Replica], bool],
    weight_of: WeightOf = effective_weight,
) -> Replica | None:
    """An open replica passing ``accept``, drawn with probability proportional to weight."""
    n = pool.open_count
    if n <= SCAN_BELOW:
        return scan_weighted(pool, rng, accept, weight_of)
    for _ in range(DRAW_TRIES):
        r = pool.open_at(rng.randrange(n))
        if rng.random() * max_weight < weight_of(r) and accept(r):
            return r
    return scan_weighted(pool, rng, accept, weight_of)


def scan_weighted(
    pool: ReplicaPool,
    rng: random.Random,
    accept: Callable[[Replica], bool],
    weight_of: WeightOf = effective_weight,
) -> Replica | None:
    """The exact O(n) draw: cumulative weights over the open replicas that pass ``accept``."""
    chosen: list[Replica] = []
    cumulative: list[float] = []
    total = 0.0
    for i in range(pool.open_count):
        r = pool.open_at(i)
        if accept(r):
            total += weight_of(r)
            chosen.append(r)
            cumulative.append(total)
    if not chosen:
        return None
    # min(): rng.random() * total may round up to total itself.
    return chosen[min(bisect_right(cumulative, rng.random() * total), len(chosen) - 1)]
