"""Smooth weighted round-robin in O(log n): earliest eligible virtual deadline first.

nginx's smooth weighted round-robin adds every replica's weight to its counter, takes the
largest counter and subtracts the total weight from it: O(n) per pick. For weights 5, 1, 1 it
sends ``a a b a c a a``, the light replicas spread through the heavy one's turns.

This is the same schedule problem solved as a fair queueing scheduler (EEVDF, the rule of
WF2Q and of Linux's EEVDF CPU scheduler). Each replica owns a virtual start time ``S`` and a
deadline ``F = S + 1/weight``; a pick goes to the replica with the earliest deadline among
those already *eligible* (``S <= V``), after which its ``S`` becomes its old ``F``, and the
virtual clock ``V`` moves by ``1 / (total weight of open replicas)``. Two heaps make it
O(log n): pending replicas by ``S``, eligible ones by ``(F, index)``.

Smoothness. The eligibility test is what spreads the light replicas: with deadlines alone
(plain EDF or stride scheduling) weights 5, 1, 1 give ``a a a a a b c`` from a cold start,
five heavy picks in a row. With it the cycle is ``a b a a c a a``; each replica's pick count
stays within one pick of its exact share ``t * weight / total`` at every prefix ``t``, and the
longest run of the heavy replica, across cycle boundaries too, is 3 (nginx: 4). The tests
check these.

Skipping. A replica that cannot take this particular request (it failed it, or the request
does not fit) keeps its place and deadline, so it is first in line for the next request: it is
not penalised. A replica that was full or inactive re-enters at ``S = max(S, V)``: it neither
loses its turn nor returns with credit hoarded while it was away, which would otherwise be
spent as a burst. Weight changes take effect at once: the deadline is recomputed from ``S``.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies.base import Strategy

Entry = tuple[float, int, int]  # (virtual time, replica index, version)

_REL_EPS = 1e-12
"""Eligibility tolerance, relative to V: summing 1/7 seven times must still reach 1.0."""


class WeightedRoundRobin(Strategy):
    name = "weighted-round-robin"
    books_kv = False
    summary = "Turns in proportion to weight, interleaved evenly (smooth, like nginx)."

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        super().__init__(rng, **params)
        self._vtime = 0.0
        self._start: list[float] = []
        self._weight: list[float] = []
        self._open: list[bool] = []
        self._version: list[int] = []
        self._open_weight = 0.0
        self._pending: list[Entry] = []  # by virtual start time
        self._eligible: list[Entry] = []  # by virtual deadline
        self._last: tuple[int, float] | None = None  # the last pick and its deadline

    def rebuild(self) -> None:
        n = len(self.pool)
        self._vtime = 0.0
        self._start = [0.0] * n
        self._weight = [r.weight for r in self.pool]
        self._open = [r.has_slot for r in self.pool]
        self._version = [0] * n
        self._open_weight = sum(r.weight for r in self.pool if r.has_slot)
        self._pending = [(0.0, r.index, 0) for r in self.pool if r.has_slot]
        self._eligible = []
        self._last = None

    def update(self, replica: Replica) -> None:
        i = replica.index
        was_open, is_open = self._open[i], replica.has_slot
        if was_open == is_open and self._weight[i] == replica.weight:
            return  # load changed, place in the schedule did not: the common case, O(1)
        if was_open:
            self._open_weight -= self._weight[i]
        self._version[i] += 1
        self._weight[i] = replica.weight
        self._open[i] = is_open
        if is_open:
            self._open_weight += replica.weight
            if not was_open:
                self._start[i] = max(self._start[i], self._vtime)
            heapq.heappush(self._pending, (self._start[i], i, self._version[i]))
            if len(self._pending) + len(self._eligible) > 4 * len(self._open) + 64:
                self._compact()

    def pick(self, request: Request, now: float) -> Replica | None:
        while True:
            self._release()
            r = self._take_eligible(request)
            if r is not None:
                self._charge(r)
                return r
            if not self._skip_ahead():
                return None

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        """The replica's virtual deadline: the earliest eligible one goes next.

        The replica just picked shows the deadline it won with, not its next one, so that an
        explanation taken right after the pick shows why it won.
        """
        i = replica.index
        if self._last is not None and self._last[0] == i:
            return self._last[1]
        return self._start[i] + 1.0 / self._weight[i]

    def note(self, request: Request, chosen: Replica | None) -> str:
        return f"virtual time {self._vtime:.4g}"

    def _release(self) -> None:
        """Move replicas whose virtual start time has come into the eligible heap."""
        pending, eligible, version = self._pending, self._eligible, self._version
        limit = self._vtime * (1.0 + _REL_EPS) + _REL_EPS
        while pending and pending[0][0] <= limit:
            _, i, v = heapq.heappop(pending)
            if version[i] == v:
                heapq.heappush(eligible, (self._start[i] + 1.0 / self._weight[i], i, v))

    def _take_eligible(self, request: Request) -> Replica | None:
        """Pop the earliest-deadline eligible replica that can take the request."""
        eligible, version, replicas = self._eligible, self._version, self.pool.replicas
        aside: list[Entry] = []
        found: Replica | None = None
        while eligible:
            entry = heapq.heappop(eligible)
            if version[entry[1]] != entry[2]:
                continue
            r = replicas[entry[1]]
            if r.can_take(request):
                found = r
                break
            aside.append(entry)
        for entry in aside:
            heapq.heappush(eligible, entry)
        return found

    def _skip_ahead(self) -> bool:
        """No eligible replica can take it: move V to the next start time (as WF2Q+ does)."""
        pending, version = self._pending, self._version
        while pending and version[pending[0][1]] != pending[0][2]:
            heapq.heappop(pending)
        if not pending:
            return False
        self._vtime = max(self._vtime, pending[0][0])
        return True

    def _charge(self, r: Replica) -> None:
        i = r.index
        self._start[i] += 1.0 / self._weight[i]
        self._last = (i, self._start[i])
        heapq.heappush(self._pending, (self._start[i], i, self._version[i]))
        self._vtime += 1.0 / self._open_weight

    def _compact(self) -> None:
        version = self._version
        self._pending = [e for e in self._pending if version[e[1]] == e[2]]
        self._eligible = [e for e in self._eligible if version[e[1]] == e[2]]
        heapq.heapify(self._pending)
        heapq.heapify(self._eligible)
        # Re-summed here so that rounding in the running total cannot build up.
        self._open_weight = sum(
            w for w, is_open in zip(self._weight, self._open, strict=True) if is_open
        )
