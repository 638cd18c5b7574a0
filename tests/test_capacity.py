"""Learned capacity: a prior from the performance model, refined by the router's accounting,
with its source; KV size from the engine first; an operator's pin overrides."""

from __future__ import annotations

import heapq
import math
import random
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from router.capacity import Progress, Source
from router.capacity_prior import KEPT_RUNS, PENDING, Curve, InlineFitter, Pending, ProcessFitter
from router.clock import ManualClock
from router.config.loader import load_fleet
from router.config.schema import StrategyConfig
from router.core import RouterCore
from router.http.metrics import RouterMetrics
from router.load_curve import REACH
from router.perf.model import Deployment
from router.replica import EngineLoad
from router.request import Request
from router.sim.runner import KEEP_UP, Workload, catalog_for, fleet_capacity, simulate, trace_rows
from router.sim.simulator import Simulation
from tests.capacity_support import four_running
from tests.fleet_factory import make_fleet
from tests.test_emulator_support import metric

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"
FOUR_GENERATIONS = FLEETS / "untuned-four-generations.yaml"


def _core(path: Path) -> RouterCore:
    return RouterCore(load_fleet(path), clock=ManualClock(), rng=random.Random(0))


def test_the_prior_ranks_cards_by_what_the_performance_model_says_they_do() -> None:
    """Every weight at 1, yet an H100 starts far ahead of an L4: the prior is the model's."""
    core = _core(FOUR_GENERATIONS)
    speed = {r.config.gpu_model: r.speed for r in core.pool}
    assert speed["H100-SXM"] > speed["A100-80GB"] > speed["V100-32GB"] > speed["L4"]
    assert speed["H100-SXM"] / speed["L4"] > 8
    estimate = core.capacity.estimate(core.replica("h100-0"), 0.0)
    assert estimate.rate_source is Source.PRIOR
    assert estimate.measured_rate is None
    assert estimate.kv_source is Source.PRIOR
    assert estimate.kv_tokens is not None
    assert estimate.kv_tokens > 100_000


def test_a_card_the_model_does_not_know_gets_its_weight_times_the_fleets_rate() -> None:
    """The test fleet serves a model the catalogue does not have: weights are the prior."""
    core = RouterCore(make_fleet([2.0, 1.0]), clock=ManualClock())
    fast, slow = core.pool
    assert fast.speed == pytest.approx(2 * slow.speed)
    assert core.capacity.estimate(fast, 0.0).kv_tokens is None


def test_a_card_the_model_does_not_know_is_soon_what_it_measures_not_the_fleets_average() -> None:
    """Two cards the model does not know, weights at 1, one 4x the other: their prior is
    the fleet's average, which says nothing of either. Refreshed each second as the core
    does, after 60 s each is within 10% of what it measurably did (with the average holding
    a fifth of each figure, the slow card read 1.4x its measurement)."""
    core = RouterCore(make_fleet([1.0, 1.0]), clock=ManualClock())
    fast, slow = core.pool
    events = heapq.merge(
        ((t, fast.index) for t in four_running(core, fast.index, life_s=0.5)),
        ((t, slow.index) for t in four_running(core, slow.index, life_s=2.0)),
    )
    second = 1.0
    for t, _ in events:
        while t >= second:
            core.capacity.refresh(second)
            second += 1.0
        if t >= 60.0:
            break
    for r, rate in ((fast, 8.0), (slow, 2.0)):
        estimate = core.capacity.estimate(r, 60.0)
        assert estimate.measured_rate == pytest.approx(rate, rel=0.01)
        assert estimate.rate_source is Source.MEASURED
        assert estimate.rate == pytest.approx(rate, rel=0.1)


def _kept_at(core: RouterCore, at_once: int, step: float, t: float, until: float) -> float:
    """Replica 1 kept ``at_once`` requests of cost 100 busy from ``t`` to ``until``, on an
    engine whose seconds per unit of work are ``0.001 + step * c`` at ``c`` at once, each
    replaced as it ends; refreshed each whole second as the core does. The time reached."""
    acc = core.capacity.per_replica[1]
    life = 100.0 * (0.001 + step * at_once)
    acc.advance(0, t)
    # The first wave ends a ``life / at_once`` apart, as if started a life ago; it ran
    # partly before ``t``, so it is not accounted.
    starts: list[tuple[float, float | None]] = [
        (t + life * k / at_once - life, None) for k in range(at_once)
    ]
    acc.advance(at_once, t)
    while True:
        start, mark = min(starts)
        end = start + life
        if end > until:
            return t
        for second in range(math.floor(t) + 1, math.floor(end) + 1):
            acc.advance(at_once, float(second))
            core.capacity.refresh(float(second))
        acc.advance(at_once, end)
        if mark is not None:
            acc.completed((100, 50), 100.0, mark, start, end, 100.0)
        starts.remove((start, mark))
        starts.append((end, acc.share_mark()))
        t = end


