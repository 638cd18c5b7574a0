"""Adaptive weights and batch sizes: overload signals an LLM engine gives, damped, bounded,
pinned values untouched, never moved on a single reading."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.adaptive import (
    BatchSignals,
    BatchStreak,
    TunerChange,
    WeightInput,
    retune_batch,
    retune_weights,
    undo_growth,
)
from router.clock import ManualClock
from router.config.schema import AdaptiveConfig
from router.core import CoreListener, RouterCore
from router.operator_values import MAX_WEIGHT, MIN_WEIGHT, weight_problem
from router.replica import EngineLoad, Telemetry
from router.request import Request
from tests.fleet_factory import make_fleet

CFG = AdaptiveConfig(
    weights=True, batch_sizes=True, weight_damping=0.5, hysteresis=2, grow_past_batch_size=True
)
FILE = 64
"""The fleet file's batch size, where a test does not care."""
QUEUE = BatchSignals(engine_waiting=12, engine_running=40, saturated=True)
CALM = BatchSignals(engine_waiting=0, engine_running=40, saturated=True)


def test_weights_move_toward_learned_capacity_shares_by_the_damping() -> None:
    """Equal static weights, one card learned 3x as fast: targets 1.5 and 0.5, half-way."""
    inputs = [WeightInput(1.0, 1.0, False, 300.0), WeightInput(1.0, 1.0, False, 100.0)]
    fast, slow = retune_weights(inputs, CFG)
    assert fast == pytest.approx(1.25)
    assert slow == pytest.approx(0.75)


def test_weights_allow_an_eleven_fold_spread_by_default() -> None:
    """The old 4x bound clipped a card 11x the slowest; the default allows 256x."""
    cfg = AdaptiveConfig(weights=True, weight_damping=1.0)
    inputs = [WeightInput(1.0, 1.0, False, 1100.0), WeightInput(1.0, 1.0, False, 100.0)]
    fast, slow = retune_weights(inputs, cfg)
    assert fast / slow == pytest.approx(11.0)


def test_weights_stay_within_bounds_of_the_static_weight() -> None:
    cfg = AdaptiveConfig(weights=True, weight_damping=1.0, weight_bounds=(0.5, 2.0))
    inputs = [WeightInput(1.0, 1.0, False, 1000.0)] + [
        WeightInput(1.0, 1.0, False, 1.0) for _ in range(2)
    ]
    assert retune_weights(inputs, cfg) == [2.0, 0.5, 0.5]


def test_a_slow_first_token_lowers_a_weight() -> None:
    """Same learned capacity, but one replica answers in 4 s against a 2 s target."""
    cfg = AdaptiveConfig(weights=True, weight_damping=1.0)
    inputs = [WeightInput(1.0, 1.0, False, 100.0, 0.5), WeightInput(1.0, 1.0, False, 100.0, 4.0)]
    quick, slow = retune_weights(inputs, cfg)
    assert quick == pytest.approx(2 * slow)


def test_a_pinned_weight_is_left_alone() -> None:
    inputs = [WeightInput(1.0, 3.0, True, 500.0), WeightInput(2.0, 1.0, False, 100.0)]
    pinned, free = retune_weights(inputs, CFG)
    assert pinned == 3.0
    assert free == pytest.approx(1.5)  # half-way to 2.0, all the unpinned weight


def test_an_engine_queue_cuts_the_batch_only_after_hysteresis() -> None:
    streak = BatchStreak()
    assert retune_batch(256, QUEUE, streak, CFG, FILE) == (256, "")
    size, why = retune_batch(256, QUEUE, streak, CFG, FILE)
    assert size == 192
    assert "engine queue 12 for 2 intervals" in why


def test_other_overloads_cut_multiplicatively_never_below_the_engines_batch_or_floor() -> None:
    cfg = replace(CFG, batch_bounds=(8, 512))
    slow = BatchSignals(engine_waiting=0, engine_running=40, ttft_s=5.0)
    assert retune_batch(256, slow, BatchStreak(high=5), cfg, FILE)[0] == 192
    assert retune_batch(44, slow, BatchStreak(high=5), cfg, FILE)[0] == 40  # the engine ran 40
    assert retune_batch(9, BatchSignals(preempted=3), BatchStreak(high=5), cfg, FILE)[0] == 8


