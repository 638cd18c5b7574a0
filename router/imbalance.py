"""The fleet's imbalance factor: how unevenly loaded the active replicas are.

``max / min`` of load over active replicas, with a floor of 0.01 so an idle replica does not
divide by zero, and 1.0 when every replica is idle. Bands from practice: under 1.1 is
excellent, under 1.2 good, up to 1.5 worth watching, above 1.5 needs action.

A replica's load is its requests in flight over its fair share of the fleet's concurrency:
the sum of the active replicas' batch sizes, split by static weight (the fleet file's
statement of relative capacity). The GPU's own utilization is no measure of this for an LLM
engine: NVML counts the share of time any kernel ran, and a continuously batching engine
runs kernels back to back with one sequence or with two hundred, so every busy card reads
near 100% (docs/decisions/0002-imbalance-from-load.md). The floor makes a lightly used fleet,
where every replica is below 1% of its share, read as balanced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum

FLOOR = 0.01


class Band(StrEnum):
    EXCELLENT = "excellent"
    GOOD = "good"
    WATCH = "watch"
    ACTION = "action"


def imbalance_factor(utilizations: Iterable[float]) -> float:
    """max/min utilization (each 0..1) with the floor; 1.0 for none or all idle."""
    values = [max(u, 0.0) for u in utilizations]
    if not values or max(values) == 0.0:
        return 1.0
    return max(max(values), FLOOR) / max(min(values), FLOOR)


def fair_share_loads(
    in_flight: Sequence[int], batch_sizes: Sequence[int], weights: Sequence[float]
) -> list[float]:
    """Each replica's in-flight requests over its weight's share of all the batch sizes."""
    total_batch, total_weight = sum(batch_sizes), sum(weights)
    if total_batch <= 0 or total_weight <= 0:
        return [0.0 for _ in in_flight]
    return [n * total_weight / (total_batch * w) for n, w in zip(in_flight, weights, strict=True)]


def band(factor: float) -> Band:
    if factor < 1.1:
        return Band.EXCELLENT
    if factor < 1.2:
        return Band.GOOD
    if factor <= 1.5:
        return Band.WATCH
    return Band.ACTION
