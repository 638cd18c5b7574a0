"""A rollout's line in a scenario's summary: what it did, and what it cost the traffic.

Beside the rollout's own record (phase, waves, capacity at its lowest, replicas behind):
the router's queue at its peak during the rollout, p99 TTFT of the requests that arrived
before it, during it and after it, and the requests lost in each of those windows. The same
figures for a live run and a simulated one, so the two can be set side by side; with the
prediction the router made before it started, when it made one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from router.scenario.recording import Recorder, RolloutOutcome
from router.stats import percentile

__all__ = ["rollout_summary"]


def rollout_summary(
    outcome: RolloutOutcome, rec: Recorder, lost_arrivals: Sequence[float], end_s: float
) -> dict[str, Any]:
    """``outcome.to_dict()`` with the traffic's figures by window (scenario seconds)."""
    start = outcome.started_at
    stop = end_s if outcome.ended_at is None else outcome.ended_at
    windows = {"before": (0.0, start), "during": (start, stop), "after": (stop, end_s)}
    traffic = dict(outcome.traffic or {})
    traffic["ttft_p99_s"] = {name: _ttft_p99(rec, a, b) for name, (a, b) in windows.items()}
    traffic["lost"] = {
        name: sum(1 for t in lost_arrivals if a <= t < b) for name, (a, b) in windows.items()
    }
    out = outcome.to_dict()
    out["traffic"] = traffic
    if outcome.prediction is not None:
        out["prediction"] = outcome.prediction
    return out


def _ttft_p99(rec: Recorder, start: float, end: float) -> float | None:
    """As the scenario checks measure ``ttft_p99_s`` over requests that arrived in the window:
    one that never got a first byte was later than any that did."""
    values = [
        (r.first_byte - r.arrival) if r.first_byte is not None else math.inf
        for r in rec.requests.values()
        if start <= r.arrival < end and r.outcome in ("completed", "expired", None)
    ]
    p99 = percentile(values, 0.99)
    return None if p99 is None or math.isinf(p99) else round(p99, 4)
