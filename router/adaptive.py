"""Adaptive weights and batch sizes: pure rules, applied by the core on a timer.

Weights: each replica's capacity is estimated as the work it completed per second divided by
how busy it was (what it would do fully busy); measured capacities are scaled so that they sum
to the static weights of the same replicas, and each weight moves a damped step toward its
target, bounded by multiples of its static weight. A replica with nothing measured drifts back
to its static weight (the operator's prior). A pinned weight is left alone.

Batch sizes: only from fresh GPU telemetry. A replica that uses all its slots while its GPU is
under ``grow_below`` busy can take more; one over ``shrink_above`` is overloaded. Either must
hold for ``hysteresis`` consecutive rounds before the size moves by a quarter, within bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.config.schema import AdaptiveConfig


@dataclass(frozen=True, slots=True)
class TunerChange:
    """One setting a tuner moved: the replica, the setting, old and new value, and why."""

    replica: str
    setting: str
    """``weight`` or ``batch_size``."""
    old: float
    new: float
    signal: str
    """The reading that moved it, in words (``engine queue 12 for 2 rounds``...)."""

    @property
    def message(self) -> str:
        return f"{self.replica}: {self.setting} {self.old:.3g} -> {self.new:.3g} ({self.signal})"


# Below this busy fraction, throughput says more about the routing than about the card.
MIN_UTILIZATION = 0.05


@dataclass(frozen=True, slots=True)
class WeightInput:
    static: float
    current: float
    pinned: bool
    throughput: float
    """Cost units completed per second over the recent window."""
    utilization: float
    """Busy fraction 0..1 over the same window."""


def retune_weights(inputs: Sequence[WeightInput], cfg: AdaptiveConfig) -> list[float]:
    """The next effective weight of each replica, in input order."""
    measured = [
        i for i in inputs if not i.pinned and i.throughput > 0 and i.utilization >= MIN_UTILIZATION
    ]
    capacity = {id(i): i.throughput / i.utilization for i in measured}
    total_capacity = sum(capacity.values())
    scale = sum(i.static for i in measured) / total_capacity if total_capacity else 0.0
    lo, hi = cfg.weight_bounds
    out = []
    for i in inputs:
        if i.pinned:
            out.append(i.current)
            continue
        target = capacity[id(i)] * scale if id(i) in capacity else i.static
        step = i.current + cfg.weight_damping * (target - i.current)
        out.append(min(max(step, lo * i.static), hi * i.static))
    return out


@dataclass(slots=True)
class BatchStreak:
    """Consecutive rounds a replica has spent past each threshold."""

    low: int = 0
    high: int = 0


def retune_batch(
    current: int,
    gpu_utilization: float | None,
    saturated: bool,
    streak: BatchStreak,
    cfg: AdaptiveConfig,
) -> int:
    """The next batch size; ``gpu_utilization`` is None when telemetry is missing or stale."""
    if gpu_utilization is None:
        streak.low = streak.high = 0
        return current
    step = max(1, current // 4)
    lo, hi = cfg.batch_bounds
    if gpu_utilization < cfg.grow_below and saturated:
        streak.low, streak.high = streak.low + 1, 0
        if streak.low >= cfg.hysteresis:
            streak.low = 0
            return min(hi, current + step)
    elif gpu_utilization > cfg.shrink_above:
        streak.low, streak.high = 0, streak.high + 1
        if streak.high >= cfg.hysteresis:
            streak.high = 0
            return max(lo, current - step)
    else:
        streak.low = streak.high = 0
    return current
