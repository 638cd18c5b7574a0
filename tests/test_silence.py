"""The silence watch: idle limits learned from chunk gaps, silent streams and silent replicas,
and what health checking does about them (a generation probe; ejection when it fails)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from router.config.schema import HealthConfig, RouterConfig
from router.core import RouterCore
from router.http.health import HealthMonitor
from router.http.silence import (
    FLOOR_S,
    GAP_FACTOR,
    HALF_LIFE_S,
    VERDICT_STEPS,
    IdleLimit,
    SilenceWatch,
)
from router.replica import ReplicaState
from router.scenario.runner_live import _scaled
from tests.test_emulator_support import MODEL, Spec, fleet_config


@dataclass(eq=False)
class FakeAttempt:
    """An attempt in flight as the watch sees it."""

    started_at: float
    streaming: bool = False
    waiting_since: float = 0.0
    reasons: list[str] = field(default_factory=list)

    def interrupt(self, reason: str) -> None:
        self.reasons.append(reason)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ---- idle limits ------------------------------------------------------------------------


def test_a_replica_with_no_gaps_observed_gets_the_ceiling() -> None:
    assert IdleLimit(2.5).limit_s(100.0) == 2.5


def test_the_limit_is_a_multiple_of_the_longest_gap_within_floor_and_ceiling() -> None:
    fast, steady, slow = IdleLimit(5.0), IdleLimit(5.0), IdleLimit(5.0)
    for k in range(100):
        fast.observe(0.01, k * 0.01)
        steady.observe(0.6, k * 0.01)
        slow.observe(2.0, k * 0.01)
    assert fast.limit_s(1.0) == FLOOR_S
    assert steady.limit_s(1.0) == pytest.approx(GAP_FACTOR * 0.6, rel=0.01)
    assert slow.limit_s(1.0) == 5.0


def test_a_ceiling_below_the_floor_wins() -> None:
    limit = IdleLimit(0.4)
    limit.observe(0.001, 0.0)
    assert limit.limit_s(0.0) == 0.4


def test_one_stall_among_thousands_of_short_gaps_sets_the_limit() -> None:
    """The rare stall is what the limit must leave room for, however many gaps follow."""
    limit = IdleLimit(10.0)
    limit.observe(1.0, 0.0)
    for k in range(1, 5000):
        limit.observe(0.02, k * 0.001)
    assert limit.limit_s(5.0) == pytest.approx(GAP_FACTOR * 1.0, rel=0.1)


def test_a_stall_is_forgotten_by_halves() -> None:
    limit = IdleLimit(10.0)
    limit.observe(2.0, 0.0)
    assert limit.peak(HALF_LIFE_S) == pytest.approx(1.0)
    assert limit.peak(2 * HALF_LIFE_S) == pytest.approx(0.5)
    limit.observe(0.8, 2 * HALF_LIFE_S)  # longer than what is left of the old peak
    assert limit.peak(2 * HALF_LIFE_S) == pytest.approx(0.8)
    assert limit.limit_s(20 * HALF_LIFE_S) == FLOOR_S


# ---- sweeps -----------------------------------------------------------------------------


def test_a_stream_silent_past_the_limit_is_found_and_its_replica_too() -> None:
    watch = SilenceWatch(2, ceiling_s=2.0)
    talking = FakeAttempt(0.0, streaming=True, waiting_since=9.5)
    silent = FakeAttempt(0.0, streaming=True, waiting_since=7.0)
    watch.begin(0, talking)
    watch.begin(0, silent)
    watch.chunk(0, 9.5, 0.01)
    found = watch.sweep(10.0)
    assert [(i, a) for i, a, _ in found.silent_streams] == [(0, silent)]
    assert found.silent_replicas == []  # the other stream speaks: the replica works


def test_a_stream_writing_to_a_slow_client_is_not_silent() -> None:
    watch = SilenceWatch(1, ceiling_s=2.0)
    watch.begin(0, FakeAttempt(0.0, streaming=True, waiting_since=float("inf")))
    watch.chunk(0, 0.0, None)
    assert watch.sweep(100.0).silent_streams == []


def test_new_requests_do_not_keep_a_silent_replica_looking_alive() -> None:
    """Silence counts from the oldest waiting attempt (or the last word, if later)."""
    watch = SilenceWatch(1, ceiling_s=2.0)
    watch.heard_from(0, 5.0)
    for started in (6.0, 7.0, 7.5, 8.2):
        watch.begin(0, FakeAttempt(started))
    assert watch.sweep(7.9).silent_replicas == []
    assert watch.sweep(8.5).silent_replicas == [(0, 2.5)]


def test_a_stream_is_silent_again_only_counting_from_the_last_verdict_of_working() -> None:
    """A request the engine preempted sits silent on a replica that works: once a probe has
    said so, the stream is no new suspicion until it stays silent a whole limit more."""
    watch = SilenceWatch(1, ceiling_s=2.0)
    preempted = FakeAttempt(0.0, streaming=True, waiting_since=1.0)
    watch.begin(0, preempted)
    assert [a for _, a, _ in watch.sweep(3.5).silent_streams] == [preempted]
    watch.working(0, 4.0)
    assert watch.sweep(5.9).silent_streams == []
    assert [a for _, a, _ in watch.sweep(6.1).silent_streams] == [preempted]


def test_the_verdict_window_is_two_of_the_longest_plausible_steps() -> None:
    """The longest gap seen, or the modelled full-budget step over the calibration, whichever
    is longer; never shorter than the floor (the probe timeout)."""
    watch = SilenceWatch(3, ceiling_s=2.0)
    watch.modelled_step_s = [0.0, 1.6, 1.6]
    watch.chunk(0, 10.0, 0.9)
    watch.chunk(2, 10.0, 0.9)
    assert watch.verdict_window_s(0, 10.0, 0.3, 1.0) == pytest.approx(VERDICT_STEPS * 0.9)
    assert watch.verdict_window_s(1, 10.0, 0.3, 1.0) == pytest.approx(VERDICT_STEPS * 1.6)
    # A fleet measured at half the modelled speed: its steps take twice the model's time.
    assert watch.verdict_window_s(1, 10.0, 0.3, 0.5) == pytest.approx(VERDICT_STEPS * 3.2)
    assert watch.verdict_window_s(2, 10.0, 5.0, 1.0) == 5.0
    unknown = SilenceWatch(1, ceiling_s=2.0)
    assert unknown.verdict_window_s(0, 0.0, 2.0, 1.0) == 2.0  # no gap, no model: the floor


def test_a_replica_without_work_is_never_silent_and_a_zero_ceiling_finds_nothing() -> None:
    assert SilenceWatch(1, 2.0).sweep(1e9) == SilenceWatch(1, 2.0).sweep(0.0)
    off = SilenceWatch(1, ceiling_s=0.0)
    off.begin(0, FakeAttempt(0.0, streaming=True))
    found = off.sweep(1e9)
    assert not found.silent_streams
    assert not found.silent_replicas


# ---- health checking's answer -----------------------------------------------------------


class Generations:
    """A generation probe that answers as told, recording what it was asked and within what
    time; ``meanwhile`` runs while it waits (a replica's streams speaking, say)."""

    def __init__(self, problem: str | None) -> None:
        self.problem = problem
        self.asked: list[tuple[str, str]] = []
        self.timeouts: list[float] = []
        self.meanwhile: Callable[[], None] | None = None

    async def __call__(self, url: str, model: str, timeout_s: float) -> str | None:
        self.asked.append((url, model))
        self.timeouts.append(timeout_s)
        if self.meanwhile is not None:
            self.meanwhile()
        return self.problem


async def _health_ok(_url: str, _timeout_s: float) -> str | None:
    return None  # a frozen engine answers /health: it must never decide here


def monitor(generate: Generations) -> tuple[HealthMonitor, Clock]:
    clock = Clock()
    core = RouterCore(fleet_config(Spec("a"), Spec("b")), clock=clock)
    config = HealthConfig(check_interval_s=0, stream_idle_max_s=2.0, eject_base_s=10)
    return HealthMonitor(core, config, _health_ok, generate=generate), clock


async def _settle(health: HealthMonitor) -> None:
    while health._probes:
        await asyncio.gather(*health._probes)


async def test_a_silent_stream_ends_only_when_a_failed_generation_ejects_its_replica() -> None:
    generate = Generations("generation probe failed: timed out")
    health, clock = monitor(generate)
    stream = FakeAttempt(0.0, streaming=True, waiting_since=1.0)
    waiting = FakeAttempt(2.0)  # sent nothing to its client yet
    health.silence.begin(0, stream)
    health.silence.begin(0, waiting)
    clock.now = 3.5
    health.look_for_silence()
    assert stream.reasons == []  # silence alone ends nothing: the probe decides
    await _settle(health)
    assert stream.reasons == ["a: silent for 3.5 s; generation probe failed: timed out"]
    a = health.core.replica("a")
    assert generate.asked == [(a.config.endpoint + "/v1/completions", MODEL)]
    assert a.state is ReplicaState.EJECTED
    assert health.ejections[0].cause == "silence"
    assert health.ejections_total[("a", "silence")] == 1
    assert waiting.reasons == ["a: silent for 3.5 s; generation probe failed: timed out"]


async def test_a_silent_replica_that_generates_stays_in_service() -> None:
    health, clock = monitor(Generations(None))
    waiting = FakeAttempt(0.0)
    health.silence.begin(1, waiting)
    clock.now = 2.1
    health.look_for_silence()
    await _settle(health)
    assert health.core.replica("b").state is ReplicaState.ACTIVE
    assert waiting.reasons == []
    assert health.silence.heard[1] == 2.1  # heard from: not probed again at the next look
    assert health.silence.sweep(clock.now).silent_replicas == []


async def test_a_replica_ejected_for_silence_comes_back_only_when_it_generates() -> None:
    generate = Generations("generation probe failed: timed out")
    health, clock = monitor(generate)
    health.silence.begin(0, FakeAttempt(0.0))
    clock.now = 2.1
    health.look_for_silence()
    await _settle(health)
    a = health.core.replica("a")
    clock.now = 20.0
    await health.round()  # the window ended; /health would say 200, the generation fails
    assert a.state is ReplicaState.EJECTED
    assert health.ejections[0].in_row == 2
    generate.problem = None
    clock.now = 60.0
    await health.round()
    assert health.core.replica("a").state is ReplicaState.ACTIVE
    assert len(generate.asked) == 3


async def test_a_silent_stream_on_a_replica_that_generates_is_kept() -> None:
    """A slow card's full-budget prefill step silences every stream on it for seconds: the
    probe finds it working, and no stream ends."""
    generate = Generations(None)
    health, clock = monitor(generate)
    streams = [FakeAttempt(0.0, streaming=True, waiting_since=1.0) for _ in range(3)]
    for stream in streams:
        health.silence.begin(0, stream)
    clock.now = 3.5
    health.look_for_silence()
    await _settle(health)
    assert [s.reasons for s in streams] == [[], [], []]
    assert health.core.replica("a").state is ReplicaState.ACTIVE
    clock.now = 4.0
    health.look_for_silence()  # still silent, but found working since: no new probe
    await _settle(health)
    assert len(generate.asked) == 1


async def test_a_replica_heard_from_while_its_probe_waits_is_working() -> None:
    """The probe of a full batch waits for a free slot and may time out; the streams that
    hold the batch speak meanwhile, and that is a verdict of working."""
    generate = Generations("generation probe failed: timed out")
    health, clock = monitor(generate)
    stream = FakeAttempt(0.0, streaming=True, waiting_since=0.5)
    health.silence.begin(0, stream)
    generate.meanwhile = lambda: health.silence.chunk(0, 3.0, 2.5)
    clock.now = 2.6
    health.look_for_silence()
    await _settle(health)
    assert stream.reasons == []
    assert health.core.replica("a").state is ReplicaState.ACTIVE
    assert health.ejections == {}


async def test_the_probe_of_a_silent_replica_waits_its_verdict_window() -> None:
    """A replica whose steps were seen to take 1.8 s gets two of them to generate a token,
    not the 2 s probe timeout: a one-token generation waits for the step in progress."""
    generate = Generations(None)
    health, clock = monitor(generate)
    health.silence.modelled_step_s = [0.0, 0.0]  # the fleet's card is no matter here
    health.silence.chunk(0, 0.0, 1.8)
    health.silence.begin(0, FakeAttempt(0.0, streaming=True, waiting_since=0.0))
    clock.now = 5.5
    health.look_for_silence()
    await _settle(health)
    peak = health.silence.limits[0].peak(5.5)  # 1.8 s, decayed a little since
    assert peak > 1.6
    assert generate.timeouts == [pytest.approx(VERDICT_STEPS * peak)]
    status = health.status()["a"]
    assert isinstance(status, dict)
    assert status["verdict_window_s"] == pytest.approx(VERDICT_STEPS * peak)  # the admin API's


def test_a_slower_emulated_fleet_gives_the_watch_as_much_more_time() -> None:
    """A scenario's fleet at time scale 0.5 steps twice as long: its silences and its
    probes' one token take twice as long too. A faster fleet does not shrink them below what
    the router's own machine needs."""
    base = RouterConfig().health
    slower = _scaled(RouterConfig(), 0.5).health
    assert slower.stream_idle_max_s == 2 * base.stream_idle_max_s
    assert slower.check_timeout_s == 2 * base.check_timeout_s
    faster = _scaled(RouterConfig(), 10.0).health
    assert faster.stream_idle_max_s == base.stream_idle_max_s
    assert faster.check_timeout_s == base.check_timeout_s
