"""Learned capacity: what each replica measurably does, with where the figure came from.

Every load-aware strategy, the tuners, the imbalance factor and the console read one estimate
per replica: its *service rate* (units of request cost it completes per second when it has all
the work it can run at once) and its *KV capacity* (tokens its cache holds).

Service rate. The prior is the performance model's saturation rate for the replica's GPU
and served model, run on the lengths of the requests the router has seen
(router/capacity_prior.py: the stepped engine model, closed-loop at a grid of concurrencies).
The GPU is the fleet file's until the node's agent names it: a card NVML names that the
profiles know, and that is another than the file's, is what the model runs from then on
(the replica is flagged, ``Replica.gpu_mismatch``), and the estimate takes it at once.
It is refined from the router's own accounting. An engine that runs ``c`` requests at once
completes ``rate * efficiency(c)`` per second, ``efficiency(c)`` being the model's throughput
at ``c`` over its throughput at saturation; so each request progresses at
``rate * efficiency(c) / c``. The replica integrates ``efficiency(c) / c`` over time, each
request is stamped with the integral when it starts, and when it completes its work and the
share it had over its life are summed: work over shares is the rate at saturation, measured
at whatever concurrency the replica ran, and a long request weighs in both sums, so the
lengths' spread cancels. Both sums decay with ``TAU_S``. The work summed is the request's
engine steps (a token generated each, a prefill chunk each), which is what its share of the
engine pays for; the cost units strategies compare count a prompt token as half an output
token, and in them a rare long prompt, done in a step or two, swung two identical cards'
figures 0.97 and 1.21 apart. The steps' rate is turned into cost units by the mean cost per
step of the requests the replica served.

The efficiency curve is the one for the lengths the replica itself served (a strategy that
sorts by size sends a slow card the short requests, which it batches far better than the
fleet's mix), and the rate so measured is carried to the fleet's mix by the model's ratio
between the two. The measured rate takes over from the prior as its evidence grows (the
decayed sum of shares: seconds at saturation it covers; half-way at ``EVIDENCE_S``, or at
``WEIGHT_PRIOR_EVIDENCE_S`` where the prior is only the static weight), so a card too little
used to measure keeps its prior. The published figure follows through a low-pass
filter (``SMOOTH_S``), but for a card the model does not know its first measurement, and its
load curve's first reading, are each taken at once: another figure, not a step of the same
one. Where the performance model does not know the card or the model, the prior is the
replica's static weight times the fleet's rate per unit of weight, and the measurement is
the replica's own load curve (router/load_curve.py: seconds per unit of work against
concurrency, a line through its completions) read at its batch size; until that line can be
drawn, the plain throughput at the concurrency it ran, in which the requests streaming on
such a card count beside its completions, each as far as it has come (``Progress``): a
slow engine whose requests take a minute has no completion for that minute, and held the
fleet's average with every weight at 1 (a real CPU engine 5.8x slower than that, for 70 s);
and its first completions are the requests that got ahead of their wave. The line itself is
drawn through completed requests only: a stream's point is its life so far, and its slope
came from how far along the streams were (a real engine's line read 2.5x its rate at 20 s).

Model runs take a tenth of a second or more: the live router does them in a worker process
(``ProcessFitter``) and keeps the prior it has until one is back.

KV capacity: the engine's own figure from its /metrics (vLLM's ``vllm:cache_config_info``)
where it gives one, else the fleet file's ``kv_capacity_tokens``, else the performance
model's.

Where the whole fleet runs faster or slower than the model (a datasheet that flatters,
an emulator at a time scale), the median ratio of measured to modelled rate over the replicas
measured well enough (``calibration``) scales every prior, so a card too little used to
measure starts from what its measured peers say rather than from the raw model.

An operator's pinned weight overrides the learned rate: the replica's speed is then its
weight times the rate per unit of weight of the replicas left to learn.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from router.capacity_prior import Curve, Fitter, InlineFitter, Pending, throughput_curve
from router.config.schema import FleetConfig, ReplicaConfig
from router.errors import GpuRouterError
from router.load_curve import LoadCurve
from router.perf.model import Deployment, WorkloadMix
from router.perf.profiles import GpuProfile, ProfileCatalog, default_catalog, load_catalog
from router.replica import Replica
from router.request import estimate_cost
from router.sim.engine import DEFAULT_MAX_BATCHED_TOKENS

log = logging.getLogger(__name__)

TAU_S = 60.0
"""Time constant of the measured rate: long enough that a steady load gives a steady figure
(one interval to the next moves it by a few percent), short enough to follow a replica that
slows down within a couple of minutes."""
EVIDENCE_S = 10.0
"""Evidence at which the measured rate and the prior count equally: seconds of the engine at
saturation that the measurement covers (decayed). A card run at a twentieth of its
saturation rate gathers it twenty times slower than a full one: its measurement is an
extrapolation twenty times over, and its calibrated prior says more."""
WEIGHT_PRIOR_EVIDENCE_S = 1.0
"""The same for a card the performance model does not know, whose prior is its static weight
times the fleet's rate per unit of weight: with the weights left at 1 that is the fleet's
average, which says nothing of this card, so a second of measurement outweighs it. (Two real
engines 4x apart held that average for a fifth of their figure after 60 s: 0.7 and 1.2 of
what each did.)"""
CONFLICT = math.log(2.0)
"""A well-measured card this far from its prior (a factor of 1.5) halves the prior's weight;
within 10% (what the measurement's noise and the model's error span) it keeps ~95%."""
OWN_FIT = 50
"""Completions on a replica before the model is run on the lengths it served."""
SMOOTH_S = 15.0
"""Time constant of the low-pass filter on each published estimate."""
REFRESH_S = 1.0
"""How often estimates are recomputed and pushed to the strategies."""
MIX_MOVE = 0.1
"""Relative change of the mean request shape that recomputes the performance-model priors."""
CHANGE = 0.01
"""Relative change of a replica's speed that is pushed to the strategies' indexes."""
KV_MOVE = 0.02
"""Relative gap between the KV size the model ran with and the one the engine or the fleet
file gives that runs the model again (vLLM rounds its figure down to whole blocks)."""
DEFAULT_MIX = WorkloadMix(prompt_tokens=512.0, output_tokens=256.0)
"""The request shape assumed before any request has completed (lognormal, medians at 60% of
these means: a typical chat trace's skew)."""
SAMPLE = 2048
"""Recent requests' lengths the performance model is run on. A card whose KV cache holds a
few dozen requests turns on the rare long prompts: 512 of the conv trace's lengths put its
modelled rate 0.96-1.04 of the whole trace's by draw, 2,048 0.98-1.02."""
MIN_SAMPLE = 50
"""Completions before the model is run on the lengths seen rather than the default shape."""
DEFAULT_RATE_PER_WEIGHT = 1000.0
"""Cost units per second per unit of weight assumed while no replica's rate is known at all
(only ratios between replicas matter then)."""


class Source(StrEnum):
    PRIOR = "prior"
    """The performance model, or the static weight where the model does not know the card."""
    MEASURED = "measured"
    """The router's own accounting of finished requests."""
    ENGINE = "engine"
    """The engine's own /metrics."""
    FLEET_FILE = "fleet file"
    """Declared in the fleet file."""
    OPERATOR = "operator"
    """An operator's pinned weight."""


@dataclass(frozen=True, slots=True)
class Progress:
    """A request still running on a replica, as far as its stream has come."""

    cost: float
    """Cost units done so far, as a completion's plain cost counts them (``stream_cost``)."""
    mark: float
    """The replica's share integral when it started (``ReplicaCapacity.share_mark``)."""
    started: float


def stream_cost(prompt_cost: float, streamed: int, max_tokens: int) -> float:
    """What a stream has done so far, in a completion's plain cost units: the tokens
    streamed, and its prompt's cost in proportion to them (of the ``max_tokens`` it is priced
    for). The engine prefills a prompt in a step or two, where the cost model prices its
    tokens at a fraction of a generated token's: counted whole from the first token, a young
    stream read several times the engine's speed, and a slow real engine's measurement read
    2.5x its rate at 20 s with such streams among its points (docs/benchmarks.md)."""
    if streamed <= 0:
        return 0.0
    return prompt_cost * min(1.0, streamed / max(max_tokens, 1)) + streamed


@dataclass(frozen=True, slots=True)
class _Running:
    """What the requests still streaming on a replica add to its measurement, as of ``at``."""

    at: float
    cost: float
    shares: float


KvFigure = tuple[int | None, "Source | None", float | None]
"""Tokens, where the figure came from, and the age of the engine reading behind it."""


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """One replica's learned capacity at one instant, for snapshots and explanations."""

    rate: float
    """Cost units per second at saturation (the units strategies compare)."""
    rps: float
    """The same in requests per second at the workload's mean request."""
    rate_source: Source
    rate_age_s: float | None
    """Seconds since the last completion, or the streams in flight, that refined it (None:
    never measured)."""
    prior_rate: float
    measured_rate: float | None
    """What the router's accounting alone says (None: nothing measured yet; a card the model
    does not know is measured from its streams before its first completion)."""
    completions: float
    """Recent completions behind the measurement (decayed with ``TAU_S``)."""
    measured_concurrency: float | None
    """Requests at once the measurement speaks for, where that is short of the batch size
    (``ReplicaCapacity.measured_concurrency``): a figure for that many at once, not for the
    replica full. None: read at the batch size, or nothing measured."""
    kv_tokens: int | None
    kv_source: Source | None
    kv_age_s: float | None
    """Age of the engine reading the KV figure came from (None for the fleet file or prior)."""


@dataclass(frozen=True, slots=True)
class FitPoint:
    """The shape and count of requests the model was last run on."""

    mix: WorkloadMix
    count: int


class MixTracker:
    """A request shape, from completed requests: decaying means of the lengths and cost, and
    the most recent lengths themselves (what the performance model is run on)."""

    __slots__ = ("cost", "count", "output", "prompt", "recent", "recent_cost", "weight")

    def __init__(self) -> None:
        self.prompt = DEFAULT_MIX.prompt_tokens
        self.output = DEFAULT_MIX.output_tokens
        self.cost = 0.0
        self.weight = 0.0
        self.count = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=SAMPLE)
        self.recent_cost: deque[float] = deque(maxlen=SAMPLE)
        """The same requests' costs: the mean request the model's rate on them is in."""

    def add(self, prompt_tokens: int, output_tokens: int, cost: float) -> None:
        # The first completions move the means quickly, later ones by 1/1000 each.
        self.weight = min(self.weight + 1.0, 1000.0)
        k = 1.0 / self.weight
        p, o = max(1, prompt_tokens), max(1, output_tokens)
        self.prompt += k * (p - self.prompt)
        self.output += k * (o - self.output)
        self.cost += k * (cost - self.cost) if self.cost else cost
        self.recent.append((p, o))
        self.recent_cost.append(cost)
        self.count += 1

    def refit_due(self, last: FitPoint | None, first_at: int) -> bool:
        """Whether to run the model again on these lengths: first at ``first_at``
        completions, then when the mean shape has moved and enough new requests came in to
        say so (as many as at the last run while the sample grows, a whole new sample once it
        is full), which keeps the model runs (a tenth of a second or more each) to a handful
        per replica."""
        if self.count < first_at:
            return False
        if last is None:
            return True
        new = self.count - last.count
        return new >= min(last.count, SAMPLE) and _moved(self.mix, last.mix)

    def point(self) -> FitPoint:
        return FitPoint(self.mix, self.count)

    @property
    def mix(self) -> WorkloadMix:
        return WorkloadMix(max(self.prompt, 0.0), max(self.output, 1.0))

    def cost_per_effort(self) -> float:
        """Mean cost over mean effort (``_effort``) of these requests: turns a rate in steps
        into one in cost units (1 before any completion)."""
        effort = _effort((self.prompt, self.output))
        return self.cost / effort if self.cost > 0 and effort > 0 else 1.0

    def sample_cost(self, prompt_factor: float) -> float:
        """Mean cost of the requests in ``recent`` (the model's sample); before any
        completion, the default mix's."""
        if self.recent_cost:
            return sum(self.recent_cost) / len(self.recent_cost)
        return self.mean_cost(prompt_factor)

    def mean_cost(self, prompt_factor: float) -> float:
        """Mean cost of a request; before any completion, the default mix's."""
        if self.cost > 0:
            return self.cost
        return DEFAULT_MIX.prompt_tokens * prompt_factor + DEFAULT_MIX.output_tokens


