"""Learned capacity of a card the model does not know, from the requests still streaming on it:
a slow engine whose requests take longer than a minute is measured before any completes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from router.capacity import Progress, ReplicaCapacity, Source, stream_cost
from router.clock import ManualClock
from router.config.loader import load_fleet
from router.core import RouterCore
from router.request import Request
from tests.capacity_support import four_running
from tests.fleet_factory import make_fleet

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"

PROMPT_COST = 50.0
"""A 100-token prompt at the default prompt factor (0.5)."""
OUTPUT = 200
LIFE_S = 100.0
PREFILL_S = 20.0
"""The prompt's share of the request's life, as the cost model prices it (50 of 250)."""
AT_ONCE = 8
SLOW_RATE = AT_ONCE * (PROMPT_COST + OUTPUT) / LIFE_S
"""Cost units a second the slow card does at 8 at once: 20."""


def _streamed(t: float) -> int:
    """Tokens a request started at 0 has streamed by ``t``: none until its prompt is done,
    then evenly to the last at ``LIFE_S``."""
    if t < PREFILL_S:
        return 0
    return min(OUTPUT, int((t - PREFILL_S) / (LIFE_S - PREFILL_S) * OUTPUT))


def _progress(t: float, mark: float) -> list[Progress]:
    tokens = _streamed(t)
    if tokens == 0:
        return []
    return [Progress(PROMPT_COST + tokens, mark, 0.0)] * AT_ONCE


def _occupy(core: RouterCore, index: int, count: int = AT_ONCE) -> None:
    """``count`` requests running on replica ``index``, as the core counts its in-flight."""
    r = core.pool.replicas[index]
    for i in range(count):
        r.running[f"{r.id}-{i}"] = Request(f"{r.id}-{i}", 100, OUTPUT, 0.0)


def _run(core: RouterCore, until: float, *, streams: bool) -> float:
    """The fast card completes its requests; the slow one runs 8 started at 0 that do not end
    before ``LIFE_S``. Refreshed each second as the core does, with the slow card's streams
    when ``streams``; returns the slow card's share mark."""
    fast, slow = core.pool
    acc = core.capacity.per_replica[slow.index]
    _occupy(core, slow.index)
    acc.advance(AT_ONCE, 0.0)
    mark = acc.share_mark()
    second = 1.0
    for t in four_running(core, fast.index, life_s=0.5, cost=100.0):
        while t >= second:
            running = {slow.index: _progress(second, mark)} if streams else None
            core.capacity.refresh(second, running)
            second += 1.0
        if t >= until:
            break
    return mark


def test_a_slow_card_is_measured_from_its_streams_before_any_request_completes() -> None:
    """Both cards unknown to the model, weights at 1. The slow card's requests take 100 s;
    at 30 s none has completed, yet its streams (its prompts done, tokens coming) say what
    it does, and it reads that, measured, where it held the fleet's average."""
    core = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    _run(core, 30.0, streams=True)
    slow = core.pool.replicas[1]
    estimate = core.capacity.estimate(slow, 30.0)
    assert estimate.completions == 0
    assert estimate.measured_rate == pytest.approx(SLOW_RATE, rel=0.02)
    assert estimate.rate_source is Source.MEASURED
    assert estimate.rate == pytest.approx(SLOW_RATE, rel=0.1)
    assert estimate.rate_age_s == 0.0  # as of the last refresh's streams

    blind = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    _run(blind, 30.0, streams=False)
    held = blind.capacity.estimate(blind.pool.replicas[1], 30.0)
    assert held.rate_source is Source.PRIOR
    assert held.measured_rate is None
    assert held.rate > 10 * SLOW_RATE  # the fast card's 800 a second lift the average


def test_streams_before_their_first_token_say_nothing() -> None:
    """Prompts still prefilling have streamed nothing: no measurement, the prior stands."""
    core = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    _run(core, PREFILL_S - 1.0, streams=True)
    estimate = core.capacity.estimate(core.pool.replicas[1], PREFILL_S - 1.0)
    assert estimate.measured_rate is None
    assert estimate.rate_source is Source.PRIOR


def _first_of_a_wave_completes(produced: int) -> RouterCore:
    """Eight requests started at 0 on the slow card, an engine doing ``SLOW_RATE`` plain cost
    units a second shared among them; at 31 s the one that got ahead completes, having
    produced ``produced`` of its ``OUTPUT`` tokens (priced at all of them), and the other
    seven have done the rest of the engine's work. Refreshed then with their streams;
    returns the core."""
    core = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    slow = core.pool.replicas[1]
    acc = core.capacity.per_replica[slow.index]
    _occupy(core, slow.index)
    acc.advance(AT_ONCE, 0.0)
    mark = acc.share_mark()
    now = 31.0
    acc.advance(AT_ONCE, now)
    plain = PROMPT_COST + produced
    acc.completed((100, produced), PROMPT_COST + OUTPUT, mark, 0.0, now, plain)
    slow.running.pop(f"{slow.id}-0")
    rest = (SLOW_RATE * now - plain) / (AT_ONCE - 1)
    core.capacity.refresh(now, {slow.index: [Progress(rest, mark, 0.0)] * (AT_ONCE - 1)})
    return core


def test_the_first_completion_of_a_wave_does_not_speak_for_the_engine_alone() -> None:
    """The request that got ahead of its wave did 250 units in 31 s at a share of 1/8:
    alone it reads 3.2x the engine. The seven still streaming count beside it, and the
    measurement is the engine's rate."""
    core = _first_of_a_wave_completes(OUTPUT)
    estimate = core.capacity.estimate(core.pool.replicas[1], 31.0)
    assert estimate.completions == pytest.approx(1.0)
    assert estimate.measured_rate == pytest.approx(SLOW_RATE)
    alone = (PROMPT_COST + OUTPUT) / (31.0 / AT_ONCE)
    assert alone > 3 * SLOW_RATE


