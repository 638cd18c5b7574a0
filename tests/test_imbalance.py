"""The imbalance factor and its bands."""

from __future__ import annotations

import io
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.ctl.render import print_status
from console.view.header import Modes, header_lines
from router.clock import ManualClock
from router.config.loader import load_fleet
from router.core import RouterCore
from router.demo.report import snapshot_line
from router.http.metrics import RouterMetrics
from router.imbalance import Band, band, capacity_loads, imbalance_factor
from router.request import Request
from router.snapshot import build_snapshot
from router.telemetry.router_stats import decode_stats, encode_stats
from router.telemetry.status import DISABLED
from tests.test_emulator_support import metric

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


def test_load_is_work_asked_over_what_learned_capacity_does_in_the_window() -> None:
    """Sent 2,000 and holding 1,000 over 10 s at 120/s: 3,000 of 1,200 it could do."""
    assert capacity_loads([2000.0], [1000.0], [120.0], 10.0) == pytest.approx([2.5])
    loads = capacity_loads([3000.0, 1000.0], [0.0, 0.0], [1200.0, 400.0], 10.0)
    assert loads == pytest.approx([0.25, 0.25])
    assert capacity_loads([5.0], [0.0], [0.0], 10.0) == [0.0]  # unknown capacity: none


@given(
    st.lists(st.floats(1.0, 20_000.0), min_size=2, max_size=8),
    st.floats(0.01, 2.0),
)
def test_work_in_proportion_to_capacity_is_balanced(capacities: list[float], share: float) -> None:
    work = [c * share * 10.0 for c in capacities]
    held = [c * share for c in capacities]
    loads = capacity_loads(work, held, capacities, 10.0)
    assert imbalance_factor(loads) == pytest.approx(1.0)


def _core_with_in_flight(strategy: str, n: int) -> RouterCore:
    fleet = load_fleet(FLEETS / "mixed-a100-v100.yaml")
    core = RouterCore(fleet, clock=ManualClock(), rng=random.Random(3))
    core.set_strategy(strategy)
    for i in range(n):
        core.submit(Request(f"q{i}", 200, 200, arrival=0.0))
    return core


def test_round_robin_on_a_mixed_fleet_reads_as_imbalanced_and_weighted_as_balanced() -> None:
    """The classic case: 4 x A100 + 4 x V100, nothing finishing. Round-robin gives each card
    the same work, so each card's load over its learned capacity differs by the cards' speed
    ratio; weighted least-connections over learned capacity gives each its share."""
    core = _core_with_in_flight("round-robin", 128)
    a100, v100 = core.replica("a100-0").speed, core.replica("v100-0").speed
    assert a100 / v100 > 2  # the performance model's prior: an A100 does over twice a V100
    rr = build_snapshot(core)
    assert {r.in_flight for r in rr.replicas} == {16}
    assert rr.imbalance_factor == pytest.approx(a100 / v100)
    assert rr.band is Band.ACTION
    wlc = build_snapshot(_core_with_in_flight("weighted-least-connections", 128))
    assert wlc.imbalance_factor < 1.1
    assert wlc.band is Band.EXCELLENT


def test_every_surface_shows_the_one_factor_the_snapshot_computed() -> None:
    """Decision 0003: one computation, shown alike by the console's header, the headless
    JSON line, ``ctl status`` (the admin state), the routers' stats over MQTT and /metrics.
    Round-robin on the mixed fleet, so the factor is far from 1 and any other reading of
    load (in-flight counts, static weights) would show another figure."""
    core = _core_with_in_flight("round-robin", 128)
    snap = build_snapshot(core)
    factor = snap.imbalance_factor
    assert factor > 2
    lines = header_lines(snap, DISABLED, Modes())
    header = "\n".join("".join(text for text, _ in line) for line in lines)
    assert f"{factor:.2f}" in header
    line = snapshot_line(0.0, snap, DISABLED, offered_rps=0.0, client=Counter())
    assert line["imbalance_factor"] == round(factor, 3)
    state = snap.to_dict()
    assert state["imbalance_factor"] == pytest.approx(factor)
    out = io.StringIO()
    print_status(state, out)
    assert f"imbalance {factor:.2f}" in out.getvalue()
    stats = decode_stats(encode_stats(snap, "r1", 0.0))
    assert stats.imbalance_factor == round(factor, 4)
    scraped = metric(RouterMetrics(core).render().decode(), "gpurouter_imbalance_factor")
    assert scraped == pytest.approx(factor)
