"""The load curve: learned capacity of an engine the performance model does not know."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.capacity import Prior, ReplicaCapacity
from router.load_curve import MIN_POINTS, REACH, LoadCurve


def _line_points(curve: LoadCurve, a: float, b: float, cs: list[float]) -> None:
    for c in cs:
        curve.add(c, a + b * c, weight=1.0, decay=1.0)


@given(
    a=st.floats(0.0, 0.1),
    b=st.floats(1e-4, 0.05),
    cs=st.lists(st.floats(1.0, 40.0), min_size=int(MIN_POINTS), max_size=60),
)
def test_points_on_a_line_give_that_lines_rate(a: float, b: float, cs: list[float]) -> None:
    curve = LoadCurve()
    _line_points(curve, a, b, cs)
    mean = sum(cs) / len(cs)
    spread = (sum((c - mean) ** 2 for c in cs) / len(cs)) ** 0.5
    rate = curve.rate_at(16)
    if spread <= 0.1 * mean * 1.001:
        return  # too little spread: no figure, or one from what little there is
    assert rate is not None
    # Points exactly on the line pin it down: it is read at 16 however far that is.
    assert rate == pytest.approx(16 / (a + b * 16), rel=1e-6)


def test_no_figure_without_enough_points_or_spread_or_a_rising_line() -> None:
    few = LoadCurve()
    _line_points(few, 0.01, 0.01, [1.0, 5.0] * int(MIN_POINTS // 2 - 1))
    assert few.rate_at(64) is None
    flat = LoadCurve()
    _line_points(flat, 0.01, 0.01, [8.0] * 40)
    assert flat.rate_at(64) is None
    falling = LoadCurve()
    _line_points(falling, 0.5, -0.01, [1.0, 2.0, 4.0, 8.0] * 10)
    assert falling.rate_at(64) is None


def _noisy_points(curve: LoadCurve, a: float, b: float, cs: list[float], noise: float) -> None:
    rng = random.Random(7)
    for c in cs:
        curve.add(c, (a + b * c) * rng.uniform(1 - noise, 1 + noise), weight=1.0, decay=1.0)


def test_a_scattered_line_is_not_read_far_past_what_it_covers() -> None:
    curve = LoadCurve()
    _noisy_points(curve, 0.02, 0.01, [1.0, 2.0] * 20, noise=0.1)
    a, b = curve.line() or (0.0, 0.0)
    assert curve.rate_at(64) == pytest.approx(REACH * 2 / (a + b * REACH * 2))
    assert curve.highest == 2.0
    assert curve.reading(64) == (REACH * 2, curve.rate_at(64))  # where it was read


def test_a_line_its_points_pin_down_is_read_at_the_batch_size() -> None:
    """The same engine sent 1 to 3 at once, its points 2% apart from the line: read at 64."""
    curve = LoadCurve()
    _noisy_points(curve, 0.02, 0.01, [1.0, 2.0, 3.0] * 30, noise=0.02)
    assert curve.rate_at(64) == pytest.approx(64 / (0.02 + 0.01 * 64), rel=0.05)
    assert curve.reading(64) == (64, curve.rate_at(64))
    assert LoadCurve().reading(64) is None


def test_more_points_carry_the_line_further() -> None:
    """Scattered points that a short run cannot carry to 64 are read there after a long one."""
    short, long_ = LoadCurve(), LoadCurve()
    _noisy_points(short, 0.02, 0.01, [1.0, 2.0, 3.0, 4.0] * 6, noise=0.3)
    _noisy_points(long_, 0.02, 0.01, [1.0, 2.0, 3.0, 4.0] * 300, noise=0.3)
    a, b = short.line() or (0.0, 0.0)
    assert short.rate_at(64) == pytest.approx(REACH * 4 / (a + b * REACH * 4))
    a, b = long_.line() or (0.0, 0.0)
    assert long_.rate_at(64) == pytest.approx(64 / (a + b * 64))
    assert long_.rate_at(64) == pytest.approx(64 / (0.02 + 0.01 * 64), rel=0.05)


def _run(a: float, b: float, rate: float, seconds: float, seed: int) -> ReplicaCapacity:
    """A processor-sharing engine, each request advancing 1 / (a + b * c) units of work a
    second with ``c`` requests in it, fed Poisson arrivals: the replica's accounting as the
    core keeps it (advance before each change of concurrency, a mark at start)."""
    rng = random.Random(seed)
    acc = ReplicaCapacity(Prior(None, None, 1.0))
    dt = 0.005
    t, next_arrival = 0.0, rng.expovariate(rate)
    running: list[list[float]] = []  # [work left, cost, mark, started]
    while t < seconds:
        c = len(running)
        for req in running:
            req[0] -= dt / (a + b * c)
        t += dt
        done = [req for req in running if req[0] <= 0]
        if done:
            acc.advance(c, t)
            for req in done:
                running.remove(req)
                acc.completed((100, 100), req[1], req[2], req[3], t, req[1])
        if t >= next_arrival:
            acc.advance(len(running), t)
            cost = rng.uniform(0.5, 1.5)
            running.append([cost, cost, acc.share_mark(), t])
            next_arrival = t + rng.expovariate(rate)
    return acc


@pytest.mark.parametrize(("a", "b", "load"), [(0.02, 0.004, 0.3), (0.08, 0.016, 0.3)])
def test_an_unknown_engine_is_measured_at_its_batch_size_not_at_the_load_it_was_sent(
    a: float, b: float, load: float
) -> None:
    """Two engines 4x apart, each sent 30% of what it does at 16 at once: each reads its rate
    at 16 within 10%. Work over time alone reads the throughput it was sent (0.3 of it)."""
    batch = 16
    true_rate = batch / (a + b * batch)
    acc = _run(a, b, load * true_rate, seconds=120.0, seed=1)
    measured = acc.measured(batch)
    assert measured is not None
    assert measured == pytest.approx(true_rate, rel=0.1)