def test_an_engine_queue_beside_free_kv_cache_is_a_burst_not_overload() -> None:
    """vLLM admits a few prefills per step: a burst waits briefly with the cache half empty."""
    burst = BatchSignals(engine_waiting=30, engine_running=12, engine_kv_usage=0.4)
    assert burst.overload(CFG) is None
    full = BatchSignals(engine_waiting=30, engine_running=12, engine_kv_usage=0.95)
    assert full.overload(CFG) == "engine queue 30"


def test_preemptions_and_slow_first_tokens_are_overload_too() -> None:
    assert BatchSignals(preempted=2).overload(CFG) == "2 preempted"
    assert BatchSignals(ttft_s=3.0).overload(CFG) == "TTFT p90 3.00 s over 2 s"
    assert BatchSignals(ttft_s=1.0).overload(CFG) is None


def test_the_batch_grows_by_one_slot_then_by_eighths_once_the_engine_takes_it_up() -> None:
    """A first growth probes with one slot (the engine may be at its own limit); once the
    engine runs more than the old size, growths are an eighth."""
    streak = BatchStreak()
    assert retune_batch(64, CALM, streak, CFG, FILE)[0] == 64
    assert retune_batch(64, CALM, streak, CFG, FILE)[0] == 65
    took_up = replace(CALM, engine_running=65)
    assert undo_growth(65, took_up, streak, CFG) == (65, "")
    assert streak.taken_up
    assert retune_batch(65, took_up, streak, CFG, FILE)[0] == 65
    assert retune_batch(65, took_up, streak, CFG, FILE)[0] == 73
    assert retune_batch(64, replace(CALM, saturated=False), BatchStreak(low=5), CFG, FILE)[0] == 64


def test_by_default_the_batch_grows_back_by_eighths_to_the_fleet_files_size_and_no_further() -> (
    None
):
    """Cut below the fleet file's size by an overload, a replica grows back an eighth at a
    time; at that size it stays, however long its slots are all in use."""
    cfg = replace(CFG, grow_past_batch_size=False)
    roomy = replace(CALM, engine_running=192, engine_kv_usage=0.3)
    sizes = [192]
    for _ in range(12):
        sizes.append(retune_batch(sizes[-1], roomy, BatchStreak(low=5), cfg, 256)[0])
    assert sizes[:5] == [192, 216, 243, 256, 256]
    assert set(sizes[4:]) == {256}


def test_the_batch_does_not_grow_past_what_the_engine_runs() -> None:
    """All slots used, cache not full, but requests wait in the engine (its max_num_seqs):
    more slots would only queue there."""
    capped = BatchSignals(engine_waiting=8, engine_running=256, engine_kv_usage=0.5, saturated=True)
    assert capped.overload(CFG) is None
    assert retune_batch(256, capped, BatchStreak(low=5), CFG, FILE) == (256, "")


def test_the_batch_grows_only_where_the_kv_cache_holds_the_added_sequences() -> None:
    """256 at once fill 85% of the cache: an eighth more (288) would fill it and queue in the
    engine or preempt; one slot more would not. At 90% not even that."""
    full = replace(CALM, engine_running=256, engine_kv_usage=0.85)
    assert retune_batch(256, full, BatchStreak(low=5, taken_up=True), CFG, FILE) == (256, "")
    assert retune_batch(256, full, BatchStreak(low=5), CFG, FILE)[0] == 257
    roomy = replace(full, engine_kv_usage=0.6)
    assert retune_batch(256, roomy, BatchStreak(low=5, taken_up=True), CFG, FILE)[0] == 288
    brim = replace(full, engine_kv_usage=0.9)
    assert retune_batch(256, brim, BatchStreak(low=5), CFG, FILE) == (256, "")


