"""Slow start: a replica back in service takes its share over ``router.slow_start_s``."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from router.clock import ManualClock
from router.core import RouterCore
from router.http.metrics import RouterMetrics
from router.request import Request
from router.slow_start import warm_up_limit
from tests.fleet_factory import make_fleet
from tests.recorder import Recorder


def make_core(slow_start_s: float) -> tuple[RouterCore, ManualClock, Recorder]:
    fleet = make_fleet(weights=[1.0, 1.0], batch_sizes=[100, 100], strategy="least-connections")
    fleet = dataclasses.replace(
        fleet, router=dataclasses.replace(fleet.router, slow_start_s=slow_start_s)
    )
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(1))
    rec = Recorder()
    core.listeners.append(rec)
    return core, clock, rec


def submit(core: RouterCore, clock: ManualClock, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        core.submit(Request(f"q{i}", 100, 100, arrival=clock()))


def on(rec: Recorder, replica: str) -> int:
    return sum(a.replica.id == replica for a in rec.assigned)


@given(
    batch=st.integers(1, 1024),
    window=st.floats(0.1, 600.0),
    t1=st.floats(0.0, 700.0),
    t2=st.floats(0.0, 700.0),
)
def test_the_limit_grows_from_one_request_to_the_batch_size_and_never_shrinks(
    batch: int, window: float, t1: float, t2: float
) -> None:
    early, late = sorted((t1, t2))
    a, b = warm_up_limit(batch, early, window), warm_up_limit(batch, late, window)
    full = batch + 1  # past the window: no limit but the batch size
    a_n, b_n = full if a is None else a, full if b is None else b
    assert 1 <= a_n <= b_n
    assert a is None or a <= batch
    assert (a is None) == (early >= window)


def test_a_returning_replica_takes_one_request_then_more_as_its_window_passes() -> None:
    core, clock, rec = make_core(slow_start_s=10.0)
    core.drain("r1")
    submit(core, clock, 20)
    core.undrain("r1")
    submit(core, clock, 20, start=20)
    assert on(rec, "r1") == 1  # an empty replica would otherwise take every one of them
    clock.advance(5.0)
    core.expire()
    submit(core, clock, 100, start=40)
    assert core.replica("r1").in_flight == 50  # half the window: half its 100 slots
    assert core.snapshot().replicas[1].warm_up_limit == 50
    clock.advance(5.0)
    core.expire()
    assert core.replica("r1").warm_up_limit is None
    submit(core, clock, 20, start=140)
    assert core.replica("r1").in_flight == 70


def test_it_never_keeps_a_request_waiting_that_the_returning_replica_has_room_for() -> None:
    """Slow start steers new work away from a returning replica while others have room; when
    none has, the queue's requests would only wait, so the returning replica takes them."""
    core, clock, rec = make_core(slow_start_s=10.0)
    core.drain("r1")
    core.set_batch_size("r0", 10)
    submit(core, clock, 30)
    assert len(core.queue) == 20
    core.undrain("r1")
    assert on(rec, "r1") == 20
    assert len(core.queue) == 0
    assert core.replica("r1").warm_up_limit is None
    clock.advance(1.0)
    core.expire()
    assert core.replica("r1").warm_up_limit is None  # its warm-up ended for good


def test_a_replica_leaving_service_while_it_warms_up_starts_again_when_it_returns() -> None:
    core, clock, _ = make_core(slow_start_s=10.0)
    core.drain("r1")
    core.undrain("r1")
    clock.advance(9.0)
    core.expire()
    assert core.replica("r1").warm_up_limit == 90
    core.eject("r1")
    assert core.replica("r1").warm_up_limit is None
    clock.advance(5.0)
    core.expire()
    core.readmit("r1")
    assert core.replica("r1").warm_up_limit == 1


def test_zero_turns_it_off_and_replicas_in_service_from_the_start_are_not_limited() -> None:
    core, clock, rec = make_core(slow_start_s=0.0)
    core.drain("r1")
    core.undrain("r1")
    assert core.replica("r1").warm_up_limit is None
    submit(core, clock, 40)
    assert on(rec, "r1") == 20
    started, _, _ = make_core(slow_start_s=10.0)
    assert all(r.warm_up_limit is None for r in started.pool)


def test_a_replica_warming_up_is_left_out_of_the_imbalance_factor_until_its_window_passes() -> None:
    """Its load is held low on purpose, and its 10 s window still covers the time it was out:
    counted, it read near zero, and the factor in the hundreds."""
    core, clock, _ = make_core(slow_start_s=10.0)
    metrics = RouterMetrics(core)
    core.drain("r1")
    submit(core, clock, 40)
    core.undrain("r1")
    clock.advance(1.0)
    core.expire()
    assert core.snapshot().imbalance_factor == 1.0  # r0 alone is counted
    assert "gpurouter_imbalance_factor 1.0" in metrics.render().decode()
    clock.advance(9.0)
    core.expire()
    assert core.snapshot().imbalance_factor > 10  # back in the factor, as unevenly worked
    assert "gpurouter_imbalance_factor 1.0" not in metrics.render().decode()