class Prior:
    """What the performance model says of one replica at a request mix
    (router/capacity_prior.py): its saturation rate and its efficiency at each concurrency."""

    __slots__ = ("cost", "deployment", "efficiency", "kv_tokens", "rps")

    def __init__(self, deployment: Deployment | None, curve: Curve | None, cost: float) -> None:
        self.deployment = deployment
        self.kv_tokens = None if deployment is None else deployment.kv_capacity_tokens
        self.rps: float | None = None
        self.efficiency: Sequence[float] = (0.0, 1.0)
        self.cost = cost
        """Mean cost of the requests the model was run on."""
        if curve is not None:
            self.rps, self.efficiency = curve

    @property
    def rate(self) -> float | None:
        """Cost units per second at saturation on the mix it was run on."""
        return None if self.rps is None else self.rps * self.cost

    def efficiency_at(self, concurrency: int) -> float:
        eff = self.efficiency
        return eff[concurrency] if concurrency < len(eff) else eff[-1]


class Refit:
    """A model run asked for on a frozen sample of lengths, taken up when it is ready (the
    live router runs them off the event loop: router/capacity_prior.py's ``ProcessFitter``)."""

    __slots__ = ("cost", "lengths", "point")

    def __init__(self, mix: MixTracker, prompt_factor: float) -> None:
        self.point = mix.point()
        self.lengths = tuple(mix.recent)
        # The model's rate is in requests of this sample: times their own mean cost it is in
        # cost units. The decaying mean over other requests put it up to 7% off.
        self.cost = mix.sample_cost(prompt_factor)

    def prior(self, deployment: Deployment, fitter: Fitter) -> Prior | None:
        """The prior, or None while the run is under way."""
        curve = fitter.curve(deployment, self.lengths)
        if isinstance(curve, Pending):
            return None
        return Prior(deployment, curve, self.cost)


