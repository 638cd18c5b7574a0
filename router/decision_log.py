"""The decision log: the newest routing decisions with their explanations, at a bounded cost.

An explanation scores every candidate replica: on a small fleet that costs about as much as
all the rest of a request's routing, and it grows with the fleet. So the log explains at most
``per_s`` decisions a second on average, in bursts of up to ``per_s`` (a token bucket on the
core's clock, so virtual and test time work alike); a decision past that budget is routed
just the same, counted in :attr:`DecisionLog.skipped`, and not recorded. Below the budget
every decision is explained. An explanation is always built at the moment of the decision,
from the state the strategy decided on, never later from a state that has since changed.

At the default of 100 a second, a log of 256 covers the last 2.5 s or so of a router under
sustained load, instead of its last 256 decisions (85 ms at 3,000 requests a second).
"""

from __future__ import annotations

import math
from collections import deque

from router.strategies import Explanation

__all__ = ["EXPLAINED_PER_S", "DecisionLog"]

EXPLAINED_PER_S = 100.0
"""The router's budget: explanations per second, on average and in a burst."""


class DecisionLog(deque[Explanation]):
    """The newest ``size`` explained decisions, oldest first (a deque with a budget).

    ``per_s`` None explains every decision (each costs O(replicas)).
    """

    __slots__ = ("_last", "_tokens", "per_s", "skipped")

    def __init__(self, size: int, per_s: float | None = EXPLAINED_PER_S) -> None:
        if per_s is not None and not per_s > 0:
            raise ValueError(f"explanations per second must be > 0 or None, not {per_s!r}")
        super().__init__(maxlen=size)
        self.per_s = per_s
        self.skipped = 0
        """Decisions made while the budget was spent: routed, but neither explained nor kept."""
        self._tokens = 1.0 if per_s is None else max(per_s, 1.0)
        self._last = -math.inf

    def admit(self, now: float) -> bool:
        """Whether the decision made at ``now`` is to be explained; if not, it is counted."""
        per_s = self.per_s
        if per_s is None:
            return True
        burst = max(per_s, 1.0)
        elapsed = now - self._last
        self._last = now
        tokens = self._tokens
        if elapsed > 0:  # a clock that stands still (or a first call at -inf) adds nothing odd
            tokens = min(burst, tokens + elapsed * per_s)
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        self.skipped += 1
        return False
