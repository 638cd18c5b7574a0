"""The performance model's prior for one replica: its throughput at each concurrency.

The router's learned capacity (router/capacity.py) needs, per replica, two things from the
model: the rate at saturation (the prior) and the *shape* of throughput against the number of
requests running (``efficiency(c)``: throughput at ``c`` over throughput at saturation), which
turns a rate measured at whatever concurrency the replica ran into its rate at saturation.

Both come from the same discrete engine model the simulator and the emulator step (continuous
batching, chunked prefill, a KV cache that admits a request only when its context fits), run
closed-loop at a grid of concurrencies on the lengths of requests the router has seen (a
sample of them, drawn from as they are: a strategy that sorts by size sends a card a cut of
the lengths that no fitted distribution describes). The closed-form saturation formula
(router/perf/model.py) overstates what a batching engine does between one request and a full
batch by up to 25% on a mixed length workload, and its KV-limited batch ignores that long
requests hold more cache for longer; the stepped engine has neither error. A run takes
0.1-0.25 s of CPU on this project's 2-core machine; results are cached per card, model and
sample, so a fleet of identical cards costs one run. ``ProcessFitter`` runs them off the
event loop for the live router; before any request has completed, a lognormal of a default
shape stands in (``throughput_curve``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from router.errors import GpuRouterError
from router.perf.model import DEFAULT_MAX_NUM_SEQS, Deployment, WorkloadMix, saturation
from router.sim.capacity import capacity_at
from router.sim.engine import Engine
from router.sim.replica_model import step_cost
from router.sim.workload import LengthMix, LognormalMix, TraceMix, TraceRow

STEPPED = (8, 16, 32, 64, 128, DEFAULT_MAX_NUM_SEQS)
"""Concurrencies run through the stepped engine. Between them, and below the first, the curve
follows :func:`request_time`: a few requests alone run for long in the model's time (400 of them
one at a time cost 0.26 s of CPU, more than the whole grid), and the line read from 8 and 16
is within about 3% of long runs at 1 to 7."""
BUCKET = 1.02
"""Means within this factor share a fit."""
WARMUP, MEASURE = 40, 1200
"""Requests per closed-loop run: discarded, then counted. Every level draws the same lengths
in the same order but counts a different stretch of them, and the curve is scaled to the best
level's precise rate: with 400 the stretches' differences bent its shape by 2-4% from one
level to the next (read from long runs), with 1,200 by 1-2%. A fit then takes 0.12-0.20 s of
CPU (0.10-0.19 s with 400 and a level at 4)."""
PRECISE_MEASURE = 8000
"""Requests counted when the best level is run again for the saturation rate itself. On a
card whose KV cache holds a few dozen requests, the short runs read the plateau 5-9% high on
the conv trace's heavy-tailed lengths whatever the sample (2,048 lengths, five draws: L4
1.05-1.09, A10 1.05-1.08 of the simulator's own 40,000-completion figure), and learned
capacity carried that into every such card's prior and into the calibration of the rest;
8,000 put every card within 0.98-1.02 for 0.04-0.1 s more per run."""


Curve = tuple[float, tuple[float, ...]]
"""Requests per second at saturation, and ``efficiency[c]`` for c = 0..256."""


def throughput_curve(
    deployment: Deployment, prompt: tuple[float, float], output: tuple[float, float]
) -> Curve | None:
    """The curve for lognormal lengths with these (median, mean) pairs (what the router
    assumes before it has seen requests); None when the engine cannot run the mix."""
    return _lognormal_curve(deployment, _bucket(prompt), _bucket(output))


def sample_curve(deployment: Deployment, lengths: tuple[tuple[int, int], ...]) -> Curve | None:
    """The curve for requests drawn from these (prompt, output) lengths: the requests the
    router saw, with their real spread and the tie between a prompt and its answer, which a
    fitted distribution loses (a strategy that sorts by size sends a card a cut of the
    lengths, nothing like a lognormal)."""
    return _sample_curve(deployment, tuple(sorted(lengths)))


class Pending:
    """A model run under way: its curve is not there yet."""


PENDING = Pending()


class Fitter(Protocol):
    """Runs the performance model on a sample of lengths."""

    def curve(
        self, deployment: Deployment, lengths: tuple[tuple[int, int], ...]
    ) -> Curve | Pending | None:
        """The curve for these lengths, None where the model cannot run them, or
        ``PENDING`` while the run is under way (ask again later with the same lengths)."""
        ...


class InlineFitter:
    """Runs the model at once: the simulator and tests, where time is virtual and each run
    must happen at the same point of every replay."""

    def curve(
        self, deployment: Deployment, lengths: tuple[tuple[int, int], ...]
    ) -> Curve | Pending | None:
        return sample_curve(deployment, lengths)


KEPT_RUNS = 64
"""Finished model runs a ``ProcessFitter`` keeps answering: a fleet's kinds of card, each at
the fleet's sample and at a few replicas' own."""


class ProcessFitter:
    """Runs the model in a worker process: a run takes a tenth of a second or more of CPU,
    which on the event loop would hold every request the router is proxying for as long.
    A thread was tried first: it shares the interpreter's lock with the loop, which then
    stalled 0.2-0.5 s while relaying streams during a run. The worker starts on the first
    run (spawned, about a second) and keeps its own cache of runs; a worker that dies is
    replaced and the run asked again.

    A finished run answers every later ask of it (the last ``KEPT_RUNS``), as the inline
    fitter does: it was handed out once and forgotten, so the fleet's refit, which takes
    its cards' runs only when all are in, threw away each run it found done while another
    was pending, and a replica's refit of the same lengths took it from under it. Live,
    the fleet's refit could then miss a whole run (rates read in requests of the default
    mix: 1.3-1.7 times the truth on the emulator)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._runs: dict[tuple[Deployment, tuple[tuple[int, int], ...]], Future[Curve | None]] = {}

    def curve(
        self, deployment: Deployment, lengths: tuple[tuple[int, int], ...]
    ) -> Curve | Pending | None:
        key = (deployment, lengths)
        run = self._runs.get(key)
        if run is None:
            self._forget_old()
            self._runs[key] = self._executor().submit(sample_curve, deployment, lengths)
            return PENDING
        if not run.done():
            return PENDING
        try:
            return run.result()
        except BrokenProcessPool:
            del self._runs[key]
            self._pool = None  # the worker died: a new one takes the run when asked again
            return PENDING

    def _forget_old(self) -> None:
        """Room for one more run: the oldest finished ones go (a pending one stays)."""
        done = [key for key, run in self._runs.items() if run.done()]
        for key in done[: max(0, len(self._runs) - KEPT_RUNS + 1)]:
            del self._runs[key]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._runs.clear()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            # The pool's first lock starts multiprocessing's resource tracker, which is
            # handed sys.stderr's descriptor. Under the console (a Textual app) sys.stderr is
            # a capture whose fileno() is -1, and the tracker, hence the pool, failed to
            # start on every refresh. The process's own stderr is what the tracker needs.
            with contextlib.redirect_stderr(sys.__stderr__):
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context)
        return self._pool


