"""A replica's physical limit on a workload, measured by the simulator alone.

The replica's engine is kept full (a closed loop: a finished request is replaced at once by a
new one drawn from the workload's length mix) and its completions are counted after a warm-up.
The sum over a fleet is the fleet's ``capacity_rps``: what no routing policy that sends each
replica the workload's mix can beat. (A policy that sorts requests by size, such as sending the
short prompts to the weak cards, changes each replica's mix and can do a little better.)

Two figures derive from the capacities without running a router:

- ``static_split_share``: the share of capacity a fixed split (round-robin, random, static
  weights) reaches when the strategy alone decides where work goes. It saturates when the
  replica with the least capacity per unit of its share is full.
- ``capacity_at`` a replica's throughput held at a given concurrency (its batch size), so the
  fleet's ceiling under its configured batch sizes can be compared with its physical limit.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from router.sim.engine import Engine, Sequence
from router.sim.workload import LengthMix

GRID = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Concurrency levels tried first (about 1.4x apart), then refined around the best."""
PRECISE = 40_000
"""Completions behind the figure returned for the best level. The search compares levels on
1,500 each (every level draws the same lengths, so the comparison is fair), but 1,500 draws of
a heavy-tailed length mix put the rate itself 2-4% off, by seed: the wide fleet's capacity read
61.2 to 65.0 req/s over seeds 1 to 4, against 62.6 to 63.1 on 15,000. Every benchmark's
"fraction of capacity" divides by this figure."""


def measure_capacity(make_engine: Callable[[], Engine], mix: LengthMix, *, seed: int = 0) -> float:
    """Requests per second one engine completes at its best concurrency.

    Throughput rises with concurrency while the batch amortizes the weight reads, then flattens
    or falls (a compute-bound card gains nothing from more sequences; a memory-poor one starts
    to queue or preempt inside the engine). A router holds a replica at any concurrency up to
    the engine's ``max_num_seqs`` with the batch size, so the limit is the best level: found on
    a grid, plus what the KV cache holds of the mean request, then refined between the best
    level's neighbours. The best level's rate is then measured again on ``PRECISE``
    completions.
    """
    probe = make_engine()
    top = probe.max_num_seqs
    kv_fit = max(1, int(probe.kv_capacity / (mix.mean_prompt + mix.mean_output)))
    levels = sorted({n for n in GRID if n < top} | {top, min(top, kv_fit)})
    seen = {n: capacity_at(make_engine, mix, n, seed=seed) for n in levels}
    best = max(seen, key=lambda n: seen[n])
    i = levels.index(best)
    for other in levels[max(0, i - 1) : i] + levels[i + 1 : i + 2]:
        mid = (best + other) // 2
        if mid not in seen:
            seen[mid] = capacity_at(make_engine, mix, mid, seed=seed)
    best = max(seen, key=lambda n: seen[n])
    return capacity_at(make_engine, mix, best, seed=seed, measure=PRECISE)


def capacity_at(
    make_engine: Callable[[], Engine],
    mix: LengthMix,
    concurrency: int,
    *,
    seed: int = 0,
    warmup: int = 200,
    measure: int = 1500,
) -> float:
    """Requests per second with exactly ``concurrency`` requests in the engine.

    More than ``max_num_seqs`` wait inside the engine, as they would in vLLM's own queue.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    engine = make_engine()
    rng = random.Random(seed)
    n = 0

    # A request bigger than the KV cache admits (vLLM keeps 1% of it free as a watermark)
    # would be refused upstream; it is cut to what fits, prompt first.
    room = engine.kv_capacity - engine.kv_capacity // 100 - 1

    def feed() -> None:
        nonlocal n
        p, o = mix.sample(rng)
        o = min(o, room - 1)
        engine.add(Sequence(f"c{n}", max(1, min(p, room - o)), o))
        n += 1

    for _ in range(concurrency):
        feed()
    t = 0.0
    done = 0
    started_at = 0.0
    while done < warmup + measure:
        t = engine.run_quiet_steps(t)
        step = engine.start_step()
        if step <= 0:
            raise ValueError("the engine stalled with work waiting: nothing can be admitted")
        t += step
        out = engine.finish_step()
        for _ in out.finished:
            done += 1
            if done == warmup:
                started_at = t
            feed()
    return measure / (t - started_at)


def static_split_share(capacities: Mapping[str, float], shares: Mapping[str, float]) -> float:
    """The fraction of total capacity a fixed split of the arrivals sustains.

    Replica ``i`` gets ``shares[i] / sum(shares)`` of the rate ``R`` and saturates when that
    reaches its capacity ``c_i``, so ``R_max = min_i c_i * sum(shares) / shares[i]``; the
    result is ``R_max / sum(c)``. Equal shares give round-robin's limit: ``N * min(c) / sum(c)``.
    """
    total_share = sum(shares.values())
    total_capacity = sum(capacities.values())
    if total_share <= 0 or total_capacity <= 0:
        raise ValueError("shares and capacities must add up to more than 0")
    rate = min(capacities[i] * total_share / s for i, s in shares.items() if s > 0)
    return rate / total_capacity
