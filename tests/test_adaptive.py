"""Adaptive weights and batch sizes: damped, bounded, pinned values untouched."""

from __future__ import annotations

import random

import pytest

from router.adaptive import BatchStreak, WeightInput, retune_batch, retune_weights
from router.clock import ManualClock
from router.config.schema import AdaptiveConfig
from router.core import RouterCore
from router.replica import Telemetry
from router.request import Request
from tests.fleet_factory import make_fleet

CFG = AdaptiveConfig(weights=True, batch_sizes=True, weight_damping=0.5, hysteresis=2)


def test_weights_move_toward_measured_capacity_by_the_damping() -> None:
    """Equal static weights, but one card does 3x the work at the same busyness."""
    inputs = [WeightInput(1.0, 1.0, False, 300.0, 1.0), WeightInput(1.0, 1.0, False, 100.0, 1.0)]
    fast, slow = retune_weights(inputs, CFG)
    # targets 1.5 and 0.5 (sum kept at 2.0); half-way there
    assert fast == pytest.approx(1.25)
    assert slow == pytest.approx(0.75)


def test_weights_stay_within_bounds_of_the_static_weight() -> None:
    cfg = AdaptiveConfig(weights=True, weight_damping=1.0, weight_bounds=(0.5, 2.0))
    # targets: about 2.99 for the fast one and 0.003 for the slow ones, each clamped
    inputs = [WeightInput(1.0, 1.0, False, 1000.0, 1.0)] + [
        WeightInput(1.0, 1.0, False, 1.0, 1.0) for _ in range(2)
    ]
    assert retune_weights(inputs, cfg) == [2.0, 0.5, 0.5]


def test_a_pinned_weight_is_left_alone_and_unmeasured_ones_return_to_the_prior() -> None:
    inputs = [
        WeightInput(1.0, 3.0, True, 500.0, 1.0),
        WeightInput(2.0, 1.0, False, 0.0, 0.0),
    ]
    pinned, idle = retune_weights(inputs, CFG)
    assert pinned == 3.0
    assert idle == pytest.approx(1.5)


def test_batch_grows_only_after_hysteresis_when_saturated_and_underused() -> None:
    streak = BatchStreak()
    assert retune_batch(16, 0.4, True, streak, CFG) == 16
    assert retune_batch(16, 0.4, True, streak, CFG) == 20
    assert retune_batch(16, 0.4, False, BatchStreak(), CFG) == 16


def test_batch_shrinks_when_the_gpu_is_overloaded_and_respects_bounds() -> None:
    cfg = AdaptiveConfig(batch_sizes=True, hysteresis=1, batch_bounds=(2, 8))
    assert retune_batch(8, 0.95, True, BatchStreak(), cfg) == 6
    assert retune_batch(2, 0.95, True, BatchStreak(), cfg) == 2
    assert retune_batch(8, 0.1, True, BatchStreak(), cfg) == 8


def test_no_telemetry_means_no_batch_change() -> None:
    streak = BatchStreak(low=5)
    assert retune_batch(8, None, True, streak, CFG) == 8
    assert streak == BatchStreak()


def test_the_core_applies_tuning_and_skips_pinned_replicas() -> None:
    from dataclasses import replace

    fleet = make_fleet([1.0, 1.0], [1, 1])
    fleet = replace(fleet, router=replace(fleet.router, adaptive=CFG))
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(0))
    core.set_batch_size("r1", 1)
    for i in range(4):
        core.submit(Request(f"q{i}", 10, 10, arrival=clock()))
    for r in core.pool:
        r.telemetry = Telemetry(utilization=0.3, received_at=clock())
    core.tune()
    changes = core.tune()
    assert [c.message for c in changes] == ["r0: batch_size 1 -> 2 (GPU utilization 30%)"]
    assert core.replica("r1").batch_size == 1