class ReplicaCapacity:
    """One replica's accumulators, its prior at the fleet's mix and the model at the mix it
    actually serves. ``advance`` must be called just before the replica's number of requests
    in flight changes, so each stretch of time is counted at the concurrency it ran at."""

    __slots__ = (
        "_last_completion",
        "_own_at_fit",
        "_own_refit",
        "_plain",
        "_priced",
        "_running",
        "_share",
        "_shares",
        "_stamp",
        "_work",
        "completions",
        "curve",
        "own",
        "own_prior",
        "prior",
    )

    def __init__(self, prior: Prior) -> None:
        self.prior = prior
        self.own = MixTracker()
        """The lengths this replica completed: a strategy that sorts by size sends a slow
        card the short requests, a mix the fleet's figure says nothing of."""
        self.own_prior: Prior | None = None
        """The model at ``own`` (None until enough completions to fit it)."""
        self._own_at_fit: FitPoint | None = None
        self._own_refit: Refit | None = None
        self._share = 0.0
        """Integral over time of efficiency(c) / c, c the requests in flight: the share of
        the engine's saturation rate one request gets, summed (never decays; marks differ)."""
        self._shares = 0.0
        self._work = 0.0
        self._priced = self._plain = 0.0
        """Completions' cost as priced (from ``max_tokens``) and as done (the tokens they
        produced), decayed: what turns a stream's tokens so far into priced units."""
        self.completions = 0.0
        self._stamp: float | None = None
        self._last_completion: float | None = None
        self.curve = LoadCurve()
        """Seconds per unit of work against concurrency: read only where the model does not
        know the replica (its efficiency is then 1, so a request's share is its time over its
        concurrency, and its life over its share is its mean concurrency)."""
        self._running: _Running | None = None
        """The requests still streaming, where the model does not know the replica."""

    def advance(self, in_flight: int, now: float) -> None:
        stamp, self._stamp = self._stamp, now
        if stamp is None or now <= stamp or not in_flight:
            return
        # Each of the requests in flight progresses at its share of the engine's throughput.
        self._share += self._model().efficiency_at(in_flight) / in_flight * (now - stamp)

    def share_mark(self) -> float:
        """Where the share integral stands: stamped on a request when it starts, so that its
        modelled share of the engine over its whole life is known when it completes."""
        return self._share

    def completed(
        self,
        lengths: tuple[int, int],
        cost: float,
        mark: float,
        started: float,
        now: float,
        plain: float,
    ) -> None:
        """A request completed: ``cost`` as the router priced it, ``plain`` the same price
        for the tokens it produced."""
        last, self._last_completion = self._last_completion, now
        decay = 1.0 if last is None else math.exp(-max(now - last, 0.0) / TAU_S)
        share = max(self._share - mark, 0.0)
        self._work = self._work * decay + _effort(lengths)
        self._priced = self._priced * decay + cost
        self._plain = self._plain * decay + plain
        self._shares = self._shares * decay + share
        self.completions = self.completions * decay + 1.0
        self.own.add(lengths[0], lengths[1], cost)
        life = now - started
        if self.prior.deployment is None and share > 0 and life > 0 and cost > 0:
            self.curve.add(life / share, life / cost, cost, decay)

    def progress(self, running: Sequence[Progress], now: float) -> None:
        """The requests running on this replica, as far as their streams have come (the
        share integral advanced to ``now``). Counted only where the model does not know the
        replica (a modelled card has its prior until it completes enough), in the plain
        throughput beside its completions: counting only the completed ones once there were
        any, a slow engine's first wave was measured by the few requests that got ahead of
        it (1.9-2.0 of its rate kept full, then back, docs/benchmarks.md). They take no part
        in the load curve's line, which is drawn through whole requests.

        A completion counts its cost as the router priced it, from ``max_tokens``; where
        answers stop short of that, a stream's cost so far is priced up by the ratio of the
        two over the replica's completions, so that both count in the same units."""
        self._running = None
        if not self.counts_streams():
            return
        priced = self._priced / self._plain if self._priced > 0 and self._plain > 0 else 1.0
        cost = shares = 0.0
        for p in running:
            share = self._share - p.mark
            if share > 0 and now > p.started and p.cost > 0:
                cost += p.cost * priced
                shares += share
        if shares > 0:
            self._running = _Running(now, cost, shares)

    def counts_streams(self) -> bool:
        """Whether ``progress`` counts the streams running: where the model does not know the
        replica."""
        return self.prior.deployment is None

    def measured(self, batch_size: int) -> float | None:
        """Cost units per second at saturation on the mix this replica served, from
        accounting alone: the work its requests did over the model's share of the engine
        each had during its own life (a long request weighs in both, so the lengths' spread
        cancels instead of adding noise). Without a model, the load curve at ``batch_size``;
        until it can be drawn, the plain throughput, streams included (``progress``)."""
        if self.prior.deployment is None:
            return self._unmodelled(batch_size)
        if self._shares <= 0 or self.completions < 1.0:
            return None
        return self._work / self._shares * self.own.cost_per_effort()

    def measured_concurrency(self, batch_size: int, in_flight: int) -> float | None:
        """Requests at once ``measured`` speaks for, where the model does not know the
        replica and that is short of ``batch_size``: its line read short of its batch (the
        points scatter too much to carry it there), or, until the line can be drawn, its plain
        throughput, at up to the most it ran at once (its completions' decayed highest, or
        the ``in_flight`` requests running now). The plain throughput is below what the card
        does full; a line read short of its batch is its own extrapolation to there, which can
        land on either side (a real engine's read 0.2 and 1.1-1.2 of its rate full that way,
        docs/benchmarks.md). None: read at the batch size, or a card the model knows (its
        efficiency curve carries any concurrency to saturation)."""
        if self.prior.deployment is not None:
            return None
        reading = self.curve.reading(batch_size)
        at = reading[0] if reading is not None else max(self.curve.highest, in_flight)
        return at if 0 < at < batch_size else None

    def reads_line(self, batch_size: int) -> bool:
        """Whether ``measured`` reads the load curve: where the model does not know the
        replica, once its completions draw the line."""
        return self.prior.deployment is None and self.curve.rate_at(batch_size) is not None

    def _unmodelled(self, batch_size: int) -> float | None:
        """The load curve at ``batch_size``; until it can be drawn, the plain throughput at
        the concurrency the replica ran (its efficiency is 1 throughout: a share is time over
        concurrency), the requests still streaming counted beside the completed ones."""
        at_batch = self.curve.rate_at(batch_size)
        if at_batch is not None:
            return at_batch
        running = self._running
        cost = shares = 0.0
        if self._shares > 0 and self.completions >= 1.0:
            decay = 1.0 if running is None else self._decay_to(running.at)
            cost = self._work * self.own.cost_per_effort() * decay
            shares = self._shares * decay
        if running is not None:
            cost, shares = cost + running.cost, shares + running.shares
        return cost / shares if shares > 0 and cost > 0 else None

    def fitted(self) -> bool:
        """Whether the model at this replica's own mix is there to read its accounting by."""
        return self.own_prior is not None

    def recent_completions(self, now: float) -> float:
        """Completions behind the measurement, decayed to ``now``."""
        return self.completions * self._decay_to(now)

    def evidence(self, now: float) -> float:
        """Seconds at saturation the measurement covers, decayed to ``now`` (with the
        requests still streaming, where they count)."""
        running = 0.0 if self._running is None else self._running.shares
        return self._shares * self._decay_to(now) + running

    def measured_at(self) -> float | None:
        """When the measurement last took in a request: a completion, or the streams running
        at the last refresh (None: never measured)."""
        if self._running is not None:
            return self._running.at
        return self._last_completion

    def _decay_to(self, now: float) -> float:
        last = self._last_completion
        return 0.0 if last is None else math.exp(-max(now - last, 0.0) / TAU_S)

    def at_fleet_mix(self, measured: float) -> float:
        """A rate measured on this replica's own mix, carried to the fleet's mix by the
        model's ratio between the two (the card's speed from the measurement, how its
        throughput depends on the lengths from the model)."""
        own, fleet = self.own_prior, self.prior
        if own is None or own.rps is None or fleet.rps is None or self.own.cost <= 0:
            return measured
        # Through requests per second: the measurement is in units of the mean cost of what
        # the replica served lately, the fleet's rates in those of the sample its model last
        # ran on, and the two drift apart between model runs (5% read as 5% more speed).
        return measured / self.own.cost * (fleet.rps / own.rps) * fleet.cost

    def refit_own(
        self,
        deployment: Deployment | None,
        fitter: Fitter,
        prompt_factor: float,
        fleet: FitPoint | None,
    ) -> None:
        """Run the model on the lengths this replica served, once it has served enough to
        say, and again when they change; where they are much the fleet's (a strategy that
        does not sort by size), the fleet's run (``fleet``: its shape) stands for its own."""
        if deployment is None:
            return
        if self._own_refit is None:
            if not self.own.refit_due(self._own_at_fit, OWN_FIT):
                return
            if fleet is not None and not _moved(self.own.mix, fleet.mix):
                self._take(self.own.point(), self.prior)
                return
            self._own_refit = Refit(self.own, prompt_factor)
        prior = self._own_refit.prior(deployment, fitter)
        if prior is not None:
            self._take(self._own_refit.point, prior)
            self._own_refit = None

    def refit_own_again(self, prompt_factor: float) -> None:
        """Run the model on the lengths this replica served again (its card changed: a new
        KV size), keeping what was measured; until then the last run stands."""
        if self._own_at_fit is not None:
            self._own_refit = Refit(self.own, prompt_factor)

    def _take(self, point: FitPoint, prior: Prior) -> None:
        if self._own_at_fit is None:
            # Shares so far were counted on the fleet's curve, which can be far from this
            # replica's (a slow card sent only short requests batches many more of them).
            self._work = self._shares = self.completions = 0.0
        self._own_at_fit, self.own_prior = point, prior

    def _model(self) -> Prior:
        own = self.own_prior
        return own if own is not None and own.rps is not None else self.prior