def test_streams_are_priced_as_the_completions_were() -> None:
    """A completion counts the cost the router priced it at (all of ``max_tokens``) where it
    produced 10 tokens; the streams' tokens are priced up by the same ratio (250 for 60
    done), so the engine reads in one unit throughout: its plain rate times that ratio."""
    core = _first_of_a_wave_completes(10)
    estimate = core.capacity.estimate(core.pool.replicas[1], 31.0)
    ratio = (PROMPT_COST + OUTPUT) / (PROMPT_COST + 10)
    assert estimate.measured_rate == pytest.approx(SLOW_RATE * ratio)


def test_a_card_the_model_knows_keeps_its_prior_whatever_streams() -> None:
    """A modelled card's measurement waits for its own completions (counted in engine
    steps, which a stream half-way does not tell)."""
    core = RouterCore(
        load_fleet(FLEETS / "untuned-four-generations.yaml"),
        clock=ManualClock(),
        rng=random.Random(0),
    )
    h100 = core.replica("h100-0")
    acc = core.capacity.per_replica[h100.index]
    _occupy(core, h100.index, 4)
    acc.advance(4, 0.0)
    mark = acc.share_mark()
    core.capacity.refresh(10.0, {h100.index: [Progress(5000.0, mark, 0.0)] * 4})
    estimate = core.capacity.estimate(h100, 10.0)
    assert estimate.measured_rate is None
    assert estimate.rate_source is Source.PRIOR
    assert estimate.rate_age_s is None


def test_streams_of_different_ages_and_concurrencies_give_the_engines_throughput() -> None:
    """An engine that does 20 units a second however many it runs, shared evenly among
    them: requests started a second apart (1 at once, then 2, up to 8), each as far as its
    share of the engine took it, read 20 together, however far each has come."""
    core = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    slow = core.pool.replicas[1]
    acc = core.capacity.per_replica[slow.index]
    marks = []
    for start in range(AT_ONCE):
        acc.advance(start, float(start))
        marks.append(acc.share_mark())
    _occupy(core, slow.index)
    now = 40.0
    acc.advance(AT_ONCE, now)
    # Each request has done the engine's 20 units a second times its share of the engine
    # (time over concurrency), summed over its life so far.
    running = []
    for start, mark in enumerate(marks):
        share = acc.share_mark() - mark
        running.append(Progress(2.5 * AT_ONCE * share, mark, float(start)))
    core.capacity.refresh(now, {slow.index: running})
    assert core.capacity.estimate(slow, now).measured_rate == pytest.approx(2.5 * AT_ONCE)


def test_a_stream_counts_its_prompt_as_its_tokens_come() -> None:
    """The engine prefills a prompt in a step or two: a stream's prompt cost is counted in
    proportion to the tokens streamed of those it is priced for, not whole at its first."""
    assert stream_cost(500.0, 0, 100) == 0.0
    assert stream_cost(500.0, 1, 100) == pytest.approx(6.0)
    assert stream_cost(500.0, 50, 100) == pytest.approx(300.0)
    assert stream_cost(500.0, 100, 100) == pytest.approx(600.0)
    assert stream_cost(500.0, 150, 100) == pytest.approx(650.0)  # past max_tokens: whole


def test_the_core_prices_a_young_stream_by_its_tokens() -> None:
    """One request (a 1,000-token prompt, priced for 100 tokens) one second into its stream
    with one token out, alone on a card the model does not know: the card reads what that
    stream did at the stream's pricing (6 units in a second), not its whole prompt (501)."""
    clock = ManualClock()
    core = RouterCore(make_fleet([1.0, 1.0]), clock=clock)
    core.submit(Request("r0", 1000, 100, arrival=clock()))
    a = core.running["r0"]
    clock.advance(1.0)
    core.first_byte(a)
    a.streamed = 1
    core.refresh_capacity()
    measured = core.capacity.estimate(a.replica, clock()).measured_rate
    assert measured == pytest.approx(stream_cost(500.0, 1, 100))


def _lined(acc: ReplicaCapacity) -> float:
    """Completions on an engine whose seconds per unit of work are ``0.01 + 0.001 c`` at
    ``c`` at once (4 and 16 in turn), enough to draw its line; the time after the last."""
    t = 0.0
    for i in range(60):
        c = 4 if i % 2 else 16
        life = 100.0 * (0.01 + 0.001 * c)
        acc.advance(c, t)
        mark = acc.share_mark()
        t += life
        acc.advance(c, t)
        acc.completed((100, 50), 100.0, mark, t - life, t, 100.0)
    return t


def test_streams_count_in_the_plain_figure_but_not_in_the_line() -> None:
    """A stream's point is its life so far, and where it stands in its life moved the
    line's slope (a real slow engine's line read 2.5x its rate at 20 s): once the
    completions draw the line, streams running leave its reading as it was, while they
    still count as evidence."""
    core = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    acc = core.capacity.per_replica[1]
    now = _lined(acc)
    line = acc.measured(64)
    assert line == pytest.approx(64 / (0.01 + 0.001 * 64), rel=1e-6)
    mark = acc.share_mark()
    acc.advance(16, now + 1.0)
    before = acc.evidence(now + 1.0)
    # Sixteen young streams, together reading 26 times what the engine does at 16.
    acc.progress([Progress(1000.0, mark, now)] * 16, now + 1.0)
    assert acc.measured(64) == line
    assert acc.evidence(now + 1.0) > before
