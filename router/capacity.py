"""Learned capacity: what each replica measurably does, with where the figure came from.

Every load-aware strategy, the tuners, the imbalance factor and the console read one estimate
per replica: its *service rate* (units of request cost it completes per second when it has all
the work it can run at once) and its *KV capacity* (tokens its cache holds).

Service rate. The prior comes from the performance model for the replica's GPU and served
model at the workload's mix as the router sees it (router/capacity_prior.py: the stepped
engine model, run closed-loop at a grid of concurrencies).
It is refined from the router's own accounting: an engine that runs ``c`` requests at once
completes ``rate * efficiency(c)`` per second, where ``efficiency(c)`` is the performance
model's throughput at ``c`` over its throughput at saturation (a continuously batching engine
does little more than one request's work per step at ``c = 1``, its full rate once its batch
or its KV cache is full). So the router integrates ``efficiency(in flight)`` over time and
divides the work it saw complete by it: the rate at saturation, measured at whatever
concurrency the replica actually ran, without having to drive it to saturation. Both sums
decay with a time constant (``TAU_S``) so the figure follows a replica that changes while
staying steady under steady load. The measured rate takes over from the prior as completions
accumulate (half-way at ``PRIOR_COMPLETIONS``); a card too little used to measure keeps its
prior. Where the performance model does not know the card or the model, the efficiency is 1
at any concurrency (the rate at the concurrency it ran: a plain measurement) and the prior is
the replica's static weight times the fleet's rate per unit of weight.

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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from router.capacity_prior import throughput_curve
from router.config.schema import FleetConfig, ReplicaConfig
from router.errors import GpuRouterError
from router.perf.model import Deployment, WorkloadMix
from router.perf.profiles import ProfileCatalog, default_catalog, load_catalog
from router.replica import Replica

TAU_S = 60.0
"""Time constant of the measured rate: long enough that a steady load gives a steady figure
(one interval to the next moves it by a few percent), short enough to follow a replica that
slows down within a couple of minutes."""
PRIOR_COMPLETIONS = 20.0
"""Recent completions at which the measured rate and the prior count equally."""
REFRESH_S = 1.0
"""How often estimates are recomputed and pushed to the strategies."""
MIX_MOVE = 0.1
"""Relative change of the mean request shape that recomputes the performance-model priors."""
CHANGE = 0.01
"""Relative change of a replica's speed that is pushed to the strategies' indexes."""
DEFAULT_MIX = WorkloadMix(prompt_tokens=512.0, output_tokens=256.0)
"""The request shape assumed before any request has completed."""
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
    """Seconds since the last completion that refined it (None: never measured)."""
    prior_rate: float
    measured_rate: float | None
    """What the router's accounting alone says (None: nothing completed yet)."""
    completions: float
    """Recent completions behind the measurement (decayed with ``TAU_S``)."""
    kv_tokens: int | None
    kv_source: Source | None
    kv_age_s: float | None
    """Age of the engine reading the KV figure came from (None for the fleet file or prior)."""


class MixTracker:
    """The fleet's request shape, from completed requests: decaying means of the lengths and
    of their logarithms (a lognormal fit: median ``exp(mean log)``, and the mean)."""

    __slots__ = ("cost", "log_output", "log_prompt", "output", "prompt", "weight")

    def __init__(self) -> None:
        self.prompt = DEFAULT_MIX.prompt_tokens
        self.output = DEFAULT_MIX.output_tokens
        # Until requests complete: medians at 60% of the means, a typical chat-trace skew.
        self.log_prompt = math.log(0.6 * self.prompt)
        self.log_output = math.log(0.6 * self.output)
        self.cost = 0.0
        self.weight = 0.0

    def add(self, prompt_tokens: int, output_tokens: int, cost: float) -> None:
        # The first completions move the means quickly, later ones by 1/1000 each.
        self.weight = min(self.weight + 1.0, 1000.0)
        k = 1.0 / self.weight
        p, o = max(1, prompt_tokens), max(1, output_tokens)
        self.prompt += k * (p - self.prompt)
        self.output += k * (o - self.output)
        self.log_prompt += k * (math.log(p) - self.log_prompt)
        self.log_output += k * (math.log(o) - self.log_output)
        self.cost += k * (cost - self.cost) if self.cost else cost

    @property
    def mix(self) -> WorkloadMix:
        return WorkloadMix(max(self.prompt, 0.0), max(self.output, 1.0))

    @property
    def prompt_median_mean(self) -> tuple[float, float]:
        median = math.exp(self.log_prompt)
        return median, max(median, self.prompt)

    @property
    def output_median_mean(self) -> tuple[float, float]:
        median = math.exp(self.log_output)
        return median, max(median, self.output)

    def mean_cost(self, prompt_factor: float) -> float:
        """Mean cost of a request; before any completion, the default mix's."""
        if self.cost > 0:
            return self.cost
        return DEFAULT_MIX.prompt_tokens * prompt_factor + DEFAULT_MIX.output_tokens


