"""The imbalance factor and its bands."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.imbalance import Band, band, imbalance_factor


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