class FleetCapacity:
    """Learned capacity of every replica of a pool, kept by the router core."""

    def __init__(
        self,
        fleet: FleetConfig,
        replicas: Sequence[Replica],
        prompt_factor: float,
        catalog: ProfileCatalog | None = None,
    ) -> None:
        self.catalog = catalog if catalog is not None else _catalog(fleet)
        self.prompt_factor = prompt_factor
        self.fitter: Fitter = InlineFitter()
        """Runs the performance model; the live router swaps in a ``ProcessFitter``."""
        self.mix = MixTracker()
        self._mix_at_fit: FitPoint | None = None
        self._mix_refit: Refit | None = None
        self._replicas = list(replicas)
        self._deployments = [_deployment(r.config, self.catalog) for r in self._replicas]
        self._refits: dict[int, Refit] = {}
        """Model runs for replicas whose card or KV size turned out other than the model's."""
        self._kv_seen: list[int | None] = [None] * len(self._replicas)
        """The KV figure ``_follow_kv`` last looked at, per replica: it acts on a change only."""
        self._names_seen: list[str | None] = [None] * len(self._replicas)
        """The NVML name ``_follow_card`` last looked at, per replica: it acts on a change only."""
        self._new_card: set[int] = set()
        """Replicas found on another card, whose estimate takes the new card's prior at once
        (not through the filter) when its model run is in."""
        cost = self.mix.mean_cost(prompt_factor)
        self.per_replica = [ReplicaCapacity(_default_prior(d, cost)) for d in self._deployments]
        self._fleet_cost = cost
        """Mean request cost of the mix the fleet's priors were last run on."""
        self._rps_cost = cost
        """``_fleet_cost`` through the estimates' low-pass filter: what ``rps`` divides by."""
        self._smoothed: list[float | None] = [None] * len(self._replicas)
        self._smoothed_source: list[Source | None] = [None] * len(self._replicas)
        self._smoothed_line = [False] * len(self._replicas)
        """Whether each filtered figure already follows its replica's load curve."""
        self._last_refresh: float | None = None
        self.unit_rate = DEFAULT_RATE_PER_WEIGHT
        """Cost units per second per unit of static weight, over the fleet's learned rates."""
        self._known_unit = self._unit_from_known()
        """``_unit_from_known`` as of the last refresh: an O(n) sum, read once per replica."""
        self.calibration = 1.0
        """Median of measured over modelled rate across the replicas measured well enough:
        how far this fleet runs from the performance model. It scales every prior, so a card
        too little used to measure starts from what its measured peers say of the model."""

    # ---- accounting (called by the core on every change of a replica's load) -------------

    def advance(self, r: Replica, now: float) -> None:
        self.per_replica[r.index].advance(r.in_flight, now)

    def share_mark(self, r: Replica) -> float:
        """The mark to stamp on a request starting on ``r`` (after ``advance``)."""
        return self.per_replica[r.index].share_mark()

    def counts_streams(self, r: Replica) -> bool:
        """Whether ``r``'s streams running now count in its measurement (``refresh``)."""
        return self.per_replica[r.index].counts_streams()

    def completed(
        self,
        r: Replica,
        lengths: tuple[int, int],
        cost: float,
        mark: float,
        started: float,
        now: float,
    ) -> None:
        """A request that started at ``started`` (the share integral at ``mark``) completed
        on ``r`` with these (prompt, output) lengths."""
        plain = estimate_cost(lengths[0], lengths[1], self.prompt_factor)
        self.per_replica[r.index].completed(lengths, cost, mark, started, now, plain)
        self.mix.add(lengths[0], lengths[1], cost)

    # ---- estimates ---------------------------------------------------------------------

    def due(self, now: float) -> bool:
        return self._last_refresh is None or now - self._last_refresh >= REFRESH_S

    def refresh(
        self, now: float, running: Mapping[int, Sequence[Progress]] | None = None
    ) -> list[Replica]:
        """Recompute every replica's speed and KV limit; the replicas whose figures moved.
        ``running``: each replica's requests still streaming, by index."""
        last, self._last_refresh = self._last_refresh, now
        k = 1.0 if last is None else 1.0 - math.exp(-max(now - last, 0.0) / SMOOTH_S)
        first_fit = self._mix_at_fit is None
        for r in self._replicas:
            self._follow_card(r)
            self._follow_kv(r)
        self._refit_if_mix_moved()
        self._take_refits()
        self._unfilter_new_cards()
        # A new sample of a heavy-tailed mix can put its mean request 7% off the last one's:
        # the rates follow it through the filter, so the unit they are read in does too.
        if first_fit:
            self._rps_cost = self._fleet_cost
        else:
            self._rps_cost += k * (self._fleet_cost - self._rps_cost)
        for acc, d in zip(self.per_replica, self._deployments, strict=True):
            acc.refit_own(d, self.fitter, self.prompt_factor, self._mix_at_fit)
        self._known_unit = self._unit_from_known()
        self.calibration = self._calibrate(now)
        for r in self._replicas:
            acc = self.per_replica[r.index]
            acc.advance(r.in_flight, now)
            acc.progress(() if running is None else running.get(r.index, ()), now)
        rates = [self._smooth(i, self._rate(i, now), k) for i in range(len(self._replicas))]
        self.unit_rate = _unit_rate(self._replicas, rates)
        changed = []
        for r, (rate, _) in zip(self._replicas, rates, strict=True):
            speed = r.weight * self.unit_rate if r.weight_pinned else rate
            kv, source, _ = self._kv(r)
            limit = kv if source in (Source.ENGINE, Source.FLEET_FILE) else None
            moved = abs(speed - r.speed) > CHANGE * r.speed
            if moved or kv != r.kv_tokens or limit != r.kv_limit:
                r.speed, r.kv_tokens, r.kv_limit = speed, kv, limit
                changed.append(r)
        return changed

    def estimate(self, r: Replica, now: float) -> CapacityEstimate:
        acc = self.per_replica[r.index]
        raw, source = self._rate(r.index, now)
        smoothed = self._smoothed[r.index]
        rate = raw if smoothed is None else smoothed
        if r.weight_pinned:
            rate, source = r.weight * self.unit_rate, Source.OPERATOR
        kv, kv_source, kv_age = self._kv(r, now)
        last = acc.measured_at()
        measured = self._measured(r.index)
        return CapacityEstimate(
            rate=rate,
            rps=self.rps(rate),
            rate_source=source,
            rate_age_s=None if last is None else max(now - last, 0.0),
            prior_rate=self._prior_rate(r.index),
            measured_rate=measured,
            measured_concurrency=None
            if measured is None
            else acc.measured_concurrency(r.batch_size, r.in_flight),
            completions=acc.recent_completions(now),
            kv_tokens=kv,
            kv_source=kv_source,
            kv_age_s=kv_age,
        )

    def modelled_gpu(self, r: Replica) -> str | None:
        """The GPU profile ``r``'s prior is modelled on: the fleet file's card, or the one
        NVML names when that differs; None when the model does not know the replica."""
        d = self._deployments[r.index]
        return None if d is None else d.gpu.name

    def rps(self, rate: float) -> float:
        """A rate in cost units per second, in requests per second at the mean request of the
        mix the rates are at (the one the fleet's priors were last run on, followed through
        the estimates' filter)."""
        return rate / self._rps_cost

    # ---- internals -----------------------------------------------------------------------

    def _rate(self, i: int, now: float) -> tuple[float, Source]:
        acc = self.per_replica[i]
        prior = self._prior_rate(i)
        measured = self._measured(i)
        if measured is None:
            return prior, Source.PRIOR
        evidence = acc.evidence(now)
        held = _prior_evidence(acc.prior)
        w = evidence / (evidence + held * _agreement(measured, prior, evidence / held))
        source = Source.MEASURED if w >= 0.5 else Source.PRIOR
        return w * measured + (1.0 - w) * prior, source

    def _smooth(self, i: int, target: tuple[float, Source], k: float) -> tuple[float, Source]:
        """Follow the estimate through a low-pass filter (``k``: the share of the gap closed
        since the last refresh): a new model run or a burst of long requests moves the raw
        figure in a step, and every strategy would re-rank on it."""
        rate, source = target
        last = self._smoothed[i]
        # A card the model does not know has no figure of its own before it is measured,
        # only a stand-in from its weight: its first measurement replaces it at once, where
        # filtering from the stand-in (the fleet's average, or arbitrary units before any
        # card was measured) held it far off for a minute or more.
        first = (
            source is Source.MEASURED
            and self._smoothed_source[i] is Source.PRIOR
            and self.per_replica[i].prior.rate is None
        )
        # Its load curve's first reading, the rate at its batch size, replaces the plain
        # throughput at the concurrency it ran for the same reason: another figure, not a
        # step of the same one. Filtered from the plain figure, real vLLM engines' learned
        # rates at 60 s lagged their lines by up to 11% (docs/benchmarks.md).
        lined = self.per_replica[i].reads_line(self._replicas[i].batch_size)
        first = first or (lined and not self._smoothed_line[i])
        self._smoothed_line[i] = lined
        if last is not None and not first:
            rate = last + k * (rate - last)
        self._smoothed[i] = rate
        self._smoothed_source[i] = source
        return rate, source

    def _measured(self, i: int) -> float | None:
        """Replica ``i``'s measured rate at the fleet's mix (cost units per second)."""
        acc = self.per_replica[i]
        measured = acc.measured(self._replicas[i].batch_size)
        if measured is None or (self._deployments[i] is not None and not acc.fitted()):
            return None
        return acc.at_fleet_mix(measured)

    def _prior_rate(self, i: int) -> float:
        return self.calibration * self._model_rate(i)

    def _model_rate(self, i: int) -> float:
        """What the performance model alone says (the static weight stands in where the model
        does not know the card)."""
        rate = self.per_replica[i].prior.rate
        if rate is not None:
            return rate
        return self._replicas[i].config.weight * self._known_unit

    def _calibrate(self, now: float) -> float:
        ratios = sorted(
            measured / self._model_rate(i)
            for i, acc in enumerate(self.per_replica)
            if acc.evidence(now) >= _prior_evidence(acc.prior)
            and (measured := self._measured(i)) is not None
            and self._model_rate(i) > 0
        )
        if not ratios:
            return 1.0
        mid = len(ratios) // 2
        return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2

    def _unit_from_known(self) -> float:
        """Rate per unit of weight over the replicas the performance model knows."""
        known = [
            (rate, r.config.weight)
            for acc, r in zip(self.per_replica, self._replicas, strict=True)
            if (rate := acc.prior.rate) is not None
        ]
        if not known:
            return DEFAULT_RATE_PER_WEIGHT
        return sum(rate for rate, _ in known) / sum(w for _, w in known)

    def _kv(self, r: Replica, now: float | None = None) -> KvFigure:
        e = r.engine
        if e is not None and e.kv_capacity_tokens is not None:
            age = None if now is None else now - e.received_at
            return e.kv_capacity_tokens, Source.ENGINE, age
        if r.config.kv_capacity_tokens is not None:
            return r.config.kv_capacity_tokens, Source.FLEET_FILE, None
        prior = self.per_replica[r.index].prior.kv_tokens
        return prior, (None if prior is None else Source.PRIOR), None

    def _follow_kv(self, r: Replica) -> None:
        """Run the model again with the KV size the engine reports, when it is not the one the
        model ran with (the engine knows its memory after activations and graphs; the model
        only estimates it, and the fleet file may say less than either)."""
        d = self._deployments[r.index]
        kv, source, _ = self._kv(r)
        if d is None or kv is None or source not in (Source.ENGINE, Source.FLEET_FILE):
            return
        if kv == self._kv_seen[r.index]:
            return  # an engine repeats its figure at every poll
        self._kv_seen[r.index] = kv
        if abs(kv - d.kv_capacity_tokens) <= KV_MOVE * d.kv_capacity_tokens:
            return
        try:
            moved = replace(d, kv_limit=kv)
        except (GpuRouterError, ValueError):
            return  # not a cache this model can run with: the last prior stands
        if moved.kv_capacity_tokens == d.kv_capacity_tokens:
            return  # more than the card's memory allows, which the model already runs with
        self._redeploy(r.index, moved)

    def _follow_card(self, r: Replica) -> None:
        """Run the model on the card the node agent names, when NVML names another than the
        fleet file declares (a file copied from another node, a card swapped in a repair):
        what the card measurably is wins over what was written about it. A name the
        profiles do not know leaves the fleet file's card in place."""
        name = None if r.telemetry is None else r.telemetry.gpu_name
        if name is None or name == self._names_seen[r.index]:
            return
        self._names_seen[r.index] = name
        declared = self._gpu_profile(r.config.gpu_model)
        reported = self._gpu_profile(name)
        card = declared if reported is None else reported
        mismatch = None
        if reported is not None and reported != declared:
            mismatch = f"NVML reports {name}, fleet file says {r.config.gpu_model}"
        if mismatch is not None and mismatch != r.gpu_mismatch:
            log.warning("replica %s: %s; its capacity is modelled on the %s", r.id, mismatch, name)
        r.gpu_mismatch = mismatch
        d = self._deployments[r.index]
        if card is None or (d is not None and d.gpu == card):
            return
        moved = _deployment(r.config, self.catalog, card)
        if moved is not None:
            self._kv_seen[r.index] = None  # the engine's KV figure applies to the new card
            self._redeploy(r.index, moved)
            self._new_card.add(r.index)

    def _unfilter_new_cards(self) -> None:
        # The filter smooths a model run's step on a new sample of the same card; a card
        # found to be another is no such step, and an H100 taken for an L4 would otherwise
        # take a minute to get its share of the work.
        for i in [i for i in self._new_card if i not in self._refits]:
            self._smoothed[i] = None
            self._new_card.discard(i)

    def _gpu_profile(self, name: str) -> GpuProfile | None:
        try:
            return self.catalog.gpu(name)
        except GpuRouterError:
            return None

    def _redeploy(self, i: int, moved: Deployment) -> None:
        """Replica ``i`` runs as ``moved`` from now: its prior is run again on it."""
        self._deployments[i] = moved
        if not self.mix.recent:  # nothing served yet: the default shape, as at start
            self.per_replica[i].prior = _default_prior(moved, self._fleet_cost)
            return
        self._refits[i] = Refit(self.mix, self.prompt_factor)
        self.per_replica[i].refit_own_again(self.prompt_factor)

    def _take_refits(self) -> None:
        for i, refit in list(self._refits.items()):
            d = self._deployments[i]
            prior = None if d is None else refit.prior(d, self.fitter)
            if prior is not None:
                self.per_replica[i].prior = prior
                del self._refits[i]

    def _refit_if_mix_moved(self) -> None:
        if self._mix_refit is None:
            if not self.mix.refit_due(self._mix_at_fit, MIN_SAMPLE):
                return
            self._mix_refit = Refit(self.mix, self.prompt_factor)
        refit = self._mix_refit
        priors = {d: refit.prior(d, self.fitter) for d in set(self._deployments) if d is not None}
        if any(p is None for p in priors.values()):
            return  # every kind of card moves to the new mix at once, or none does
        self._mix_at_fit, self._mix_refit = refit.point, None
        self._fleet_cost = refit.cost
        for acc, d in zip(self.per_replica, self._deployments, strict=True):
            if d is not None:
                acc.prior = priors[d] or acc.prior