def _bucket(median_mean: tuple[float, float]) -> tuple[int, int]:
    median, mean = median_mean
    return (round(math.log(max(median, 1.0), BUCKET)), round(math.log(max(mean, 1.0), BUCKET)))


def _unbucket(b: tuple[int, int]) -> tuple[float, float]:
    median, mean = BUCKET ** b[0], BUCKET ** b[1]
    return median, max(median, mean)


@functools.lru_cache(maxsize=64)
def _lognormal_curve(
    deployment: Deployment, prompt: tuple[int, int], output: tuple[int, int]
) -> Curve | None:
    p, o = _unbucket(prompt), _unbucket(output)
    return _fit(deployment, LognormalMix(p, o), WorkloadMix(p[1], o[1]))


@functools.lru_cache(maxsize=256)
def _sample_curve(deployment: Deployment, lengths: tuple[tuple[int, int], ...]) -> Curve | None:
    if not lengths:
        return None
    mix = TraceMix([TraceRow(0.0, p, o) for p, o in lengths])
    return _fit(deployment, mix, WorkloadMix(mix.mean_prompt, mix.mean_output))


def _fit(deployment: Deployment, mix: LengthMix, closed: WorkloadMix) -> Curve | None:
    def make() -> Engine:
        return Engine(step_cost(deployment), kv_capacity_tokens=deployment.kv_capacity_tokens)

    try:
        rates = {c: _closed_loop(make, mix, c) for c in STEPPED}
        formula = {c: saturation(deployment, closed, c).rps for c in range(1, STEPPED[0] + 1)}
    except (ValueError, GpuRouterError):
        return None  # the mix does not fit this card's cache: no prior from the model
    best = max(rates, key=lambda c: rates[c])
    top = _precise(make, mix, best)
    # The short runs share their lengths' draws, so their errors are much alike from one
    # level to the next (``MEASURE``): scaled to the precise figure, they keep the shape.
    scale = top / rates[best]
    rates = {c: rate * scale for c, rate in rates.items()}
    efficiency = [0.0] * (DEFAULT_MAX_NUM_SEQS + 1)
    first, second = STEPPED[0], STEPPED[1]
    for c in range(1, first):
        time = request_time(rates, first, second, c)
        # Where the line is no guide this far down, the closed form's ratios are.
        rate = c / time if time > 0 else rates[first] * formula[c] / formula[first]
        efficiency[c] = min(1.0, rate / top)
    for lo, hi in itertools.pairwise(STEPPED):
        for c in range(lo, hi + 1):
            efficiency[c] = min(1.0, c / request_time(rates, lo, hi, c) / top)
    # Past its best level an engine only queues: throughput is what it was at the best.
    for c in range(best, DEFAULT_MAX_NUM_SEQS + 1):
        efficiency[c] = 1.0
    return top, tuple(efficiency)


def request_time(rates: dict[int, float], lo: int, hi: int, c: int) -> float:
    """The time a request takes at ``c`` at once (``c / throughput``, Little's law), on the
    line through the levels ``lo`` and ``hi``: a batching engine's step grows with the batch,
    about linearly. On the stepped engine the throughput so read at 1, 2, 3, 6 and 12 at once
    is within 1-3% of long runs, where a line through the rates read up to 4% low between
    levels and the closed form's ratios 5-11% low below the grid, and a card run at a few
    requests at once, carried to saturation by the curve, read that much high. Below ``lo``
    the line can reach zero: no reading there."""
    t_lo, t_hi = lo / rates[lo], hi / rates[hi]
    return t_lo + (t_hi - t_lo) * (c - lo) / (hi - lo)


def _closed_loop(make: Callable[[], Engine], mix: LengthMix, concurrency: int) -> float:
    # A closed loop counts its short requests first: until several batches' worth have
    # finished, the ones still running are the long ones, and the rate reads high.
    warmup = max(WARMUP, 2 * concurrency)
    measure = max(MEASURE, 4 * concurrency)
    return capacity_at(make, mix, concurrency, warmup=warmup, measure=measure)


def _precise(make: Callable[[], Engine], mix: LengthMix, concurrency: int) -> float:
    """The saturation rate: the best level run again on ``PRECISE_MEASURE`` requests."""
    warmup = max(WARMUP, 2 * concurrency)
    return capacity_at(make, mix, concurrency, warmup=warmup, measure=PRECISE_MEASURE)