def test_a_growth_the_engine_does_not_take_up_is_undone_and_not_tried_again() -> None:
    """Grown from 256 to 257, the engine still runs 256 and queues the rest (its own
    max_num_seqs): back to 256 after two such readings, and no growth past it after."""
    streak = BatchStreak()
    roomy = replace(CALM, engine_running=256, engine_kv_usage=0.5)
    assert retune_batch(256, roomy, streak, CFG, FILE)[0] == 256
    assert retune_batch(256, roomy, streak, CFG, FILE)[0] == 257
    capped = BatchSignals(engine_waiting=1, engine_running=256, engine_kv_usage=0.5, saturated=True)
    assert undo_growth(257, capped, streak, CFG) == (257, "")  # one reading moves nothing
    assert retune_batch(257, capped, streak, CFG, FILE) == (257, "")  # nor does a round
    size, why = undo_growth(257, capped, streak, CFG)
    assert size == 256
    assert "ran at most 256 at once for 2 readings" in why
    for _ in range(6):
        assert undo_growth(256, roomy, streak, CFG) == (256, "")
        assert retune_batch(256, roomy, streak, CFG, FILE) == (256, "")


def test_a_burst_admitted_after_a_growth_is_not_taken_for_the_engines_limit() -> None:
    """Requests queue in the engine while it takes up the new slots: its running count
    rises past the old size, so no limit is learned and the growth stands."""
    streak = BatchStreak(grown_from=256)
    rising = [
        BatchSignals(engine_waiting=20, engine_running=n, engine_kv_usage=0.5, saturated=True)
        for n in (262, 280)
    ]
    for signals in rising:
        assert undo_growth(288, signals, streak, CFG) == (288, "")
    assert streak.ceiling is None
    assert streak.taken_up


def test_an_engine_that_runs_more_than_its_learned_limit_may_grow_again() -> None:
    """Restarted with a larger max_num_seqs: the old limit no longer holds."""
    streak = BatchStreak(ceiling=256)
    roomy = replace(CALM, engine_running=256, engine_kv_usage=0.5)
    assert retune_batch(256, roomy, replace(streak), CFG, FILE) == (256, "")
    more = replace(roomy, engine_running=300)
    assert undo_growth(300, more, streak, CFG) == (300, "")
    assert streak.ceiling is None
    streak.low = 5
    assert retune_batch(300, more, streak, CFG, FILE)[0] == 337


def test_no_signal_means_no_change() -> None:
    """Without engine metrics or any first token, the tuner has nothing to go on."""
    assert retune_batch(64, BatchSignals(saturated=True), BatchStreak(low=5), CFG, FILE) == (64, "")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    start=st.integers(1, 512),
    floor=st.integers(1, 64),
    readings=st.lists(
        st.builds(
            BatchSignals,
            engine_waiting=st.none() | st.integers(0, 50),
            engine_running=st.none() | st.integers(1, 300),
            engine_kv_usage=st.none() | st.floats(0.0, 1.0),
            preempted=st.integers(0, 3),
            ttft_s=st.none() | st.floats(0.0, 10.0),
            saturated=st.booleans(),
        ),
        max_size=40,
    ),
)
def test_the_batch_tuner_never_moves_on_one_reading_nor_below_its_floor(
    start: int, floor: int, readings: list[BatchSignals]
) -> None:
    cfg = replace(CFG, batch_bounds=(floor, 512))
    size, streak, agree, capped = max(start, floor), BatchStreak(), 0, 0
    last: bool | None = None
    for signals in readings:
        overloaded = signals.overload(cfg) is not None
        agree = agree + 1 if overloaded == last else 1
        last = overloaded
        # The engine queueing while it runs fewer than the batch size allows: a growth
        # not taken up, once two readings in a row show it.
        running = signals.engine_running
        capped = capped + 1 if signals.engine_waiting and running and running < size else 0
        # Each reading is checked as it arrives, then (as if every reading were a round's)
        # by the round.
        undone, why = undo_growth(size, signals, streak, cfg)
        if undone != size:
            assert capped >= 2, "undone on a single reading"
            assert why
            assert floor <= undone < size
        new, why = retune_batch(undone, signals, streak, cfg, FILE)
        if new != undone:
            assert agree >= 2, "moved on a single reading"
            assert why
        assert new >= floor
        size = new


