"""Affinity: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

Requests that share an affinity key (a session, a shared prompt prefix) go to the same
replica, so its prefix cache is reused. Every replica owns ``vnodes`` points on a 64-bit ring
(``blake2b("<id>#<k>")``: stable across processes and restarts, unlike ``hash()``). A key
hashes to a point and walks clockwise to the first replica that can take the request and has
fewer than

    ceil(balance * (in_flight over active replicas + 1) * speed / speed of active replicas)

requests in flight: its share of the fleet's load by learned capacity (``Replica.speed``), so
a fast card holds more keys' work before it spills and a slow one less. The bound keeps a hot
key from piling onto one replica: when its home is over it, the key moves to the next replica
on the ring, the same one every time, so the spill is sticky too. If every replica that can
take the request is over the bound, the first of them on the ring gets it. Requests without a
key fall back to weighted least-connections over learned capacity.

Cost: a bisection on the ring, then a walk that is short while most replicas are under the
bound (at most a ``1 / balance`` fraction of the active replicas can be at it) and have free
slots. When the walk runs long, which happens when the fleet is nearly saturated, the pick
ranks the few open replicas by ring distance instead (the same answer, in O(open log vnodes)).
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from router.replica import Replica, ReplicaState
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies.base import Strategy

RING = 1 << 64
WALK_BUDGET = 16
"""Ring points walked before the pick switches to ranking the open replicas instead."""


def ring_point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _weighted_load(r: Replica) -> float:
    return (r.in_flight + 1) / r.speed


class Affinity(Strategy):
    name = "affinity"
    walk_budget = WALK_BUDGET
    summary = "Same key, same replica (consistent hashing), with a bound on any one's load."

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        vnodes: int = 64,
        balance: float = 1.25,
        **params: Any,
    ) -> None:
        super().__init__(rng, **params)
        if isinstance(vnodes, bool) or not isinstance(vnodes, int) or not 1 <= vnodes <= 4096:
            raise ValueError(f"vnodes must be a whole number from 1 to 4096, not {vnodes!r}")
        if isinstance(balance, bool) or not isinstance(balance, int | float):
            raise ValueError(f"balance must be a number, not {balance!r}")
        if not (math.isfinite(balance) and balance >= 1.0):
            raise ValueError(f"balance must be at least 1.0 (1.25 allows 25% over), not {balance}")
        self.vnodes = vnodes
        self.balance = float(balance)
        self._points: list[int] = []
        self._owners: list[int] = []
        self._own_points: list[list[int]] = []
        self._active: list[bool] = []
        self._counted: list[int] = []  # in flight per replica, 0 unless active
        self._total = 0
        self._n_active = 0
        self._speeds: list[float] = []  # learned speed per replica, 0 unless active
        self._speed_total = 0.0
        self._fallback = ScoreIndex(_weighted_load)

    @classmethod
    def describe_params(cls) -> Mapping[str, str]:
        return {
            "vnodes": "ring points per replica; more spread keys more evenly (default 64)",
            "balance": "a replica takes a keyed request only below this multiple of the mean "
            "in-flight load (default 1.25)",
        }

    def rebuild(self) -> None:
        ring = sorted(
            (ring_point(f"{r.id}#{k}"), r.index) for r in self.pool for k in range(self.vnodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]
        self._own_points = [[] for _ in self.pool]
        for p, i in ring:
            self._own_points[i].append(p)
        self._active = [r.state is ReplicaState.ACTIVE for r in self.pool]
        self._counted = [
            r.in_flight if a else 0 for r, a in zip(self.pool, self._active, strict=True)
        ]
        self._total = sum(self._counted)
        self._n_active = sum(self._active)
        self._speeds = [r.speed if a else 0.0 for r, a in zip(self.pool, self._active, strict=True)]
        self._speed_total = sum(self._speeds)
        self._fallback.rebuild(self.pool)

    def update(self, replica: Replica) -> None:
        i = replica.index
        active = replica.state is ReplicaState.ACTIVE
        counted = replica.in_flight if active else 0
        self._total += counted - self._counted[i]
        self._n_active += active - self._active[i]
        self._counted[i] = counted
        self._active[i] = active
        speed = replica.speed if active else 0.0
        if speed != self._speeds[i]:
            self._speed_total += speed - self._speeds[i]
            self._speeds[i] = speed
            if not self._n_active:
                self._speed_total = 0.0  # no float drift left over when none is active
        self._fallback.update(replica)

    def load_bound(self) -> int:
        """In flight a replica of the fleet's mean capacity must stay under to take a keyed
        request (each replica's own bound scales with its capacity)."""
        if self._n_active == 0:
            return 0
        return math.ceil(self.balance * (self._total + 1) / self._n_active)

    def bound_for(self, r: Replica) -> float:
        """In flight this replica must stay under to take a keyed request."""
        if self._speed_total <= 0:
            return 0.0
        share = r.speed / self._speed_total
        return math.ceil(self.balance * (self._total + 1) * share)

    def pick(self, request: Request, now: float) -> Replica | None:
        key = request.affinity_key
        if key is None:
            return self._fallback.best(request)
        if self.pool.open_count == 0:
            return None
        return self._walk(request, ring_point(key))

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        """Keyed: how far clockwise the replica is from the key, as a fraction of the ring."""
        key = request.affinity_key
        if key is None:
            return _weighted_load(replica)
        return self.ring_distance(replica, key) / RING

    def note(self, request: Request, chosen: Replica | None) -> str:
        key = request.affinity_key
        if key is None:
            return "no affinity key: weighted least-connections over learned capacity"
        if not self._points:
            return f"key {key!r}: empty ring"
        home = self.pool.replicas[self._home(ring_point(key))]
        bound = f"load bound {self.bound_for(home):.0f} in flight on {home.id}"
        if chosen is home:
            return f"key {key!r}: its home replica ({bound})"
        return f"key {key!r}: home {home.id} full or at the bound; next on the ring ({bound})"

    def _home(self, h: int) -> int:
        return self._owners[bisect_left(self._points, h) % len(self._points)]

    def ring_distance(self, replica: Replica, key: str) -> int:
        """How far clockwise the replica's first point lies from the key's point."""
        return self._distance(replica.index, ring_point(key))

    def _distance(self, i: int, h: int) -> int:
        own = self._own_points[i]
        return (own[bisect_left(own, h) % len(own)] - h) % RING

    def _walk(self, request: Request, h: int) -> Replica | None:
        owners, replicas = self._owners, self.pool.replicas
        m = len(owners)
        start = bisect_left(self._points, h)
        seen: set[int] = set()
        fallback: Replica | None = None
        for step in range(min(m, self.walk_budget)):
            i = owners[(start + step) % m]
            if i in seen:
                continue
            seen.add(i)
            r = replicas[i]
            if r.can_take(request):
                if r.in_flight < self.bound_for(r):
                    return r
                if fallback is None:
                    fallback = r
        if m <= self.walk_budget:
            return fallback
        return self._nearest_open(request, h)

    def _nearest_open(self, request: Request, h: int) -> Replica | None:
        """The walk's answer, found from the open replicas' ring distances instead.

        Ordering replicas by the distance of their first point past ``h`` is the order the
        walk meets them in, so this is exact; it costs O(open log vnodes), which is small
        exactly when a long walk would be costly: when most replicas are full.
        """
        pool = self.pool
        nearest: tuple[int, int] | None = None
        under: tuple[int, int] | None = None
        for k in range(pool.open_count):
            r = pool.open_at(k)
            if not r.can_take(request):
                continue
            where = (self._distance(r.index, h), r.index)
            if nearest is None or where < nearest:
                nearest = where
            if r.in_flight < self.bound_for(r) and (under is None or where < under):
                under = where
        found = under if under is not None else nearest
        return None if found is None else pool.replicas[found[1]]
