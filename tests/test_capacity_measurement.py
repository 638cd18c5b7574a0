"""How learned capacity reads a card: the model's saturation rate on a small KV cache, work
counted in engine steps, the measurement's units, and a prior that loses a clear conflict."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from router.capacity import SAMPLE, MixTracker, Prior, ReplicaCapacity, _agreement
from router.capacity_prior import sample_curve
from router.clock import ManualClock
from router.config.loader import load_fleet
from router.core import RouterCore
from router.perf.model import Deployment
from router.replica import EngineLoad
from router.sim.capacity import measure_capacity
from router.sim.replica_model import deployment_for, engine_for
from router.sim.runner import Workload, catalog_for, trace_rows

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"


@pytest.mark.parametrize("card", ["l4-0", "a10-0"])
def test_the_prior_of_a_card_with_a_small_kv_cache_is_what_it_sustains(card: str) -> None:
    """An L4 or an A10 holds a few dozen of the conv trace's requests: the model run on a
    sample of the lengths the router saw reads its saturation rate within 4% of what the
    simulator measures it sustaining on the whole trace (short runs alone read 5-9% high)."""
    fleet = load_fleet(FLEETS / "untuned-wide.yaml")
    replica = next(r for r in fleet.replicas if r.id == card)
    catalog = catalog_for(fleet)
    mix = Workload(trace_rows("conv")).mix
    true = measure_capacity(partial(engine_for, replica, catalog), mix, seed=1)
    deployment = deployment_for(replica, catalog)
    for seed in range(3):
        rng = random.Random(seed)
        lengths = tuple(sorted(mix.sample(rng) for _ in range(SAMPLE)))
        curve = sample_curve(deployment, lengths)
        assert curve is not None
        assert curve[0] == pytest.approx(true, rel=0.04)


def _h100() -> Deployment:
    fleet = load_fleet(FLEETS / "untuned-four-generations.yaml")
    replica = next(r for r in fleet.replicas if r.gpu_model == "H100-SXM")
    return deployment_for(replica, catalog_for(fleet))


def _flat_prior(cost: float) -> Prior:
    """A model in which a card is as efficient at any concurrency as at saturation: each of
    ``c`` requests gets a ``1 / c`` share of it."""
    return Prior(_h100(), (1.0, (0.0,) + (1.0,) * 256), cost)


class _ClosedLoop:
    """Eight requests always running on one replica; each holds it for one 0.04 s step per
    output token (prefill costs nothing), so the replica does 8 / 0.04 = 200 steps a second
    and 200 / (mean output) requests a second, whatever the prompts."""

    STEP_S = 0.04
    CONCURRENCY = 8

    def __init__(self, acc: ReplicaCapacity) -> None:
        self.acc = acc
        self.now = 0.0

    def complete(self, prompt: int, output: int, cost: float) -> None:
        # Every request runs beside seven others for its whole life: one of them finishes
        # and is replaced at each completion, so concurrency never changes.
        acc, life = self.acc, output * self.STEP_S
        self.now += life / self.CONCURRENCY
        acc.advance(self.CONCURRENCY, self.now)
        # Its share: a 1/8 part of the engine over its whole life.
        mark = acc.share_mark() - life / self.CONCURRENCY
        plain = 0.5 * prompt + output
        acc.completed((prompt, output), cost, mark, self.now - life, self.now, plain)


def _rps(acc: ReplicaCapacity) -> float:
    measured = acc.measured(256)
    assert measured is not None
    return measured / acc.own.cost


def test_a_rare_long_prompt_does_not_swing_the_measured_rate() -> None:
    """A 14,000-token prompt answered in 39 tokens (the conv trace's longest) costs as much as
    nine ordinary requests in the cost units strategies compare, but holds the engine for 39
    steps: counted in steps, the replica's measured rate moves by under 1% when it completes
    (counted in cost it jumped by about 6%, and two identical cards read 0.97 and 1.21)."""
    rng = random.Random(0)
    acc = ReplicaCapacity(_flat_prior(cost=750.0))
    loop = _ClosedLoop(acc)
    loop.acc.advance(0, 0.0)
    while loop.now < 300.0:
        prompt, output = rng.randint(200, 2000), rng.randint(100, 300)
        loop.complete(prompt, output, 0.5 * prompt + output)
    before = _rps(acc)
    loop.complete(14_000, 39, 0.5 * 14_000 + 39)
    after = _rps(acc)
    assert after == pytest.approx(before, rel=0.01)
    assert before == pytest.approx(200 / 200, rel=0.05)  # 200 steps/s over ~200 tokens each


def test_a_measurement_is_carried_in_the_units_of_the_fleets_model_run() -> None:
    """The fleet's rates are in the mean cost of the sample its model last ran on; the mix
    served since has drifted (its mean cost 5% higher, under the threshold for a new run).
    Carried to the fleet's mix, the measured rate is the same number of requests a second,
    not 5% more."""
    prior = _flat_prior(cost=750.0)
    acc = ReplicaCapacity(prior)
    acc.own_prior = prior  # the replica serves the fleet's mix: the fleet's run stands for its own
    loop = _ClosedLoop(acc)
    acc.advance(0, 0.0)
    while loop.now < 120.0:
        loop.complete(1100, 200, 787.5)
    measured = acc.measured(256)
    assert measured is not None
    carried = acc.at_fleet_mix(measured)
    assert carried / prior.cost == pytest.approx(measured / acc.own.cost)


def test_a_prior_keeps_its_weight_against_noise_and_loses_it_against_a_clear_conflict() -> None:
    """Within 10% of the prior, a well-measured card keeps ~95% of the prior's weight; at a
    third of it, under 0.4; a wild first reading with little evidence is not yet a
    conflict."""
    assert _agreement(1.1, 1.0, evidence=3.0) > 0.95
    assert _agreement(0.9, 1.0, evidence=3.0) > 0.95
    assert _agreement(1.0 / 3.0, 1.0, evidence=3.0) < 0.4
    assert _agreement(2.0, 1.0, evidence=0.1) > _agreement(2.0, 1.0, evidence=3.0)
    assert _agreement(0.0, 1.0, evidence=3.0) == 1.0


def test_the_model_runs_with_the_kv_size_the_fleet_file_declares() -> None:
    """The mixed fleet's file gives each V100 100,000 tokens of cache where the model's memory
    arithmetic allows 111,539. The engine holds what the file says; the prior runs with the
    same, so a rate measured at low concurrency is not carried up to a saturation the card
    cannot reach (the V100s read 1.13 of their capacity that way)."""
    fleet = load_fleet(FLEETS / "mixed-a100-v100.yaml")
    core = RouterCore(fleet, clock=ManualClock(), rng=random.Random(0))
    v100 = core.replica("v100-0")
    acc = core.capacity.per_replica[v100.index]
    assert acc.prior.deployment is not None
    assert acc.prior.deployment.kv_capacity_tokens == 100_000
    assert acc.prior.kv_tokens == 100_000
    unlimited = replace(acc.prior.deployment, kv_limit=None)
    assert unlimited.kv_capacity_tokens > 110_000


def test_a_kv_size_reported_by_the_engine_runs_the_model_again_with_it() -> None:
    """An engine that reports a cache a third the size the model assumed (vLLM's
    ``cache_config_info``: memory taken by activations, another process on the card) gets a
    prior run with that cache: a card that batches fewer requests does less."""
    fleet = load_fleet(FLEETS / "untuned-four-generations.yaml")
    core = RouterCore(fleet, clock=ManualClock(), rng=random.Random(0))
    l4, twin = core.replica("l4-0"), core.replica("l4-1")
    modelled = core.capacity.per_replica[l4.index].prior.kv_tokens
    assert modelled is not None
    l4.engine = EngineLoad("vllm", received_at=0.0, kv_capacity_tokens=modelled // 3)
    twin.engine = EngineLoad("vllm", received_at=0.0, kv_capacity_tokens=modelled // 16 * 16)
    core.refresh_capacity()
    small, same = (core.capacity.per_replica[r.index].prior for r in (l4, twin))
    assert small.kv_tokens == modelled // 3
    assert same.kv_tokens == modelled  # a whole-block rounding is not a new card
    assert small.rate is not None
    assert same.rate is not None
    assert small.rate < 0.8 * same.rate


def test_an_engine_reporting_more_cache_than_its_memory_holds_keeps_the_models_figure() -> None:
    fleet = load_fleet(FLEETS / "untuned-four-generations.yaml")
    core = RouterCore(fleet, clock=ManualClock(), rng=random.Random(0))
    l4 = core.replica("l4-0")
    before = core.capacity.per_replica[l4.index].prior
    assert before.kv_tokens is not None
    l4.engine = EngineLoad("vllm", received_at=0.0, kv_capacity_tokens=before.kv_tokens * 4)
    core.refresh_capacity()
    assert core.capacity.per_replica[l4.index].prior is before


def test_the_models_sample_is_priced_at_its_own_mean_cost() -> None:
    """The model's rate is in requests of the sample it ran on; their own mean cost turns it
    into cost units, not a decaying mean over other requests."""
    mix = MixTracker()
    for _ in range(3 * SAMPLE):
        mix.add(100, 100, 150.0)
    for _ in range(SAMPLE):
        mix.add(1000, 100, 600.0)
    assert mix.sample_cost(0.5) == pytest.approx(600.0)
    assert mix.mean_cost(0.5) < 600.0  # the decaying mean still remembers the short ones


def test_requests_per_second_follow_a_new_sample_through_the_filter() -> None:
    """The published requests per second divide a rate in cost units by the mean request of
    the model's sample, and a heavy-tailed trace's samples differ by several percent. When a
    new sample's mean request is 15% above the last one's, the figure follows it through the
    same filter as the rate (a fifteen-second time constant), not in one step."""
    fleet = load_fleet(FLEETS / "untuned-four-generations.yaml")
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(0))
    h100 = core.replica("h100-0")
    fc = core.capacity

    def complete(prompt: int, output: int, n: int) -> None:
        for _ in range(n):
            fc.completed(h100, (prompt, output), 0.5 * prompt + output, 0.0, clock(), clock())

    complete(400, 200, SAMPLE)
    readings = []
    for _ in range(3):
        clock.now += 1.0
        core.refresh_capacity()
        readings.append(fc.estimate(h100, clock.now).rps)
    complete(460, 230, 2 * SAMPLE)  # the mean request: 400 cost units, then 460
    for _ in range(90):
        clock.now += 1.0
        core.refresh_capacity()
        readings.append(fc.estimate(h100, clock.now).rps)
    moves = [abs(b - a) / a for a, b in itertools.pairwise(readings)]
    assert max(moves) < 0.02  # a step would be 13%
    assert readings[-1] < readings[2] * 0.9  # and it does follow
