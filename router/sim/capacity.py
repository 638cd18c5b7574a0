"""A replica's physical limit on a workload, measured by the simulator alone.

The replica's engine is kept full (a closed loop: a finished request is replaced at once by a
new one drawn from the workload's length mix) and its completions are counted after a warm-up.
The sum over a fleet is the fleet's ``capacity_rps``: what no routing policy can beat.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from router.sim.engine import Engine, Sequence
from router.sim.workload import LengthMix


def measure_capacity(make_engine: Callable[[], Engine], mix: LengthMix, *, seed: int = 0) -> float:
    """Requests per second one engine completes at its best concurrency.

    A memory-poor card run at its full ``max_num_seqs`` spends its time preempting and
    recomputing; a router keeps it below that with the batch size. So the limit is the best
    of the engine kept full and kept at what its KV cache holds of the mean request.
    """
    probe = make_engine()
    mean = mix.mean_prompt + mix.mean_output
    levels = {probe.max_num_seqs, max(1, int(probe.kv_capacity / mean))}
    levels |= {max(1, int(n * f)) for n in list(levels) for f in (0.75, 1.25)}
    return max(
        _closed_loop(make_engine, mix, min(n, probe.max_num_seqs), seed=seed) for n in levels
    )


def _closed_loop(
    make_engine: Callable[[], Engine],
    mix: LengthMix,
    concurrency: int,
    *,
    seed: int,
    warmup: int = 200,
    measure: int = 1500,
) -> float:
    """Requests per second with exactly ``concurrency`` requests in the engine."""
    engine = make_engine()
    rng = random.Random(seed)
    n = 0

    def feed() -> None:
        nonlocal n
        p, o = mix.sample(rng)
        # A request bigger than the replica's whole KV cache would be refused upstream.
        p = min(p, engine.kv_capacity - o - 1) if p + o > engine.kv_capacity else p
        engine.add(Sequence(f"c{n}", max(1, p), o))
        n += 1

    for _ in range(concurrency):
        feed()
    t = 0.0
    done = 0
    started_at = 0.0
    while done < warmup + measure:
        t += engine.start_step()
        out = engine.finish_step()
        for _ in out.finished:
            done += 1
            if done == warmup:
                started_at = t
            feed()
    return measure / (t - started_at)
