"""Windows over recent events: rates and latency percentiles, on an injected clock."""

from __future__ import annotations

import math
from collections import deque


class RateWindow:
    """Events per second over the last ``window_s`` seconds."""

    __slots__ = ("_events", "window_s")

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()

    def add(self, now: float, amount: float = 1.0) -> None:
        self._events.append((now, amount))
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        return sum(a for _, a in self._events) / self.window_s

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        events = self._events
        while events and events[0][0] < cutoff:
            events.popleft()


class LatencyWindow:
    """The most recent ``size`` samples, for percentiles."""

    __slots__ = ("_samples",)

    def __init__(self, size: int = 512) -> None:
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)

    def __len__(self) -> int:
        return len(self._samples)

    def values(self) -> list[float]:
        return list(self._samples)


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


class ReplicaStats:
    """What the router has seen a replica do, for snapshots."""

    __slots__ = ("completions", "cost_done", "cost_sent", "e2e", "output_tokens", "retries", "ttft")

    def __init__(self) -> None:
        self.completions = RateWindow()
        self.cost_done = RateWindow()
        self.cost_sent = RateWindow()
        """Estimated cost dispatched to the replica: its offered load, for the imbalance
        factor."""
        self.output_tokens = RateWindow()
        self.ttft = LatencyWindow()
        self.e2e = LatencyWindow()
        self.retries = 0
