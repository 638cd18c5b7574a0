"""The prediction before a rollout: the fleet simulator run over the rollout's span.

Fed what the live router knows (:class:`FleetState`, read by :func:`fleet_state`): its
fleet file, each replica's learned capacity, batch size and requests in flight, the requests
waiting in its queue, the arrival rate of the last seconds and the lengths of its recent
requests (the capacity estimator keeps the last 2,048; with fewer than 50, the default
shape). :func:`predict` then simulates that fleet (the router core and its strategy, the
engines of the performance model) with the same plan (planned on the *live* capacities, so
the waves are the ones the rollout will run): a warm-up with the state fed in (the requests
in flight and queued submitted at its start), then the rollout, with Poisson arrivals at the
recent rate all along, until it ends and the requests that arrived during it have ended.

Each simulated engine is slowed or sped up to the speed the router measured: the ratio of its
measured rate to the performance model's (router/capacity.py's estimate; a replica not yet
measured takes the median ratio of those that are, else its learned rate's), so a card
slower than its datasheet, or an emulator run at a time scale, is simulated at the speed the
router sees.

**Bounded** by what is simulated, never by the wall clock: at most ``Budget.requests``
arrivals (10,000 by default; the simulator takes some thousands a second on one core, so a
12-replica fleet answers in about 1.5 s), arrivals end with the rollout, and the run ends
once every request that arrived during it has ended (``Budget.tail_s`` at most). The
performance model is not run again on the simulated mix (a tenth of a second or more each
time, most of a simulation's time otherwise). A rollout that would need more arrivals is
simulated with each replica's time out of service shortened to fit
(``Prediction.shortened``; never under ``Budget.min_out_s``): the dip and the peak of a wave
are reached within seconds while the fleet keeps up, and the duration is the simulated one
plus the time taken off. When a wave leaves less capacity than the arrivals need, the queue
grows for the whole load time and the prediction says so (``Prediction.overloaded``): its
peak queue is then a lower bound.
"""

from __future__ import annotations

import contextlib
import copyreg
import math
import random
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from router.capacity import Source
from router.capacity_prior import PENDING, Curve, Pending
from router.config.schema import FleetConfig
from router.control import ControlSurface
from router.core import RouterCore
from router.perf.model import Deployment
from router.replica import ReplicaState
from router.rollout.meter import RolloutFigures
from router.rollout.simulated import SimRolloutSpec, SimulatedRollout
from router.sim.simulator import Simulation
from router.sim.workload import Arrival, LengthMix, LognormalMix, TraceMix, TraceRow, gamma

__all__ = ["Budget", "FleetState", "Prediction", "fleet_state", "predict"]

WARMUP_S = 10.0
"""Simulated seconds before the rollout starts: the fed-in state settles into the
strategy's steady state."""
DRAIN_GUESS_S = 30.0
"""Simulated seconds a wave is guessed to take to drain, to size a bounded run."""
MIN_LENGTHS = 50
"""Recent requests below which the default request shape stands in for the router's mix."""
_DEFAULT_SHAPE = LognormalMix((307.0, 512.0), (154.0, 256.0))
"""router/capacity.py's default shape (means 512 and 256 tokens, medians at 60% of them)."""
_SPEED_CLAMP = 10.0
"""A live rate this many times off the model is believed no further (a measurement gone
wrong, or a replica that barely served)."""


@dataclass(frozen=True, slots=True)
class Budget:
    """How much simulation a prediction may run: the bound on its wall time."""

    requests: int = 10_000
    """Requests simulated at most, warm-up and tail included."""
    min_out_s: float = 5.0
    """A shortened time out of service is never below this (simulated seconds)."""
    tail_s: float = 600.0
    """Simulated seconds after the rollout at most for the requests that arrived during it
    to end (no request arrives then: they take little)."""


@dataclass(frozen=True, slots=True)
class FleetState:
    """What the live router knows of its fleet at one instant (plain data, picklable: a
    prediction runs in another process while the router goes on)."""

    fleet: FleetConfig
    strategy: str
    strategy_params: Mapping[str, Any]
    capacity: Mapping[str, float]
    """Each replica's learned capacity (cost units per second), what the plan is made of."""
    prior: Mapping[str, float]
    """Each replica's capacity by the performance model alone, in the same units, on the same
    lengths: the simulated engine's own speed."""
    batch_sizes: Mapping[str, int]
    in_flight: Mapping[str, int]
    queued: int
    arrival_rps: float
    """Requests per second arriving recently."""
    lengths: tuple[tuple[int, int], ...] = ()
    """Recent (prompt, output) lengths; empty: the default shape."""
    states: Mapping[str, str] = field(default_factory=dict)
    """Each replica's state (a rollout starts with every one active)."""
    measured: Mapping[str, float | None] = field(default_factory=dict)
    """Each replica's rate by the router's accounting alone (None: not measured yet), in the
    units of ``capacity``: what the simulated engine's speed follows."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the simulator predicts a rollout costs the traffic."""

    figures: RolloutFigures
    """Lowest capacity share in service, peak router queue, p99 TTFT of the requests that
    arrive during it, and the duration (full load times counted back in when shortened)."""
    arrival_rps: float
    load_s: float
    """Each replica's time out of service as counted (its full load time)."""
    simulated_load_s: float
    """As simulated: ``load_s``, or shorter to keep within the budget."""
    simulated_s: float
    simulated_requests: int
    shortened: bool
    overloaded: bool
    """A wave leaves less capacity than the arrival rate needs: the queue grows all through
    its load time, and ``peak_queue`` is a lower bound."""
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.figures.to_dict(),
            "arrival_rps": round(self.arrival_rps, 3),
            "load_s": self.load_s,
            "simulated_load_s": round(self.simulated_load_s, 3),
            "simulated_s": round(self.simulated_s, 3),
            "simulated_requests": self.simulated_requests,
            "shortened": self.shortened,
            "overloaded": self.overloaded,
            "note": self.note,
        }


