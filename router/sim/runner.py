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
from router.perf.profiles import ProfileCatalog, default_catalog
from router.sim.capacity import measure_capacity
from router.sim.replica_model import engine_for
from router.sim.simulator import SimResult, Simulation
from router.sim.workload import (
    Arrival,
    LengthMix,
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

    @property
    def mix(self) -> LengthMix:
        return TraceMix(self.trace)

    def generate(self, rate: float, duration: float, seed: int) -> Iterator[Arrival]:
        if self.arrivals == "trace":
            return replay(self.trace, rate, duration)
        shape = self.burstiness if self.arrivals == "gamma" else 1.0
        return gamma(rate, shape, duration, self.mix, random.Random(seed))


def trace_rows(name_or_path: str) -> list[TraceRow]:
    """``code`` or ``conv`` (the bundled Azure traces) or a path to a CSV."""
    if name_or_path in ("code", "conv"):
        return bundled_trace(name_or_path)
    return load_trace(name_or_path)


def fleet_capacity(
    fleet: FleetConfig, mix: LengthMix, catalog: ProfileCatalog | None = None, seed: int = 0
) -> dict[str, float]:
    """Each replica's saturation throughput on this mix (measured once per kind of replica)."""
    catalog = catalog or default_catalog()
    cache: dict[tuple[Any, ...], float] = {}
    out: dict[str, float] = {}
    for r in fleet.replicas:
        key = _kind(r)
        if key not in cache:
            cache[key] = measure_capacity(partial(engine_for, r, catalog), mix, seed=seed)
        out[r.id] = cache[key]
    return out


def _kind(r: ReplicaConfig) -> tuple[Any, ...]:
    return (r.gpu_model, r.model, len(r.gpus), r.kv_capacity_tokens)


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
    sim = Simulation(fleet, strategy, seed=seed, catalog=catalog, capacities=capacities)
    return sim.run(workload.generate(rate, duration, seed), duration)


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
) -> tuple[float, SimResult | None]:
    """The highest rate whose p99 TTFT stays under the SLO, by bisection on the load.

    Searches loads between 0 and 1.2 times capacity; returns the rate and the run at it.
    """
    lo, hi = 0.0, 1.2
    best: SimResult | None = None
    for _ in range(steps):
        mid = (lo + hi) / 2
        result = run_strategy(
            fleet, strategy, workload, mid * capacity_rps, duration, seed, capacities, catalog
        )
        ok = result.ttft_p99_s is not None and result.ttft_p99_s <= slo_ttft_p99_s
        if ok:
            lo, best = mid, result
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
