"""The router core's behaviour: admission, dispatch, endings, operator actions."""

from __future__ import annotations

import random

import pytest

from router.clock import ManualClock
from router.core import Outcome, RouterCore
from router.errors import ControlError
from router.replica import Replica, ReplicaState, Telemetry
from router.request import Priority, Request
from tests.fleet_factory import make_fleet
from tests.recorder import Recorder


def make_core(**kwargs: object) -> tuple[RouterCore, ManualClock, Recorder]:
    clock = ManualClock()
    core = RouterCore(make_fleet(**kwargs), clock=clock, rng=random.Random(1))  # type: ignore[arg-type]
    rec = Recorder()
    core.listeners.append(rec)
    return core, clock, rec


def req(i: int, clock: ManualClock, *, prompt: int = 100, out: int = 100, **kw: object) -> Request:
    return Request(f"q{i}", prompt, out, arrival=clock(), **kw)  # type: ignore[arg-type]


def test_requests_beyond_the_fleets_slots_wait_in_the_queue() -> None:
    core, clock, rec = make_core(batch_sizes=[2, 2, 2, 2])
    for i in range(10):
        core.submit(req(i, clock))
    assert len(rec.assigned) == 8
    assert len(core.queue) == 2
    assert all(r.in_flight == 2 for r in core.pool)


def test_each_pick_is_told_how_many_queued_requests_it_scanned_past() -> None:
    """Requests ahead of it in the queue take the next free slots first: a strategy that
    weighs waiting for a slot needs to know how many there are."""
    core, clock, _ = make_core(weights=[1.0, 1.0], batch_sizes=[1, 1])
    for i in range(2):
        core.submit(req(i, clock))  # both slots taken
    seen: list[tuple[str, int]] = []
    real_pick = core.strategy.pick

    def pick(request: Request, now: float) -> Replica | None:
        seen.append((request.id, request.waiting_ahead))
        return real_pick(request, now)

    core.strategy.pick = pick  # type: ignore[method-assign]
    core.submit(req(2, clock, avoid={0, 1}))  # failed on both: no replica takes it
    core.submit(req(3, clock))
    seen.clear()
    core.complete(next(iter(core.running.values())))
    assert seen == [("q2", 0), ("q3", 1)]


def test_a_freed_slot_takes_the_oldest_waiting_request() -> None:
    """Work stealing: whichever replica frees a slot serves the head of the queue."""
    core, clock, rec = make_core(batch_sizes=[1, 1, 1, 1])
    for i in range(6):
        core.submit(req(i, clock))
    on_r3 = next(a for a in rec.assigned if a.replica.id == "r3")
    core.complete(on_r3)
    assert rec.assigned[-1].request.id == "q4"
    assert rec.assigned[-1].replica.id == "r3"


def test_higher_priority_is_served_first() -> None:
    core, clock, rec = make_core(weights=[1.0], batch_sizes=[1])
    core.submit(req(0, clock))
    core.submit(req(1, clock, priority=Priority.LOW))
    core.submit(req(2, clock, priority=Priority.HIGH))
    core.complete(rec.assigned[0])
    assert rec.assigned[-1].request.id == "q2"


def test_a_full_queue_rejects_with_a_retry_hint() -> None:
    core, clock, _ = make_core(weights=[1.0], batch_sizes=[1], queue_size=2)
    for i in range(3):
        assert core.submit(req(i, clock)) is None
    finished = core.submit(req(3, clock))
    assert finished is not None
    assert finished.outcome is Outcome.REJECTED
    assert finished.reason == "queue full"
    assert finished.retry_after_s is not None
    assert finished.retry_after_s >= 1.0


def test_a_request_no_replica_can_hold_is_rejected_at_once() -> None:
    core, clock, _ = make_core(weights=[1.0, 1.0], kv_capacity=[1000, 2000])
    finished = core.submit(req(0, clock, prompt=2000, out=500))
    assert finished is not None
    assert finished.outcome is Outcome.REJECTED
    assert "2500 tokens" in finished.reason


def test_a_request_whose_deadline_passes_in_the_queue_expires() -> None:
    core, clock, rec = make_core(weights=[1.0], batch_sizes=[1])
    core.submit(req(0, clock))
    core.submit(req(1, clock, deadline=5.0))
    clock.advance(6)
    (expired,) = core.expire()
    assert expired.request.id == "q1"
    assert expired.outcome is Outcome.EXPIRED
    assert rec.outcome_of("q1") == "expired"


