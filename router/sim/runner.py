"""Running the simulator the way ``gpurouter sim`` does: workloads, capacity, strategies.

This is the UI-free half of the command: it builds workloads, measures the fleet's capacity
once, runs each strategy on the same arrivals, and searches for the highest sustainable rate.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from router.config.schema import FleetConfig, ReplicaConfig
from router.perf.profiles import ProfileCatalog, default_catalog, load_catalog
from router.sim.capacity import PRECISE, capacity_at, measure_capacity
from router.sim.replica_model import engine_for
from router.sim.routers import Routers
from router.sim.simulator import WARMUP_SHARE, SimResult, Simulation
from router.sim.workload import (
    Arrival,
    CappedMix,
    LengthMix,
    LognormalMix,
    TraceMix,
    TraceRow,
    bundled_trace,
    gamma,
    load_trace,
    replay,
)


@dataclass(frozen=True, slots=True)
class Workload:
    """Where lengths and arrival times come from."""

    trace: list[TraceRow]
    arrivals: str = "poisson"
    """``poisson``, ``gamma`` (with ``burstiness``) or ``trace`` (the trace's own timing)."""
    burstiness: float = 1.0
    lengths: str = "trace"
    """``trace`` (drawn from the trace's rows) or ``lognormal`` (a lognormal fit of them)."""
    max_tokens: int | None = None
    """What every client sends as ``max_tokens``: None (the default) sends each request's own
    output length, as ``vllm bench serve`` does for its datasets; a number is a fixed cap that
    every client sends, while the engine still stops at the trace's length (cut at the cap)."""

    def __post_init__(self) -> None:
        if self.arrivals not in ("poisson", "gamma", "trace"):
            raise ValueError(f"arrivals must be poisson, gamma or trace, not {self.arrivals!r}")
        if self.lengths not in ("trace", "lognormal"):
            raise ValueError(f"lengths must be trace or lognormal, not {self.lengths!r}")
        if self.arrivals == "trace" and self.lengths != "trace":
            raise ValueError("a trace replayed with its own timing brings its own lengths")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def mix(self) -> LengthMix:
        """The lengths the engines generate (outputs cut at ``max_tokens`` when it is set)."""
        mix: LengthMix
        mix = LognormalMix.fit(self.trace) if self.lengths == "lognormal" else TraceMix(self.trace)
        return mix if self.max_tokens is None else CappedMix(mix, self.max_tokens)

    def generate(self, rate: float, duration: float, seed: int) -> Iterator[Arrival]:
        if self.arrivals == "trace":
            return replay(self.trace, rate, duration, self.max_tokens)
        shape = self.burstiness if self.arrivals == "gamma" else 1.0
        return gamma(rate, shape, duration, self.mix, random.Random(seed), self.max_tokens)


def trace_rows(name_or_path: str) -> list[TraceRow]:
    """``code`` or ``conv`` (the bundled Azure traces) or a path to a CSV."""
    if name_or_path in ("code", "conv"):
        return bundled_trace(name_or_path)
    return load_trace(name_or_path)


def catalog_for(fleet: FleetConfig) -> ProfileCatalog:
    """The built-in profiles plus the fleet's own ``profiles`` files."""
    return load_catalog(fleet.profiles) if fleet.profiles else default_catalog()


def fleet_capacity(
    fleet: FleetConfig, mix: LengthMix, catalog: ProfileCatalog | None = None, seed: int = 0
) -> dict[str, float]:
    """Each replica's saturation throughput on this mix (measured once per kind of replica)."""
    catalog = catalog or catalog_for(fleet)
    cache: dict[tuple[Any, ...], float] = {}
    out: dict[str, float] = {}
    for r in fleet.replicas:
        key = _kind(r)
        if key not in cache:
            cache[key] = measure_capacity(partial(engine_for, r, catalog), mix, seed=seed)
        out[r.id] = cache[key]
    return out


def batch_capacity(
    fleet: FleetConfig, mix: LengthMix, catalog: ProfileCatalog | None = None, seed: int = 0
) -> dict[str, float]:
    """Each replica's throughput held at its configured batch size (the router's cap on its
    concurrency): the fleet's ceiling as configured, next to its physical limit."""
    catalog = catalog or catalog_for(fleet)
    cache: dict[tuple[Any, ...], float] = {}
    out: dict[str, float] = {}
    for r in fleet.replicas:
        key = (*_kind(r), r.batch_size)
        if key not in cache:
            make = partial(engine_for, r, catalog)
            level = min(r.batch_size, make().max_num_seqs)
            cache[key] = capacity_at(make, mix, level, seed=seed, measure=PRECISE)
        out[r.id] = cache[key]
    return out


def _kind(r: ReplicaConfig) -> tuple[Any, ...]:
    return (r.gpu_model, r.model, len(r.gpus), r.kv_capacity_tokens)


@dataclass(frozen=True, slots=True)
class Run:
    """One simulated run and the arrivals it was fed."""

    result: SimResult
    arrival_rps: float
    """Arrivals per second in the steady-state window (the same window as ``throughput_rps``)."""

    @property
    def kept_up(self) -> float:
        """Completions over arrivals in the window: about 1 when the fleet keeps up, less when
        a backlog grows (hidden in the engines' batches if TTFT alone is watched)."""
        return self.result.throughput_rps / self.arrival_rps if self.arrival_rps > 0 else 1.0


def run_strategy(
    fleet: FleetConfig,
    strategy: str,
    workload: Workload,
    rate: float,
    duration: float,
    seed: int,
    capacities: dict[str, float],
    catalog: ProfileCatalog | None = None,
) -> SimResult:
    return simulate(fleet, strategy, workload, rate, duration, seed, capacities, catalog).result


def simulate(
    fleet: FleetConfig,
    strategy: str,
    workload: Workload,
    rate: float,
    duration: float,
    seed: int,
    capacities: dict[str, float],
    catalog: ProfileCatalog | None = None,
    routers: Routers | None = None,
) -> Run:
    """Run one strategy on the workload at ``rate`` for ``duration`` simulated seconds
    (behind several routers when ``routers`` says so)."""
    if not (rate > 0 and duration > 0):
        raise ValueError(f"rate and duration must be > 0, got {rate} and {duration}")
    catalog = catalog or catalog_for(fleet)
    # The router gets the fleet file as written: what it knows of each engine beyond that
    # it learns as the live router does (the engines' /metrics, its own accounting).
    sim = Simulation(
        fleet, strategy, seed=seed, catalog=catalog, capacities=capacities, routers=routers
    )
    start = WARMUP_SHARE * duration
    in_window = 0

    def counted() -> Iterator[Arrival]:
        nonlocal in_window
        for a in workload.generate(rate, duration, seed):
            in_window += a.time > start
            yield a

    result = sim.run(counted(), duration)
    return Run(result, in_window / (duration - start))


KEEP_UP = 0.95
"""A rate is sustainable only if the window's completions reach this share of its arrivals."""


def max_sustainable(
    fleet: FleetConfig,
    strategy: str,
    workload: Workload,
    capacity_rps: float,
    capacities: dict[str, float],
    *,
    duration: float,
    seed: int,
    slo_ttft_p99_s: float = 2.0,
    steps: int = 7,
    catalog: ProfileCatalog | None = None,
    routers: Routers | None = None,
    bracket: tuple[float, float] = (0.0, 1.2),
) -> tuple[float, SimResult | None]:
    """The highest rate whose p99 TTFT stays under the SLO, by bisection on the load.

    Searches loads between 0 and 1.2 times capacity (``steps`` halvings: 7 give 1% of
    capacity; a narrower ``bracket`` gives the same resolution in fewer); returns the rate
    and the run at it (the bracket's low end and None when no load in it passed). A rate
    also has to keep up: completions in the steady-state window at least ``KEEP_UP`` of its
    arrivals. Without that, a fleet
    whose batch sizes let a replica take more than it serves hides a growing backlog in its
    engines' batches, where TTFT stays short while every request slows down.
    """
    lo, hi = bracket
    best: SimResult | None = None
    for _ in range(steps):
        mid = (lo + hi) / 2
        rate = mid * capacity_rps
        run = simulate(
            fleet, strategy, workload, rate, duration, seed, capacities, catalog, routers
        )
        ttft = run.result.ttft_p99_s
        if ttft is not None and ttft <= slo_ttft_p99_s and run.kept_up >= KEEP_UP:
            lo, best = mid, run.result
        else:
            hi = mid
    return lo * capacity_rps, best


def result_dict(result: SimResult, offered_rps: float, capacity_rps: float) -> dict[str, Any]:
    """The JSON object ``gpurouter sim --json`` prints for one strategy."""
    return {
        "strategy": result.strategy,
        "offered_rps": round(offered_rps, 4),
        "throughput_rps": round(result.throughput_rps, 4),
        "output_tokens_per_s": round(result.output_tokens_per_s, 2),
        "capacity_rps": round(capacity_rps, 4),
        "capacity_fraction": round(result.throughput_rps / capacity_rps, 4),
        "ttft_p50_s": _round(result.ttft_p50_s),
        "ttft_p99_s": _round(result.ttft_p99_s),
        "e2e_p50_s": _round(result.e2e_p50_s),
        "e2e_p99_s": _round(result.e2e_p99_s),
        "imbalance_factor": round(result.imbalance_factor, 4),
        "utilization_by_gpu_model": {
            k: round(v, 4) for k, v in result.utilization_by_gpu_model().items()
        },
        "lost_requests": result.lost_requests,
        "completed": result.completed,
        "rejected": result.rejected,
        "expired": result.expired,
        "unfinished": result.unfinished,
    }


def _round(x: float | None) -> float | None:
    # Infinity (requests that never got a token) is not JSON; null says "unbounded".
    if x is None or x == float("inf"):
        return None
    return round(x, 4)
