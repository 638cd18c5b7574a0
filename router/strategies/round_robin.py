"""Round-robin: each replica in turn, skipping those that cannot take the request."""

from __future__ import annotations

import random
from bisect import bisect_left, insort
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies.base import Strategy


class RoundRobin(Strategy):
    name = "round-robin"
    books_kv = False
    summary = "Each replica in turn; ignores speed and load (the baseline)."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._cursor = 0
        # Indexes of replicas with a free slot, sorted: the turn walks only these, so a
        # nearly saturated fleet (the usual state when picks happen, one per freed slot)
        # costs a bisection instead of a scan past every full replica.
        self._open: list[int] = []
        self._is_open: list[bool] = []

    def rebuild(self) -> None:
        self._is_open = [r.has_slot for r in self.pool]
        self._open = [r.index for r in self.pool if r.has_slot]

    def update(self, replica: Replica) -> None:
        i = replica.index
        if replica.has_slot == self._is_open[i]:
            return
        self._is_open[i] = replica.has_slot
        if replica.has_slot:
            insort(self._open, i)
        else:
            del self._open[bisect_left(self._open, i)]

    def pick(self, request: Request, now: float) -> Replica | None:
        replicas, order = self.pool.replicas, self._open
        m = len(order)
        start = bisect_left(order, self._cursor)
        # The walk passes only open replicas that cannot take this particular request
        # (it failed there, or it does not fit): rare, so amortised O(log n).
        for step in range(m):
            r = replicas[order[(start + step) % m]]
            if r.can_take(request):
                self._cursor = (r.index + 1) % len(replicas)
                return r
        return None

    def note(self, request: Request, chosen: Replica | None) -> str:
        return f"next in turn: position {self._cursor}"