def _mapping_proxy(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


# A FleetState goes to a worker process (the router's manager predicts off its own
# interpreter): the fleet configuration's read-only mappings travel as plain dicts.
copyreg.pickle(MappingProxyType, lambda m: (_mapping_proxy, (dict(m),)))


def fleet_state(core: RouterCore) -> FleetState:
    """The live router's fleet as a prediction is fed it, read now."""
    now = core.clock()
    estimates = {r.id: core.capacity.estimate(r, now) for r in core.pool}
    strategy = core.strategy.name
    configured = core.fleet.router.strategy
    calibration = core.capacity.calibration if core.capacity.calibration > 0 else 1.0
    return FleetState(
        fleet=core.fleet,
        strategy=strategy,
        strategy_params=dict(configured.params) if configured.name == strategy else {},
        capacity={rid: e.rate for rid, e in estimates.items()},
        # The performance model's own rate: the estimator's prior is already scaled by the
        # fleet's calibration (measured over modelled), which is what the engines must follow.
        # An operator's pinned weight says nothing of the card's speed: no calibration then.
        prior={
            rid: e.rate if e.rate_source is Source.OPERATOR else e.prior_rate / calibration
            for rid, e in estimates.items()
        },
        batch_sizes={r.id: r.batch_size for r in core.pool},
        in_flight={r.id: r.in_flight for r in core.pool},
        queued=len(core.queue),
        arrival_rps=core.arrivals.rate(now),
        lengths=tuple(core.capacity.mix.recent),
        states={r.id: str(r.state) for r in core.pool},
        measured={rid: e.measured_rate for rid, e in estimates.items()},
    )


def predict(
    state: FleetState, spec: SimRolloutSpec, budget: Budget = Budget(), seed: int = 0
) -> Prediction:
    """Simulate the rollout ``spec`` on ``state``; RolloutError (PlanError) when it would be
    refused live (a replica out of service, the floor out of reach). Deterministic for a
    seed; bounded by ``budget``."""
    sim = _simulation(state, seed)
    control = ControlSurface(sim.core, wall_clock=lambda: sim.clock.now)
    # Planned first as it is: a plan refused live is refused here, before any simulation.
    plan = SimulatedRollout(sim, control, spec, capacity=state.capacity).plan
    waves = len(plan.waves)
    rate = state.arrival_rps
    full = spec
    drain_guess = min(spec.drain_timeout_s, DRAIN_GUESS_S)
    needed = rate * (WARMUP_S + waves * (drain_guess + spec.back_after_s()))
    shortened = needed > budget.requests
    if shortened:
        room = (budget.requests / rate - WARMUP_S) / waves - drain_guess
        out_s = max(budget.min_out_s, room)
        spec = replace(spec, load_s=min(spec.load_s, out_s), check_interval_s=0.0)
    rollout = SimulatedRollout(sim, control, spec, capacity=state.capacity, actor="prediction")
    sim.at(WARMUP_S, rollout.start)
    _stop_when_settled(sim, rollout)
    # The span is only a backstop: arrivals end with the rollout (or the budget) and the run
    # with the last request that arrived during it.
    span = WARMUP_S + waves * (min(spec.drain_timeout_s, 3600.0) + spec.back_after_s())
    arrivals = _Arrivals(state, rate, budget.requests, rollout, random.Random(seed + 11))
    with contextlib.suppress(_SettledError):
        sim.run(arrivals, span, drain_s=budget.tail_s)
    meter = rollout.meter
    assert meter is not None
    figures = meter.figures(rollout.status().capacity_lowest)
    if figures.duration_s is not None:
        taken_off = waves * (full.back_after_s() - spec.back_after_s())
        figures = replace(figures, duration_s=figures.duration_s + taken_off)
    return Prediction(
        figures=figures,
        arrival_rps=rate,
        load_s=full.load_s,
        simulated_load_s=spec.load_s,
        simulated_s=sim.clock.now,
        simulated_requests=arrivals.count,
        shortened=shortened,
        overloaded=_overloaded(state, plan.lowest),
        note=_note(shortened, arrivals.cut, rollout),
    )


def _simulation(state: FleetState, seed: int) -> Simulation:
    sim = Simulation(state.fleet, state.strategy, seed=seed, strategy_params=state.strategy_params)
    # The performance model is not run again on the simulated mix (a tenth of a second or
    # more each time, most of a prediction's time): the engines are calibrated to the live
    # rates instead, and the simulated router refines its estimates from what it measures.
    sim.core.capacity.fitter = _NoRefit()
    _calibrate(sim, state)
    for rid, s in state.states.items():
        if s != str(ReplicaState.ACTIVE):
            sim.core.drain(rid, "as live")  # so the rollout refuses it as live would
    return sim


class _NoRefit:
    """A fitter whose model runs never finish: the priors the core started with stand."""

    def curve(
        self, deployment: Deployment, lengths: tuple[tuple[int, int], ...]
    ) -> Curve | Pending | None:
        return PENDING


class _Arrivals:
    """The requests in flight and queued now, at the start; then Poisson arrivals at the
    recent rate until the rollout ends or the budget is spent, counted."""

    def __init__(
        self,
        state: FleetState,
        rate: float,
        cap: int,
        rollout: SimulatedRollout,
        rng: random.Random,
    ) -> None:
        self.mix = _mix(state)
        self.rng = rng
        self.cap = cap
        self.rollout = rollout
        self.count = 0
        self.cut = False
        """The budget ran out before the rollout ended."""
        backlog = min(cap, sum(state.in_flight.values()) + state.queued)
        self._backlog = backlog
        self._poisson = gamma(rate, 1.0, math.inf, self.mix, rng) if rate > 0 else iter(())

    def __iter__(self) -> Iterator[Arrival]:
        return self

    def __next__(self) -> Arrival:
        if self.rollout.ended_at is not None:
            raise StopIteration
        if self.count >= self.cap:
            self.cut = True
            raise StopIteration
        if self.count < self._backlog:
            p, o = self.mix.sample(self.rng)
            a = Arrival(0.0, p, o, o)
        else:
            a = next(self._poisson)
        self.count += 1
        return a


class _SettledError(Exception):
    """The rollout ended and every request that arrived during it ended: stop simulating."""


def _stop_when_settled(sim: Simulation, rollout: SimulatedRollout) -> None:
    def check() -> None:
        meter = rollout.meter
        if rollout.ended_at is not None and meter is not None and meter.settled:
            raise _SettledError
        sim.at(sim.clock.now + 1.0, check)

    sim.at(WARMUP_S + 1.0, check)


def _calibrate(sim: Simulation, state: FleetState) -> None:
    """The live batch sizes, and each engine at the speed the router measured."""
    for r in sim.core.pool:
        size = state.batch_sizes.get(r.id)
        if size is not None and size != r.batch_size:
            sim.core.set_batch_size(r.id, size)
    for rid, ratio in _speeds(state).items():
        if not math.isclose(ratio, 1.0, rel_tol=0.02):
            sim.slow(rid, min(_SPEED_CLAMP, max(1 / _SPEED_CLAMP, 1 / ratio)))


def _speeds(state: FleetState) -> dict[str, float]:
    """Each replica's live speed over the model's: its own measurement where it has one
    (the learned rate follows it only slowly, from the model's prior), else the median of
    the measured replicas' (the fleet runs off the model alike: a slower machine, an
    emulator's time scale), else its learned rate's."""
    measured = {
        rid: m / state.prior[rid]
        for rid, m in state.measured.items()
        if m is not None and m > 0 and state.prior.get(rid, 0.0) > 0
    }
    fleet = statistics.median(measured.values()) if measured else None
    speeds = {}
    for rid, model in state.prior.items():
        if rid in measured:
            speeds[rid] = measured[rid]
        elif fleet is not None:
            speeds[rid] = fleet
        elif model > 0 and state.capacity.get(rid, 0.0) > 0:
            speeds[rid] = state.capacity[rid] / model
    return speeds


def _mix(state: FleetState) -> LengthMix:
    if len(state.lengths) < MIN_LENGTHS:
        return _DEFAULT_SHAPE
    return TraceMix([TraceRow(0.0, p, o) for p, o in state.lengths])


def _overloaded(state: FleetState, lowest: float) -> bool:
    """Whether the capacity left at the plan's lowest is under what the arrivals ask."""
    mix = _mix(state)
    total = sum(state.capacity.values())
    # Capacity is in the router's cost units per second (router/cost.py's estimate).
    cost = mix.mean_prompt * state.fleet.router.cost.prompt_factor + mix.mean_output
    return state.arrival_rps * cost > lowest * total


def _note(shortened: bool, cut: bool, rollout: SimulatedRollout) -> str | None:
    parts = []
    if rollout.ended_at is None:
        parts.append("the rollout did not end within the simulated span")
    if shortened:
        parts.append("each replica's time out was shortened to keep within the budget")
    if cut:
        parts.append("arrivals stopped at the budget before the rollout ended")
    return "; ".join(parts) or None