def test_a_failed_attempt_is_retried_on_another_replica() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0], batch_sizes=[1, 1])
    core.submit(req(0, clock))
    first = rec.assigned[0]
    assert core.fail(first, "connect refused") is None
    retry = rec.assigned[1]
    assert retry.request is first.request
    assert retry.replica is not first.replica
    core.complete(retry)
    assert rec.outcome_of("q0") == "completed"


def test_retries_stop_at_the_attempt_limit() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0], attempts=2)
    core.submit(req(0, clock))
    core.fail(rec.assigned[0], "boom")
    finished = core.fail(rec.assigned[1], "boom again")
    assert finished is not None
    assert finished.outcome is Outcome.FAILED
    assert finished.reason == "boom again"


def test_a_failure_after_the_first_byte_is_not_retried() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0])
    core.submit(req(0, clock))
    core.first_byte(rec.assigned[0])
    finished = core.fail(rec.assigned[0], "stream broke")
    assert finished is not None
    assert finished.outcome is Outcome.FAILED
    assert len(rec.assigned) == 1


def test_drain_stops_new_work_and_ends_drained_when_empty() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0], batch_sizes=[2, 2])
    core.submit(req(0, clock))
    a = rec.assigned[0]
    core.drain(a.replica.id)
    assert a.replica.state is ReplicaState.DRAINING
    for i in range(1, 4):
        core.submit(req(i, clock))
    assert all(x.replica is not a.replica for x in rec.assigned[1:])
    core.complete(a)
    assert core.replica(a.replica.id).state is ReplicaState.DRAINED
    assert (a.replica.id, ReplicaState.DRAINING, ReplicaState.DRAINED) in rec.states


def test_preempt_requeues_unstarted_low_priority_work_and_keeps_high() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0], batch_sizes=[3, 3])
    core.drain("r1")
    core.submit(req(0, clock, priority=Priority.LOW))
    core.submit(req(1, clock, priority=Priority.NORMAL))
    core.submit(req(2, clock, priority=Priority.HIGH))
    core.first_byte(rec.assigned[1])
    core.undrain("r1")
    message = core.preempt("r0")
    assert message == "r0: preempted 2 (1 re-queued, 1 failed)"
    assert {a.request.id for a in rec.cancelled} == {"q0", "q1"}
    assert rec.outcome_of("q1") == "failed"
    assert rec.assigned[-1].request.id == "q0"
    assert rec.assigned[-1].replica.id == "r1"
    r0 = core.replica("r0")
    assert list(r0.running) == ["q2"]
    assert r0.state is ReplicaState.DRAINING
    core.complete(rec.assigned[2])
    assert core.replica("r0").state is ReplicaState.DRAINED


def test_reports_about_a_preempted_attempt_are_ignored() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0], batch_sizes=[1, 1])
    core.submit(req(0, clock))
    stale = rec.assigned[0]
    core.preempt(stale.replica.id)
    core.complete(stale)
    assert rec.finished == []
    core.complete(rec.assigned[-1])
    assert rec.outcome_of("q0") == "completed"


def test_switching_strategy_leaves_in_flight_work_alone() -> None:
    core, clock, rec = make_core()
    for i in range(4):
        core.submit(req(i, clock))
    before = {r.id: set(r.running) for r in core.pool}
    core.set_strategy("round-robin")
    assert {r.id: set(r.running) for r in core.pool} == before
    assert core.strategy.name == "round-robin"
    core.submit(req(9, clock))
    assert rec.assigned[-1].request.id == "q9"


def test_an_ejected_replica_gets_nothing_until_readmitted() -> None:
    core, clock, rec = make_core(weights=[1.0, 1.0])
    core.eject("r0")
    for i in range(4):
        core.submit(req(i, clock))
    assert {a.replica.id for a in rec.assigned} == {"r1"}
    core.readmit("r0")
    core.submit(req(5, clock))
    assert rec.assigned[-1].replica.id == "r0"