def test_a_load_curves_first_reading_is_taken_at_once_then_filtered() -> None:
    """Until the line through its completions can be drawn, a card the model does not know
    is measured by its plain throughput at the concurrency it ran, here a third of its
    rate at its batch size of 64. The line's first reading is another figure, not a step
    of the same one: it is taken at once (filtered from the plain figure, real engines'
    rates at 60 s lagged their lines by up to 11%). Its later moves go through the filter."""
    core = RouterCore(make_fleet([1.0, 1.0], batch_sizes=[64, 64]), clock=ManualClock())
    slow = core.pool.replicas[1]
    acc = core.capacity.per_replica[1]
    t = _kept_at(core, 4, 0.0001, 0.0, 20.0)
    plain = core.capacity.estimate(slow, t)
    assert not acc.reads_line(64)
    assert plain.rate_source is Source.MEASURED
    assert plain.rate == pytest.approx(4 / (0.001 + 0.0001 * 4), rel=0.1)
    assert plain.measured_concurrency == 4.0  # what it did 4 at once, not full
    t = _kept_at(core, 16, 0.0001, t, 40.0)
    assert acc.reads_line(64)
    line = core.capacity.estimate(slow, t)
    assert line.measured_concurrency is None  # read at its batch size
    assert line.measured_rate is not None
    assert line.measured_rate == pytest.approx(64 / (0.001 + 0.0001 * 64), rel=0.01)
    assert plain.rate < 0.5 * line.measured_rate
    assert line.rate == pytest.approx(line.measured_rate, rel=0.02)
    # The engine slows down: the line follows its new points, and the published figure
    # follows the line through the filter, behind it.
    t = _kept_at(core, 16, 0.0003, t, 45.0)
    later = core.capacity.estimate(slow, t)
    assert later.measured_rate is not None
    assert later.measured_rate < 0.9 * line.measured_rate
    assert later.measured_rate < later.rate < line.rate


def test_a_measurement_says_how_many_at_once_it_speaks_for_short_of_the_batch() -> None:
    """A card the model does not know, run a few at a time: before its line can be drawn,
    what it did with the requests running now; with a line too scattered to carry to its
    batch, where it is read. A card the model knows is carried to saturation by its curve."""
    core = RouterCore(make_fleet([1.0, 1.0], batch_sizes=[64, 64]), clock=ManualClock())
    unknown = core.pool.replicas[0]
    acc = core.capacity.per_replica[0]
    assert core.capacity.estimate(unknown, 0.0).measured_concurrency is None  # nothing yet
    for i in range(3):
        unknown.running[f"q{i}"] = Request(f"q{i}", 100, 200, 0.0)
    acc.advance(unknown.in_flight, 0.0)
    mark = acc.share_mark()
    core.capacity.refresh(10.0, {0: [Progress(500.0, mark, 0.0)] * 3})
    assert core.capacity.estimate(unknown, 10.0).measured_concurrency == 3.0
    scraped = RouterMetrics(core).render().decode()
    at_once = "gpurouter_replica_capacity_measured_concurrency"
    assert metric(scraped, f'{at_once}{{replica="r0"}}') == 3.0
    assert f'{at_once}{{replica="r1"}}' not in scraped  # nothing measured
    rng = random.Random(3)
    for _ in range(40):
        c = rng.choice([1.0, 2.0])
        life = (0.02 + 0.01 * c) * 100.0 * rng.uniform(0.9, 1.1)
        acc.curve.add(c, life / 100.0, 100.0, 1.0)
    reading = acc.curve.reading(64)
    assert reading is not None
    assert acc.measured_concurrency(64, unknown.in_flight) == reading[0] == REACH * 2
    known = _core(FOUR_GENERATIONS)
    h100 = known.capacity.per_replica[known.replica("h100-0").index]
    assert h100.measured_concurrency(64, 2) is None


def test_kv_size_comes_from_the_engine_then_the_fleet_file_then_the_model() -> None:
    core = _core(FLEETS / "mixed-a100-v100.yaml")  # the file declares 450,000 on an A100
    a100 = core.replica("a100-0")
    assert core.capacity.estimate(a100, 0.0).kv_source is Source.FLEET_FILE
    assert a100.kv_limit == 450_000
    a100.engine = EngineLoad("vllm", received_at=0.0, kv_capacity_tokens=520_000)
    core.refresh_capacity()
    estimate = core.capacity.estimate(a100, 1.0)
    assert (estimate.kv_tokens, estimate.kv_source, estimate.kv_age_s) == (
        520_000,
        Source.ENGINE,
        1.0,
    )
    assert a100.kv_limit == a100.kv_tokens == 520_000