def _effort(lengths: tuple[float, float]) -> float:
    """Engine steps a request takes part in: one per generated token, one per prefill chunk."""
    prompt, output = lengths
    return output + prompt / DEFAULT_MAX_BATCHED_TOKENS


def _agreement(measured: float, prior: float, evidence: float) -> float:
    """How much of its weight the prior keeps against a measurement with this much evidence
    (in units of the prior's own): all of it where the two agree within what the model's
    error and the measurement's noise span, little where they are much further apart. A card
    measured well at a third of its model is throttled or misbuilt, not unlucky, and the
    model's figure says nothing of it: a prior held at full weight kept such an H100 at half
    its twin's rate after 90 s of measuring a third. The measurement's noise shrinks as its
    evidence grows (variance as one over evidence, the prior's at ``evidence`` 1), so a
    card with a few requests behind it is not judged on a wild first reading."""
    if measured <= 0 or prior <= 0 or evidence <= 0:
        return 1.0
    gap = math.log(measured / prior) / (CONFLICT * math.sqrt(1.0 + 1.0 / evidence))
    return 1.0 / (1.0 + gap * gap)


def _prior_evidence(prior: Prior) -> float:
    """Evidence (seconds at saturation) that outweighs this prior: the model's, or a card's
    weight standing in where the model does not know it."""
    return EVIDENCE_S if prior.rate is not None else WEIGHT_PRIOR_EVIDENCE_S