class Prior:
    """What the performance model says of one replica at a request mix
    (router/capacity_prior.py): its saturation rate and its efficiency at each concurrency."""

    __slots__ = ("deployment", "efficiency", "kv_tokens", "rps")

    def __init__(self, deployment: Deployment | None, mix: MixTracker) -> None:
        self.deployment = deployment
        self.kv_tokens = None if deployment is None else deployment.kv_capacity_tokens
        self.rps: float | None = None
        self.efficiency: Sequence[float] = (0.0, 1.0)
        if deployment is not None:
            curve = throughput_curve(deployment, mix.prompt_median_mean, mix.output_median_mean)
            if curve is not None:
                self.rps, self.efficiency = curve

    def efficiency_at(self, concurrency: int) -> float:
        eff = self.efficiency
        return eff[concurrency] if concurrency < len(eff) else eff[-1]


class ReplicaCapacity:
    """One replica's accumulators and prior. ``advance`` must be called just before the
    replica's number of requests in flight changes, so each stretch of time is counted at
    the concurrency it ran at."""

    __slots__ = ("_eff_time", "_last_completion", "_stamp", "_work", "completions", "prior")

    def __init__(self, prior: Prior) -> None:
        self.prior = prior
        self._eff_time = 0.0
        self._work = 0.0
        self.completions = 0.0
        self._stamp: float | None = None
        self._last_completion: float | None = None

    def advance(self, in_flight: int, now: float) -> None:
        stamp, self._stamp = self._stamp, now
        if stamp is None or now <= stamp:
            return
        dt = now - stamp
        decay = math.exp(-dt / TAU_S)
        self._work *= decay
        self.completions *= decay
        # Exact integral of a constant efficiency over dt under exponential decay.
        eff = self.prior.efficiency_at(in_flight) if in_flight else 0.0
        self._eff_time = self._eff_time * decay + eff * TAU_S * (1.0 - decay)

    def completed(self, cost: float, now: float) -> None:
        self._work += cost
        self.completions += 1.0
        self._last_completion = now

    def measured(self) -> float | None:
        """Cost units per second at saturation, from accounting alone."""
        if self._eff_time <= 0 or self.completions < 1.0:
            return None
        return self._work / self._eff_time

    def last_completion(self) -> float | None:
        return self._last_completion


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
        self.mix = MixTracker()
        self._mix_at_fit = self.mix.mix
        self._replicas = list(replicas)
        self._deployments = [_deployment(r.config, self.catalog) for r in self._replicas]
        self.per_replica = [ReplicaCapacity(Prior(d, self.mix)) for d in self._deployments]
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

    def completed(
        self, r: Replica, prompt_tokens: int, output_tokens: int, cost: float, now: float
    ) -> None:
        self.per_replica[r.index].completed(cost, now)
        self.mix.add(prompt_tokens, output_tokens, cost)

    # ---- estimates ---------------------------------------------------------------------

    def due(self, now: float) -> bool:
        return self._last_refresh is None or now - self._last_refresh >= REFRESH_S

    def refresh(self, now: float) -> list[Replica]:
        """Recompute every replica's speed and KV limit; the replicas whose figures moved."""
        self._last_refresh = now
        self._refit_if_mix_moved()
        self._known_unit = self._unit_from_known()
        self.calibration = self._calibrate()
        for r in self._replicas:
            self.per_replica[r.index].advance(r.in_flight, now)
        rates = [self._rate(i) for i in range(len(self._replicas))]
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
        rate, source = self._rate(r.index)
        if r.weight_pinned:
            rate, source = r.weight * self.unit_rate, Source.OPERATOR
        kv, kv_source, kv_age = self._kv(r, now)
        last = acc.last_completion()
        mean_cost = self.mix.mean_cost(self.prompt_factor)
        return CapacityEstimate(
            rate=rate,
            rps=rate / mean_cost,
            rate_source=source,
            rate_age_s=None if last is None else now - last,
            prior_rate=self._prior_rate(r.index),
            measured_rate=acc.measured(),
            completions=acc.completions,
            kv_tokens=kv,
            kv_source=kv_source,
            kv_age_s=kv_age,
        )

    def rps(self, rate: float) -> float:
        """A rate in cost units per second, in requests per second at the mean request."""
        return rate / self.mix.mean_cost(self.prompt_factor)

    # ---- internals -----------------------------------------------------------------------

    def _rate(self, i: int) -> tuple[float, Source]:
        acc = self.per_replica[i]
        prior = self._prior_rate(i)
        measured = acc.measured()
        if measured is None:
            return prior, Source.PRIOR
        w = acc.completions / (acc.completions + PRIOR_COMPLETIONS)
        source = Source.MEASURED if w >= 0.5 else Source.PRIOR
        return w * measured + (1.0 - w) * prior, source

    def _prior_rate(self, i: int) -> float:
        return self.calibration * self._model_rate(i)

    def _model_rate(self, i: int) -> float:
        """What the performance model alone says (the static weight stands in where the model
        does not know the card)."""
        rps = self.per_replica[i].prior.rps
        if rps is not None:
            return rps * self.mix.mean_cost(self.prompt_factor)
        return self._replicas[i].config.weight * self._known_unit

    def _calibrate(self) -> float:
        ratios = sorted(
            measured / self._model_rate(i)
            for i, acc in enumerate(self.per_replica)
            if acc.completions >= PRIOR_COMPLETIONS
            and (measured := acc.measured()) is not None
            and self._model_rate(i) > 0
        )
        if not ratios:
            return 1.0
        mid = len(ratios) // 2
        return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2

    def _unit_from_known(self) -> float:
        """Rate per unit of weight over the replicas the performance model knows."""
        known = [
            (acc.prior.rps, r.config.weight)
            for acc, r in zip(self.per_replica, self._replicas, strict=True)
            if acc.prior.rps is not None
        ]
        if not known:
            return DEFAULT_RATE_PER_WEIGHT
        cost = self.mix.mean_cost(self.prompt_factor)
        return sum(rps * cost for rps, _ in known) / sum(w for _, w in known)

    def _kv(self, r: Replica, now: float | None = None) -> KvFigure:
        e = r.engine
        if e is not None and e.kv_capacity_tokens is not None:
            age = None if now is None else now - e.received_at
            return e.kv_capacity_tokens, Source.ENGINE, age
        if r.config.kv_capacity_tokens is not None:
            return r.config.kv_capacity_tokens, Source.FLEET_FILE, None
        prior = self.per_replica[r.index].prior.kv_tokens
        return prior, (None if prior is None else Source.PRIOR), None

    def _refit_if_mix_moved(self) -> None:
        mix, old = self.mix.mix, self._mix_at_fit
        moved = (
            abs(mix.prompt_tokens - old.prompt_tokens) > MIX_MOVE * max(old.prompt_tokens, 1.0)
            or abs(mix.output_tokens - old.output_tokens) > MIX_MOVE * old.output_tokens
        )
        if not moved:
            return
        self._mix_at_fit = mix
        for acc, d in zip(self.per_replica, self._deployments, strict=True):
            if d is not None:
                acc.prior = Prior(d, self.mix)


def _unit_rate(replicas: Iterable[Replica], rates: Sequence[tuple[float, Source]]) -> float:
    """Learned rate per unit of static weight over the replicas the operator left to learn."""
    pairs = [(rate, r.config.weight) for r, (rate, _) in zip(replicas, rates, strict=True)]
    unpinned = [p for p, r in zip(pairs, replicas, strict=True) if not r.weight_pinned]
    use = unpinned or pairs
    total_weight = sum(w for _, w in use)
    return sum(rate for rate, _ in use) / total_weight if total_weight > 0 else 1.0


def _deployment(config: ReplicaConfig, catalog: ProfileCatalog) -> Deployment | None:
    try:
        return Deployment(
            gpu=catalog.gpu(config.gpu_model),
            model=catalog.model(config.model),
            tensor_parallel=len(config.gpus),
        )
    except (GpuRouterError, ValueError):
        return None  # unknown card or model, or it does not fit: the weight stands in


def _catalog(fleet: FleetConfig) -> ProfileCatalog:
    return load_catalog(fleet.profiles) if fleet.profiles else default_catalog()


__all__ = [
    "CapacityEstimate",
    "FleetCapacity",
    "MixTracker",
    "Prior",
    "ReplicaCapacity",
    "Source",
]
