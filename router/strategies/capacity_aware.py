"""Capacity-aware: only replicas whose KV cache has room for the request now.

A replica holds a request's whole context (prompt plus the most it may generate) in its KV
cache. ``Replica.fits`` already refuses a request larger than the cache; this strategy also
refuses a replica whose cache is too full *now*, so the engine does not preempt or swap:

    free = kv_capacity - tokens held by its running requests       (router accounting)
    free = (1 - kv_usage) * kv_capacity    when telemetry is fresh  (the engine's own view)

``kv_capacity`` is what the router learned (``Replica.kv_tokens``: the engine's own
``vllm:cache_config_info``, else the fleet file, else the performance model). Fresh means
younger than ``stale_after_s``; stale telemetry is never trusted. A replica whose engine
says, freshly, that requests are waiting in its own queue takes no more while it runs some of
ours: they would only wait there, where no other replica can take them, so they wait in the
router's queue instead. Among replicas with ``free >= request.total_tokens`` the one with the
least outstanding cost per unit of learned capacity wins. A replica with unknown KV capacity
counts as unlimited. When none has room the pick is None and the request waits in the queue
for memory to free up.

Held tokens are summed in ``update`` (O(requests on that replica)); the pick walks the
least-outstanding-cost heap and stops at the first replica with room: O(k log n), where k is
the number of replicas passed over for lack of room. Past 16 of them it switches to one plain
pass over the open replicas, O(open). That is the cost when the fleet's KV caches are full
while slots are free: room depends on telemetry, which arrives without ``pool.changed``, so
it can be read only at pick time, replica by replica.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from contextlib import closing
from dataclasses import replace
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies.base import Explanation, Strategy

UNLIMITED = math.inf
WALK_BUDGET = 16
"""Replicas passed over in the heap, for lack of room, before switching to one plain pass."""


def _outstanding(r: Replica) -> float:
    return r.outstanding_cost / r.speed


class CapacityAware(Strategy):
    name = "capacity-aware"
    walk_budget = WALK_BUDGET
    summary = "Least work per capacity among replicas with KV room and no engine queue."

    def __init__(
        self, rng: random.Random | None = None, *, stale_after_s: float = 3.0, **params: Any
    ) -> None:
        super().__init__(rng, **params)
        if isinstance(stale_after_s, bool) or not isinstance(stale_after_s, int | float):
            raise ValueError(f"stale_after_s must be a number of seconds, not {stale_after_s!r}")
        if not (math.isfinite(stale_after_s) and stale_after_s > 0):
            raise ValueError(f"stale_after_s must be positive, not {stale_after_s!r}")
        self.stale_after_s = float(stale_after_s)
        self._index = ScoreIndex(_outstanding)
        self._held: list[int] = []

    @classmethod
    def describe_params(cls) -> Mapping[str, str]:
        return {
            "stale_after_s": "age beyond which a replica's KV-usage telemetry is ignored and "
            "the router's own accounting is used (default 3.0)",
        }

    def rebuild(self) -> None:
        self._held = [_held_tokens(r) for r in self.pool]
        self._index.rebuild(self.pool)

    def update(self, replica: Replica) -> None:
        self._held[replica.index] = _held_tokens(replica)
        self._index.update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        need = request.total_tokens
        with closing(self._index.ascending(request)) as ordered:
            for looked, r in enumerate(ordered):
                if self._free(r, now) >= need and not self._queueing(r, now):
                    return r
                if looked == self.walk_budget:
                    break
            else:
                return None
        return self._scan(request, now, need)

    def _scan(self, request: Request, now: float, need: int) -> Replica | None:
        """The walk's answer by one pass over the open replicas: a plain loop reads each
        replica once, where the heap walk pays a pop and a push for each one passed over."""
        pool = self.pool
        best: Replica | None = None
        for i in range(pool.open_count):
            r = pool.open_at(i)
            if best is not None and _outstanding(r) >= _outstanding(best):
                continue
            if self._free(r, now) >= need and not self._queueing(r, now) and r.can_take(request):
                best = r
        return best

    def _queueing(self, r: Replica, now: float) -> bool:
        """The engine said, freshly, that requests wait in its own queue, and we still have
        at least as many in flight there as it was running: its batch is full. Compared with
        what it ran, not the queue alone, so a reading a second old does not hold requests
        back once ours have finished."""
        e = r.engine
        return (
            e is not None
            and e.waiting is not None
            and e.waiting > 0
            and r.in_flight > 0
            and r.in_flight >= (e.running or 0)
            and now - e.received_at < self.stale_after_s
        )

    def free_tokens(self, r: Replica, now: float) -> tuple[float, str]:
        """Tokens the replica's KV cache can take now, and where that figure came from."""
        free = self._free(r, now)
        if free == UNLIMITED:
            return free, "unknown capacity (unlimited)"
        if self._fresh_usage(r, now) is not None:
            return free, "engine telemetry"
        return free, "router accounting"

    def _free(self, r: Replica, now: float) -> float:
        capacity = r.kv_tokens
        if capacity is None:
            return UNLIMITED
        usage = self._fresh_usage(r, now)
        if usage is not None:
            return (1.0 - usage) * capacity
        return capacity - self._held[r.index]

    def _fresh_usage(self, r: Replica, now: float) -> float | None:
        e = r.engine  # the engine's own /metrics first, then KV usage in GPU telemetry
        if e is not None and e.kv_usage is not None and now - e.received_at < self.stale_after_s:
            return e.kv_usage
        t = r.telemetry
        if t is None or t.kv_usage is None or now - t.received_at >= self.stale_after_s:
            return None
        return t.kv_usage

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return _outstanding(replica)

    def explain(self, request: Request, now: float, chosen: Replica | None) -> Explanation:
        # The note needs ``now`` (telemetry freshness), which ``note`` is not given.
        base = super().explain(request, now, chosen)
        return replace(base, note=self._budget_note(request, now, chosen))

    def _budget_note(self, request: Request, now: float, chosen: Replica | None) -> str:
        need = request.total_tokens
        if chosen is None:
            return f"no replica has {need} free KV tokens and an empty engine queue now; waits"
        free, source = self.free_tokens(chosen, now)
        room = "unlimited" if free == UNLIMITED else f"{free:.0f}"
        return f"needs {need} KV tokens; {chosen.id} has {room} free ({source})"


def _held_tokens(r: Replica) -> int:
    return sum(q.total_tokens for q in r.running.values())