def _moved(mix: WorkloadMix, old: WorkloadMix) -> bool:
    """Whether the mean request shape moved enough to fit the model again."""
    return (
        abs(mix.prompt_tokens - old.prompt_tokens) > MIX_MOVE * max(old.prompt_tokens, 1.0)
        or abs(mix.output_tokens - old.output_tokens) > MIX_MOVE * old.output_tokens
    )


def _unit_rate(replicas: Iterable[Replica], rates: Sequence[tuple[float, Source]]) -> float:
    """Learned rate per unit of static weight over the replicas the operator left to learn."""
    pairs = [(rate, r.config.weight) for r, (rate, _) in zip(replicas, rates, strict=True)]
    unpinned = [p for p, r in zip(pairs, replicas, strict=True) if not r.weight_pinned]
    use = unpinned or pairs
    total_weight = sum(w for _, w in use)
    return sum(rate for rate, _ in use) / total_weight if total_weight > 0 else 1.0


def _deployment(
    config: ReplicaConfig, catalog: ProfileCatalog, gpu: GpuProfile | None = None
) -> Deployment | None:
    """The replica as the performance model runs it: on ``gpu``, else the fleet file's card."""
    try:
        return Deployment(
            gpu=gpu if gpu is not None else catalog.gpu(config.gpu_model),
            model=catalog.model(config.model),
            tensor_parallel=len(config.gpus),
            kv_limit=config.kv_capacity_tokens,
        )
    except (GpuRouterError, ValueError):
        return None  # unknown card or model, or it does not fit: the weight stands in


def _default_prior(deployment: Deployment | None, cost: float) -> Prior:
    """The model at the default shape, before any request has completed."""
    if deployment is None:
        return Prior(None, None, cost)
    p, o = DEFAULT_MIX.prompt_tokens, DEFAULT_MIX.output_tokens
    return Prior(deployment, throughput_curve(deployment, (0.6 * p, p), (0.6 * o, o)), cost)


def _catalog(fleet: FleetConfig) -> ProfileCatalog:
    return load_catalog(fleet.profiles) if fleet.profiles else default_catalog()


__all__ = [
    "CapacityEstimate",
    "FleetCapacity",
    "MixTracker",
    "Prior",
    "Progress",
    "ReplicaCapacity",
    "Source",
    "stream_cost",
]