def test_the_core_cuts_a_queueing_replica_and_records_the_signal() -> None:
    fleet = make_fleet([1.0, 1.0], [8, 8])
    fleet = replace(fleet, router=replace(fleet.router, adaptive=CFG))
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(0))
    core.set_batch_size("r1", 8)  # pinned: left alone
    for i in range(16):
        core.submit(Request(f"q{i}", 10, 10, arrival=clock()))
    seen = []

    class Listener:
        def on_tune(self, changes: list[object]) -> None:
            seen.extend(changes)

    for _ in range(2):
        for r in core.pool:
            r.engine = EngineLoad("vllm", received_at=clock(), waiting=5, running=4)
            r.telemetry = Telemetry(utilization=1.0, received_at=clock())
        changes = core.tune()
    assert [c.message for c in changes] == [
        "r0: batch_size 8 -> 6 (engine queue 5 for 2 intervals)"
    ]
    assert core.replica("r1").batch_size == 8


def test_busy_gpus_alone_never_shrink_a_batch() -> None:
    """NVML reads ~100% for any busy engine: with that and nothing else, sizes hold."""
    fleet = make_fleet([1.0], [8])
    fleet = replace(fleet, router=replace(fleet.router, adaptive=CFG))
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(0))
    for i in range(8):
        core.submit(Request(f"q{i}", 10, 10, arrival=clock()))
    for _ in range(10):
        core.replica("r0").telemetry = Telemetry(utilization=1.0, received_at=clock())
        assert not [c for c in core.tune() if c.setting == "batch_size"]
    assert core.replica("r0").batch_size == 8


def test_the_core_undoes_a_growth_on_the_engines_readings_between_rounds() -> None:
    """Grown by a slot the engine does not take up, the replica is back at its old size two
    readings of the engine's metrics later, without waiting for the next rounds."""
    fleet = make_fleet([1.0], [8])
    fleet = replace(fleet, router=replace(fleet.router, adaptive=CFG))
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(0))
    for i in range(12):
        core.submit(Request(f"q{i}", 10, 10, arrival=clock()))
    r = core.replica("r0")
    seen: list[str] = []

    class Listener(CoreListener):
        def on_tune(self, changes: list[TunerChange]) -> None:
            seen.extend(c.message for c in changes)

    core.listeners.append(Listener())
    for _ in range(2):
        r.engine = EngineLoad("vllm", received_at=clock(), waiting=0, running=8, kv_usage=0.3)
        core.tune()
    assert r.batch_size == 9
    for _ in range(2):
        clock.advance(2.0)
        r.engine = EngineLoad("vllm", received_at=clock(), waiting=1, running=8, kv_usage=0.3)
        core.engines_read()
    assert r.batch_size == 8
    assert seen[-1] == (
        "r0: batch_size 9 -> 8 (the engine ran at most 8 at once for 2 readings, more queued in it)"
    )
    core.engines_read()  # the same reading again is not new evidence
    assert r.batch_size == 8


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    statics=st.lists(
        st.sampled_from([MIN_WEIGHT, 1e-3, 1.0, 1e3, MAX_WEIGHT]), min_size=2, max_size=6
    ),
    capacities=st.lists(st.floats(1e-3, 1e6), min_size=6, max_size=6),
)
def test_a_tuned_weight_stays_in_the_range_an_operator_may_set(
    statics: list[float], capacities: list[float]
) -> None:
    # The default bounds (1/16 to 16 times the static weight) would otherwise carry a weight at
    # either end of the range past it: 16e6, which the control surface refuses from an operator.
    cfg = AdaptiveConfig(weights=True, weight_damping=1.0)
    inputs = [WeightInput(w, w, False, c) for w, c in zip(statics, capacities, strict=False)]
    for weight in retune_weights(inputs, cfg):
        assert weight_problem(weight) is None
