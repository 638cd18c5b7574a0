"""The decision log explains at most its budget of decisions a second, on the core's clock."""

from __future__ import annotations

import dataclasses
import random

import pytest

from router.clock import ManualClock
from router.core import RouterCore
from router.decision_log import EXPLAINED_PER_S, DecisionLog
from router.request import Request
from tests.fleet_factory import make_fleet


def _admits(log: DecisionLog, now: float, n: int) -> list[bool]:
    return [log.admit(now) for _ in range(n)]


def test_a_burst_of_the_budget_is_explained_and_the_rest_counted() -> None:
    log = DecisionLog(16, per_s=3)
    assert _admits(log, 10.0, 5) == [True, True, True, False, False]
    assert log.skipped == 2


def test_the_budget_refills_at_its_rate_and_no_further_than_one_burst() -> None:
    log = DecisionLog(16, per_s=2)
    assert _admits(log, 0.0, 3) == [True, True, False]
    assert _admits(log, 0.5, 2) == [True, False]  # half a second buys one explanation
    assert _admits(log, 100.0, 3) == [True, True, False]  # a long idle saves a burst, no more
    assert log.skipped == 3


def test_a_clock_that_stands_still_or_steps_back_adds_nothing() -> None:
    log = DecisionLog(16, per_s=1)
    assert _admits(log, 5.0, 2) == [True, False]
    assert _admits(log, 4.0, 1) == [False]
    assert _admits(log, 5.0, 1) == [True]  # one second after the step back, not the first call


def test_no_budget_explains_every_decision() -> None:
    log = DecisionLog(4, per_s=None)
    assert all(_admits(log, 0.0, 1000))
    assert log.skipped == 0


@pytest.mark.parametrize("per_s", [0.0, -1.0, float("nan")])
def test_a_budget_must_be_positive(per_s: float) -> None:
    with pytest.raises(ValueError, match="explanations per second"):
        DecisionLog(4, per_s=per_s)


def _core(clock: ManualClock, per_s: float | None, log_size: int = 256) -> RouterCore:
    fleet = make_fleet(batch_sizes=[64] * 4)
    if log_size != 256:
        router = dataclasses.replace(fleet.router, decision_log_size=log_size)
        fleet = dataclasses.replace(fleet, router=router)
    return RouterCore(fleet, clock=clock, rng=random.Random(1), explained_per_s=per_s)


def test_the_core_explains_decisions_within_the_budget_and_counts_the_others() -> None:
    clock = ManualClock()
    core = _core(clock, per_s=2)
    for i in range(5):
        core.submit(Request(f"q{i}", 10, 10, arrival=clock()))
    clock.advance(0.5)
    core.submit(Request("q5", 10, 10, arrival=clock()))
    assert [d.request_id for d in core.decisions] == ["q0", "q1", "q5"]
    assert core.decisions.skipped == 3
    assert len(core.running) == 6  # every request was routed, explained or not


def test_an_explanation_describes_the_fleet_when_the_decision_was_made() -> None:
    """The second explained decision sees the first request in flight on its replica: each
    explanation is built at its decision, not when the log is read."""
    clock = ManualClock()
    core = _core(clock, per_s=1)
    core.submit(Request("q0", 10, 10, arrival=clock()))
    core.submit(Request("q1", 10, 10, arrival=clock()))  # over budget: not explained
    clock.advance(1.0)
    core.submit(Request("q2", 10, 10, arrival=clock()))
    first, second = core.decisions
    assert sum(c.in_flight for c in first.candidates) == 0
    assert sum(c.in_flight for c in second.candidates) == 2
    assert (first.time, second.time) == (0.0, 1.0)


def test_the_core_uses_the_routers_budget_by_default() -> None:
    core = RouterCore(make_fleet(), clock=ManualClock())
    assert core.decisions.per_s == EXPLAINED_PER_S
    assert core.decisions.maxlen == 256


def test_a_log_of_size_zero_explains_nothing_and_counts_nothing() -> None:
    clock = ManualClock()
    core = _core(clock, per_s=None, log_size=0)
    core.submit(Request("q0", 10, 10, arrival=clock()))
    assert (list(core.decisions), core.decisions.skipped) == ([], 0)
