"""The performance model's prior for one replica: its throughput at each concurrency.

The router's learned capacity (router/capacity.py) needs, per replica, two things from the
model: the rate at saturation (the prior) and the *shape* of throughput against the number of
requests running (``efficiency(c)``: throughput at ``c`` over throughput at saturation), which
turns a rate measured at whatever concurrency the replica ran into its rate at saturation.

Both come from the same discrete engine model the simulator and the emulator step (continuous
batching, chunked prefill, a KV cache that admits a request only when its context fits), run
closed-loop at a grid of concurrencies on lognormal lengths fitted to the requests the router
has seen. The closed-form saturation formula (router/perf/model.py) overstates what a
batching engine does between one request and a full batch by up to 25% on a mixed length
workload, and its KV-limited batch ignores that long requests hold more cache for longer;
the stepped engine has neither error. Results are cached per card, model and mix (means
bucketed 25% apart), so a fleet of identical cards costs one fit (0.17-0.23 s per card kind
on this project's 2-core machine).
"""

from __future__ import annotations

import functools
import itertools
import math

from router.errors import GpuRouterError
from router.perf.model import DEFAULT_MAX_NUM_SEQS, Deployment, WorkloadMix, saturation
from router.sim.capacity import capacity_at
from router.sim.engine import Engine
from router.sim.replica_model import step_cost
from router.sim.workload import LognormalMix

STEPPED = (4, 8, 16, 32, 64, 128, DEFAULT_MAX_NUM_SEQS)
"""Concurrencies run through the stepped engine; below 4 the closed form's ratios to 4 are
used (one request alone runs for long in the model's time and cheaply in the formula)."""
BUCKET = 1.25
"""Means within this factor share a fit."""
WARMUP, MEASURE = 40, 400
"""Requests per closed-loop run: discarded, then counted."""


def throughput_curve(
    deployment: Deployment, prompt: tuple[float, float], output: tuple[float, float]
) -> tuple[float, tuple[float, ...]] | None:
    """Requests per second at saturation and ``efficiency[c]`` for c = 0..256, for lengths
    with these (median, mean) pairs; None when the engine cannot run the mix."""
    key = (_bucket(prompt), _bucket(output))
    return _curve(deployment, *key)


def _bucket(median_mean: tuple[float, float]) -> tuple[int, int]:
    median, mean = median_mean
    return (round(math.log(max(median, 1.0), BUCKET)), round(math.log(max(mean, 1.0), BUCKET)))


def _unbucket(b: tuple[int, int]) -> tuple[float, float]:
    median, mean = BUCKET ** b[0], BUCKET ** b[1]
    return median, max(median, mean)


@functools.lru_cache(maxsize=256)
def _curve(
    deployment: Deployment, prompt: tuple[int, int], output: tuple[int, int]
) -> tuple[float, tuple[float, ...]] | None:
    p, o = _unbucket(prompt), _unbucket(output)
    mix = LognormalMix(p, o)

    def make() -> Engine:
        return Engine(step_cost(deployment), kv_capacity_tokens=deployment.kv_capacity_tokens)

    try:
        rates = {c: capacity_at(make, mix, c, warmup=WARMUP, measure=MEASURE) for c in STEPPED}
        closed = WorkloadMix(p[1], o[1])
        formula = {c: saturation(deployment, closed, c).rps for c in (1, 2, 3, STEPPED[0])}
    except (ValueError, GpuRouterError):
        return None  # the mix does not fit this card's cache: no prior from the model
    for c in (1, 2, 3):
        rates[c] = rates[STEPPED[0]] * formula[c] / formula[STEPPED[0]]
    top = max(rates.values())
    grid = sorted(rates)
    efficiency = [0.0] * (DEFAULT_MAX_NUM_SEQS + 1)
    for lo, hi in itertools.pairwise(grid):
        for c in range(lo, hi + 1):
            share = (rates[lo] + (rates[hi] - rates[lo]) * (c - lo) / (hi - lo)) / top
            efficiency[c] = min(1.0, share)
    # Past its best level an engine only queues: throughput is what it was at the best.
    best = max(rates, key=lambda c: rates[c])
    for c in range(best, DEFAULT_MAX_NUM_SEQS + 1):
        efficiency[c] = 1.0
    return top, tuple(efficiency)
