"""Round-robin: each replica in turn, skipping those that cannot take the request."""

from __future__ import annotations

from router.replica import Replica
from router.request import Request
from router.strategies.base import Strategy


class RoundRobin(Strategy):
    name = "round-robin"
    summary = "Each replica in turn; ignores speed and load (the baseline)."

    _cursor = 0

    def pick(self, request: Request, now: float) -> Replica | None:
        replicas = self.pool.replicas
        n = len(replicas)
        # Amortised O(1): the scan stops at the first replica that can take the request,
        # and full or inactive replicas are the exception, not the rule.
        for step in range(n):
            r = replicas[(self._cursor + step) % n]
            if r.can_take(request):
                self._cursor = (r.index + 1) % n
                return r
        return None

    def note(self, request: Request, chosen: Replica | None) -> str:
        return f"next in turn: position {self._cursor}"
