"""The imbalance factor and its bands."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.clock import ManualClock
from router.config.loader import load_fleet
from router.core import RouterCore
from router.imbalance import Band, band, fair_share_loads, imbalance_factor
from router.request import Request
from router.snapshot import build_snapshot

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"


def test_all_idle_is_perfectly_balanced() -> None:
    assert imbalance_factor([0.0, 0.0, 0.0]) == 1.0
    assert imbalance_factor([]) == 1.0


def test_factor_is_max_over_min_with_a_floor() -> None:
    assert imbalance_factor([0.9, 0.45]) == pytest.approx(2.0)
    assert imbalance_factor([0.5, 0.0]) == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("factor", "expected"),
    [
        (1.0, Band.EXCELLENT),
        (1.09, Band.EXCELLENT),
        (1.1, Band.GOOD),
        (1.19, Band.GOOD),
        (1.2, Band.WATCH),
        (1.5, Band.WATCH),
        (1.51, Band.ACTION),
    ],
)
def test_bands(factor: float, expected: Band) -> None:
    assert band(factor) is expected


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50))
def test_factor_is_at_least_one(values: list[float]) -> None:
    assert imbalance_factor(values) >= 1.0


def test_fair_share_load_is_in_flight_over_the_weights_share_of_all_batch_sizes() -> None:
    # Batch sizes 256 + 256 = 512 split 3:1 by weight: fair shares 384 and 128.
    loads = fair_share_loads([96, 32], [256, 256], [3.0, 1.0])
    assert loads == pytest.approx([0.25, 0.25])
    assert fair_share_loads([0, 0], [0, 0], [1.0, 1.0]) == [0.0, 0.0]


@given(
    st.lists(st.floats(0.1, 10.0), min_size=2, max_size=8),
    st.integers(1, 16),
)
def test_in_flight_in_proportion_to_weight_is_balanced(weights: list[float], k: int) -> None:
    in_flight = [round(w * 10) * k for w in weights]
    batch = [4096] * len(weights)
    scaled = [n / 10 / k for n in in_flight]  # the weights the rounded counts stand for
    assert imbalance_factor(fair_share_loads(in_flight, batch, scaled)) == pytest.approx(1.0)


def _core_with_in_flight(strategy: str, n: int) -> RouterCore:
    fleet = load_fleet(FLEETS / "mixed-a100-v100.yaml")
    core = RouterCore(fleet, clock=ManualClock(), rng=random.Random(3))
    core.set_strategy(strategy)
    for i in range(n):
        core.submit(Request(f"q{i}", 200, 200, arrival=0.0))
    return core


def test_round_robin_on_a_mixed_fleet_reads_as_imbalanced_and_weighted_as_balanced() -> None:
    """The classic case: 4 x A100 (weight 2.2) + 4 x V100 (weight 1), nothing finishing.
    Round-robin gives each card the same number; the weighted strategy gives each its share."""
    rr = build_snapshot(_core_with_in_flight("round-robin", 128))
    assert {r.in_flight for r in rr.replicas} == {16}
    assert rr.imbalance_factor == pytest.approx(2.2)
    assert rr.band is Band.ACTION
    wlc = build_snapshot(_core_with_in_flight("weighted-least-connections", 128))
    assert wlc.imbalance_factor < 1.1
    assert wlc.band is Band.EXCELLENT