def test_an_operators_pinned_weight_overrides_what_was_learned() -> None:
    core = _core(FOUR_GENERATIONS)
    l4, h100 = core.replica("l4-0"), core.replica("h100-0")
    core.set_weight("l4-0", 4.0)
    core.refresh_capacity()
    assert core.capacity.estimate(l4, 0.0).rate_source is Source.OPERATOR
    assert l4.speed == pytest.approx(4 * core.capacity.unit_rate)
    assert h100.speed > core.capacity.unit_rate  # the others keep their learned figures


def _simulate(strategy: str, load: float, slow: dict[str, float] | None = None) -> Simulation:
    fleet = load_fleet(FOUR_GENERATIONS)
    workload = Workload(trace_rows("conv"))
    capacities = fleet_capacity(fleet, workload.mix)
    sim = Simulation(fleet, strategy, seed=3, catalog=catalog_for(fleet), capacities=capacities)
    for replica, factor in (slow or {}).items():
        sim.slow(replica, factor)
    rate = load * sum(capacities.values())
    sim.run(workload.generate(rate, 90.0, seed=3), 90.0)
    return sim


def test_measurement_corrects_a_prior_that_is_wrong() -> None:
    """One H100 runs at a third of its speed (the model cannot know): after 90 s at load 0.5
    its learned rate is measured, and well under its healthy twin's."""
    sim = _simulate("shortest-expected-delay", 0.5, slow={"h100-1": 3.0})
    core = sim.core
    healthy = core.capacity.estimate(core.replica("h100-0"), sim.clock.now)
    slowed = core.capacity.estimate(core.replica("h100-1"), sim.clock.now)
    assert slowed.rate_source is Source.MEASURED
    assert slowed.prior_rate == pytest.approx(healthy.prior_rate)
    assert slowed.rate < 0.5 * healthy.rate


def test_the_default_strategy_serves_an_untuned_fleet_at_its_capacity() -> None:
    """Every weight 1, every batch size 256, an 11x spread in memory bandwidth: at 90% of the
    fleet's capacity the default strategy keeps up, with p99 time to first token under 2 s.
    (Round-robin, the fixed split, falls behind on the same arrivals.)"""
    fleet = load_fleet(FOUR_GENERATIONS)
    workload = Workload(trace_rows("conv"))
    capacities = fleet_capacity(fleet, workload.mix)
    rate = 0.9 * sum(capacities.values())
    default = simulate(fleet, StrategyConfig().name, workload, rate, 90.0, 5, capacities)
    assert default.kept_up >= KEEP_UP
    assert default.result.ttft_p99_s is not None
    assert default.result.ttft_p99_s < 2.0
    fixed = simulate(fleet, "round-robin", workload, rate, 90.0, 5, capacities)
    assert fixed.kept_up < KEEP_UP


def test_a_fleet_slower_than_the_model_recalibrates_the_prior_of_its_least_used_cards() -> None:
    """Every card runs at half the model's speed (as an emulator at time scale 0.5 would):
    the busy cards measure it, and the calibration they agree on halves every prior, so a
    card with few completions is not left at twice what it can do."""
    everyone = {f"{kind}-{i}": 2.0 for kind in ("h100", "a100", "v100", "l4") for i in (0, 1)}
    sim = _simulate("shortest-expected-delay", 0.25, slow=everyone)
    core = sim.core
    assert core.capacity.calibration == pytest.approx(0.5, rel=0.25)
    l4 = core.capacity.estimate(core.replica("l4-0"), sim.clock.now)
    model = l4.prior_rate / core.capacity.calibration
    assert l4.rate == pytest.approx(0.5 * model, rel=0.25)


def test_cards_sent_a_cut_of_the_lengths_are_measured_at_their_capacity_on_the_fleets_mix() -> None:
    """Shortest expected delay sends the slow cards the short requests and the H100s the long
    ones; each card's rate is measured on what it got and carried to the fleet's mix by the
    model, so it reads near what the card sustains on the whole mix (it read 0.7-0.8 of that
    when the measurement was taken at the fleet's mix)."""
    sim = _simulate("shortest-expected-delay", 0.5)
    true = fleet_capacity(sim.fleet, Workload(trace_rows("conv")).mix)
    for r in sim.core.pool:
        estimate = sim.core.capacity.estimate(r, sim.clock.now)
        if estimate.rate_source is Source.MEASURED:
            assert estimate.rps == pytest.approx(true[r.id], rel=0.12), r.id
    measured = {
        r.config.gpu_model
        for r in sim.core.pool
        if sim.core.capacity.estimate(r, sim.clock.now).rate_source is Source.MEASURED
    }
    assert {"H100-SXM", "V100-32GB"} <= measured