def test_operator_settings_are_validated() -> None:
    core, _, _ = make_core()
    with pytest.raises(ControlError, match="no replica 'nope'"):
        core.drain("nope")
    with pytest.raises(ControlError, match="positive"):
        core.set_weight("r0", 0)
    with pytest.raises(ControlError, match=">= 1"):
        core.set_batch_size("r0", 0)
    with pytest.raises(ControlError, match="unknown strategy"):
        core.set_strategy("fastest")
    core.drain("r0")
    with pytest.raises(ControlError, match="only an active replica"):
        core.drain("r0")


def test_weight_and_batch_size_pin_until_released() -> None:
    core, _, _ = make_core()
    core.set_weight("r0", 5.0)
    core.set_batch_size("r0", 9)
    r0 = core.replica("r0")
    assert (r0.weight, r0.weight_pinned, r0.batch_size, r0.batch_pinned) == (5.0, True, 9, True)
    core.set_weight("r0", None)
    core.set_batch_size("r0", None)
    assert (r0.weight, r0.weight_pinned, r0.batch_size, r0.batch_pinned) == (2.0, False, 4, False)


def test_a_cancelled_request_frees_its_slot_and_fails_once() -> None:
    core, clock, rec = make_core(weights=[1.0], batch_sizes=[1])
    core.submit(req(0, clock))
    core.submit(req(1, clock))
    core.cancel("q0")
    assert rec.outcome_of("q0") == "failed"
    assert rec.assigned[-1].request.id == "q1"
    assert core.cancel("q9") is None


def test_snapshot_reports_imbalance_as_work_asked_over_learned_capacity() -> None:
    """Round-robin sends two replicas the same work (each finished one of its two); one is
    (by the operator's pin) three times as fast, so its load is a third of the other's:
    factor 3, band "action"."""
    core, clock, rec = make_core(weights=[1.0, 1.0], batch_sizes=[4, 4], strategy="round-robin")
    core.set_weight("r0", 3.0)
    core.refresh_capacity()
    assert core.replica("r0").speed == pytest.approx(3 * core.replica("r1").speed)
    for i in range(4):
        core.submit(req(i, clock))
    core.complete(rec.assigned[2])
    core.complete(rec.assigned[3])
    snap = core.snapshot()
    assert [r.in_flight for r in snap.replicas] == [1, 1]
    assert snap.replicas[1].load == pytest.approx(3 * snap.replicas[0].load)
    assert snap.imbalance_factor == pytest.approx(3.0)
    assert snap.band == "action"
    assert snap.outcomes == {"completed": 2}


def test_fresh_telemetry_is_used_and_stale_telemetry_is_not() -> None:
    core, clock, _ = make_core(weights=[1.0])
    r0 = core.replica("r0")
    r0.telemetry = Telemetry(utilization=0.7, received_at=clock())
    clock.advance(2.0)
    snap = core.snapshot().replicas[0]
    assert (snap.utilization, snap.utilization_from_telemetry, snap.stale) == (0.7, True, False)
    clock.advance(2.0)
    snap = core.snapshot().replicas[0]
    assert (snap.utilization, snap.utilization_from_telemetry, snap.stale) == (0.0, False, True)


def test_the_decision_log_explains_each_placement() -> None:
    core, clock, _ = make_core()
    core.submit(req(0, clock))
    (decision,) = core.decisions
    assert decision.request_id == "q0"
    assert decision.strategy == "weighted-least-connections"
    assert len(decision.candidates) == 4
    chosen = next(c for c in decision.candidates if c.replica == decision.chosen)
    assert chosen.score == min(c.score for c in decision.candidates if c.score is not None)


def test_the_retry_hint_is_bounded_however_slow_the_fleet() -> None:
    """A fleet that completed one request in a minute would put a full queue's drain at
    many minutes (1,280 s was sent); the hint stops at ``queue.retry_after_max_s``."""
    core, clock, rec = make_core(weights=[1.0], batch_sizes=[1], queue_size=100)
    for i in range(101):
        assert core.submit(req(i, clock)) is None
    clock.advance(60.0)
    core.complete(rec.assigned[0])
    finished = core.submit(req(101, clock))
    finished = finished or core.submit(req(102, clock))
    assert finished is not None
    assert finished.retry_after_s == core.settings.queue.retry_after_max_s == 30.0
