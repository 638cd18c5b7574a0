"""The fleet's imbalance factor: how unevenly busy the active replicas are.

``max / min`` of utilization over active replicas, with a floor of 0.01 so an idle replica
does not divide by zero, and 1.0 when every replica is idle. Bands from practice: under 1.1 is
excellent, under 1.2 good, up to 1.5 worth watching, above 1.5 needs action.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def band(factor: float) -> Band:
    if factor < 1.1:
        return Band.EXCELLENT
    if factor < 1.2:
        return Band.GOOD
    if factor <= 1.5:
        return Band.WATCH
    return Band.ACTION