class _NeverReady:
    """A fitter whose runs never finish, and which records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[Deployment, tuple[tuple[int, int], ...]]] = []

    def curve(self, deployment: Deployment, lengths: tuple[tuple[int, int], ...]) -> Pending:
        self.asked.append((deployment, lengths))
        return PENDING


def test_a_model_run_under_way_keeps_the_prior_and_is_asked_again_on_the_same_lengths() -> None:
    """The live router runs the model off the event loop: until a run is back, the prior
    stands, and later refreshes ask for the run already under way, not a new one on the
    lengths completed since."""
    clock = ManualClock()
    core = RouterCore(load_fleet(FOUR_GENERATIONS), clock=clock, rng=random.Random(0))
    fitter = _NeverReady()
    core.capacity.fitter = fitter
    before = {r.id: r.speed for r in core.pool}
    for i in range(120):
        core.submit(Request(f"r{i}", 1000 + i, 200, arrival=clock()))
        clock.advance(0.05)
        assignment = core.running[f"r{i}"]
        core.first_byte(assignment)
        core.complete(assignment, output_tokens=200)
        if i in (60, 90, 119):
            clock.advance(1.0)
            core.expire()
    # The fleet's sample was frozen at the first refresh past 50 completions (61 of them);
    # without that, the later refreshes would have asked again on 91 and 120.
    assert max(len(lengths) for _, lengths in fitter.asked) == 61
    assert {r.id: r.speed for r in core.pool} == pytest.approx(before)


def test_the_process_fitter_answers_pending_then_the_models_curve_to_every_ask() -> None:
    """The fleet's refit takes its cards' runs only when all are in, and a replica's refit
    can ask for the same lengths: a finished run is still there for the next ask (it was
    handed out once, and live the fleet's refit could then never land)."""
    deployment = _core(FOUR_GENERATIONS).capacity.per_replica[0].prior.deployment
    assert deployment is not None
    lengths = tuple((500 + 7 * i, 100 + i) for i in range(60))
    fitter = ProcessFitter()
    try:
        answer = fitter.curve(deployment, lengths)
        for _ in range(3000):  # bounded: the worker starts in about a second, a run takes less
            if not isinstance(answer, Pending):
                break
            time.sleep(0.01)
            answer = fitter.curve(deployment, lengths)
        again = [fitter.curve(deployment, lengths) for _ in range(2)]
    finally:
        fitter.close()
    assert answer == InlineFitter().curve(deployment, lengths)
    assert again == [answer, answer]


def test_the_process_fitter_keeps_the_latest_finished_runs_and_every_pending_one() -> None:
    deployment = _core(FOUR_GENERATIONS).capacity.per_replica[0].prior.deployment
    assert deployment is not None
    fitter = ProcessFitter()
    pending: Future[Curve | None] = Future()
    keys = [(deployment, ((100 + i, 10),)) for i in range(KEPT_RUNS + 1)]
    fitter._runs[keys[0]] = pending
    for key in keys[1:]:
        done: Future[Curve | None] = Future()
        done.set_result(None)
        fitter._runs[key] = done
    try:
        fitter.curve(deployment, ((5, 5),))  # a new run: the oldest finished ones make room
        assert len(fitter._runs) == KEPT_RUNS
        assert fitter._runs[keys[0]] is pending
        assert keys[1] not in fitter._runs
        assert keys[2] not in fitter._runs
        assert keys[-1] in fitter._runs
    finally:
        fitter.close()


_UNDER_A_CAPTURE = """
import contextlib, time
from router.capacity_prior import InlineFitter, Pending, ProcessFitter
from router.perf.model import Deployment
from router.perf.profiles import default_catalog

class Capture:  # what a Textual app puts in sys.stderr: a stream without a descriptor
    def write(self, text): return len(text)
    def flush(self): pass
    def fileno(self): return -1

catalog = default_catalog()
deployment = Deployment(catalog.gpu("A100-80GB"), catalog.model("Llama-3.1-8B"))
lengths = tuple((500 + 7 * i, 100 + i) for i in range(60))
fitter = ProcessFitter()
try:
    with contextlib.redirect_stderr(Capture()):
        answer = fitter.curve(deployment, lengths)
    for _ in range(3000):  # bounded: the worker starts in about a second, a run takes less
        if not isinstance(answer, Pending):
            break
        time.sleep(0.01)
        answer = fitter.curve(deployment, lengths)
finally:
    fitter.close()
assert answer == InlineFitter().curve(deployment, lengths), answer
print("fitted")
"""


def test_the_process_fitter_starts_under_a_console_that_captures_stderr() -> None:
    """Under the console, sys.stderr has no descriptor; the worker starts all the same. In a
    fresh interpreter: multiprocessing starts its resource tracker once per process."""
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_CAPTURE],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fitted"
