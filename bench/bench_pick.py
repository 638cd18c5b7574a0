"""How long each routing strategy takes to decide, at 8, 64 and 512 replicas.

    python bench/bench_pick.py            # a table
    python bench/bench_pick.py --json     # the same figures as JSON
    python bench/bench_pick.py --saturated  # all replicas full but one in 64

The fleet mixes four classes of card (weights 4, 2, 1, 0.5; the heavier half in the
``strong`` tier), batch size 32, KV capacity 60,000 tokens, a latency sample on every replica,
and a steady load: about 12 requests in flight per replica on average, a few replicas full.
Requests mix prompt sizes 50-3,000 and outputs 50-1,000 tokens; half carry one of 1,000
affinity keys.

What is timed: ``pick`` alone, in batches of 200 back-to-back picks on the current state
(timeit-style, garbage collector off, after warm-up batches, in rounds that interleave the
cases); the figure is the median over 30 batches of the time per pick. Between batches the
load churns: 50 running requests complete and 50 new ones are picked and dispatched, each
with ``pool.changed`` and so the strategy's ``update``. That bookkeeping is timed separately
and reported per request (one dispatch plus one completion, median over batches).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from router.config.schema import ReplicaConfig
from router.pool import ReplicaPool
from router.replica import Replica
from router.request import Request, estimate_cost
from router.strategies import STRATEGIES, Strategy, create_strategy

SIZES = (8, 64, 512)
CARDS = ((4.0, "H100-80GB"), (2.0, "A100-80GB"), (1.0, "V100-32GB"), (0.5, "T4-16GB"))
BATCH_SIZE = 32
KV_CAPACITY = 60_000
PICKS_PER_BATCH = 200
CHURN_PER_BATCH = 50
WARMUP_BATCHES = 3
ROUNDS = 5
BATCHES_PER_ROUND = 6


@dataclass
class Result:
    pick_us: float
    bookkeeping_us: float


def make_pool(n: int, rng: random.Random) -> ReplicaPool:
    configs = []
    for i in range(n):
        weight, gpu = CARDS[i % len(CARDS)]
        configs.append(
            ReplicaConfig(
                id=f"replica-{i}",
                node=f"node-{i // 8}",
                endpoint=f"http://10.0.{i // 250}.{i % 250}:8000",
                model="bench-model",
                gpus=(0,),
                gpu_model=gpu,
                weight=weight,
                batch_size=BATCH_SIZE,
                tier="strong" if weight >= 2 else "standard",
                kv_capacity_tokens=KV_CAPACITY,
            )
        )
    pool = ReplicaPool(configs)
    for r in pool:
        r.latency.observe(rng.uniform(0.01, 0.03) / r.weight, 0.0)
    return pool


class Workload:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seq = 0

    def request(self) -> Request:
        rng = self.rng
        self.seq += 1
        prompt, out = rng.randint(50, 3_000), rng.randint(50, 1_000)
        return Request(
            id=f"q{self.seq}",
            prompt_tokens=prompt,
            max_tokens=out,
            arrival=0.0,
            affinity_key=f"session-{rng.randrange(1_000)}" if rng.random() < 0.5 else None,
            cost=estimate_cost(prompt, out),
        )


def dispatch(pool: ReplicaPool, r: Replica, req: Request) -> None:
    r.running[req.id] = req
    r.own_cost += req.cost
    pool.changed(r)


def complete(pool: ReplicaPool, r: Replica, req: Request) -> None:
    del r.running[req.id]
    r.own_cost -= req.cost
    pool.changed(r)


def load(
    pool: ReplicaPool, work: Workload, rng: random.Random, saturated: bool
) -> list[tuple[Replica, Request]]:
    """Steady load: ~12 in flight per replica, one replica in ten full. Saturated: every
    replica full but one in 64 (at least one), each with one free slot."""
    running = []
    n = len(pool)
    open_ = set(rng.sample(range(n), max(1, n // 64))) if saturated else set()
    for r in pool:
        if saturated:
            target = BATCH_SIZE - (r.index in open_)
        else:
            target = BATCH_SIZE if rng.random() < 0.1 else rng.randint(0, 24)
        for _ in range(target):
            req = work.request()
            dispatch(pool, r, req)
            running.append((r, req))
    return running


def churn(
    s: Strategy,
    work: Workload,
    requests: list[Request],
    running: list[tuple[Replica, Request]],
    now: float,
) -> tuple[float, int]:
    """Complete a running request, then dispatch one picked; returns the seconds spent in
    that bookkeeping and how many dispatch + completion pairs it did."""
    pool, rng = s.pool, work.rng
    spent, pairs = 0.0, 0
    for req in requests:
        j = rng.randrange(len(running))
        running[j], running[-1] = running[-1], running[j]
        done, done_req = running.pop()
        t0 = time.perf_counter()
        complete(pool, done, done_req)
        spent += time.perf_counter() - t0
        r = s.pick(req, now)
        if r is None:
            continue
        t0 = time.perf_counter()
        dispatch(pool, r, req)
        spent += time.perf_counter() - t0
        running.append((r, req))
        pairs += 1
    return spent, pairs


@dataclass
class Case:
    """One strategy on one fleet, kept between rounds so that rounds interleave."""

    strategy: Strategy
    work: Workload
    running: list[tuple[Replica, Request]]
    per_pick: list[float] = field(default_factory=list)
    per_pair: list[float] = field(default_factory=list)
    clock: float = 10.0


def setup(name: str, n: int, saturated: bool) -> Case:
    rng = random.Random(n)
    pool = make_pool(n, rng)
    s = create_strategy(name, rng=random.Random(1))
    s.attach(pool)
    pool.listener = s.update
    work = Workload(rng)
    return Case(s, work, load(pool, work, rng, saturated))


def run_batches(case: Case, batches: int, record: bool = True) -> None:
    pick = case.strategy.pick
    for _ in range(batches):
        case.clock += 1.0
        now = case.clock
        requests = [case.work.request() for _ in range(PICKS_PER_BATCH)]
        t0 = time.perf_counter()
        for req in requests:
            pick(req, now)
        elapsed = time.perf_counter() - t0
        spent, pairs = churn(
            case.strategy, case.work, requests[:CHURN_PER_BATCH], case.running, now
        )
        if record:
            case.per_pick.append(elapsed / PICKS_PER_BATCH)
            if pairs:
                case.per_pair.append(spent / pairs)


def run(saturated: bool = False) -> dict[str, dict[int, Result]]:
    cases = {(name, n): setup(name, n, saturated) for name in STRATEGIES for n in SIZES}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        # Warm-up lets the interpreter specialise the hot code and the CPU clock settle;
        # rounds interleave the cases so that drift on a shared machine hits them alike.
        for case in cases.values():
            run_batches(case, WARMUP_BATCHES, record=False)
        for _ in range(ROUNDS):
            for case in cases.values():
                run_batches(case, BATCHES_PER_ROUND)
    finally:
        if gc_was:
            gc.enable()
    return {
        name: {
            n: Result(
                statistics.median(cases[name, n].per_pick) * 1e6,
                statistics.median(cases[name, n].per_pair or [math.nan]) * 1e6,
            )
            for n in SIZES
        }
        for name in STRATEGIES
    }


def machine() -> dict[str, str | int | None]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
    }


def table(results: dict[str, dict[int, Result]], field: str, title: str) -> str:
    width = max(len(name) for name in results)
    head = f"{'strategy':<{width}} | " + " | ".join(f"{n:>7}" for n in SIZES) + " | 512/64"
    lines = [title, head, "-" * len(head)]
    for name, by_size in results.items():
        values = [getattr(by_size[n], field) for n in SIZES]
        cells = " | ".join(f"{v:7.2f}" for v in values)
        lines.append(f"{name:<{width}} | {cells} | {values[2] / values[1]:6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--saturated",
        action="store_true",
        help="every replica full but one in 64: the state in which the core asks for a pick "
        "each time a slot frees",
    )
    args = parser.parse_args(argv)
    results = run(args.saturated)
    load_name = "saturated" if args.saturated else "steady"
    if args.json:
        out = {
            "machine": machine(),
            "load": load_name,
            "unit": "microseconds",
            "sizes": list(SIZES),
            "strategies": {
                name: {
                    "pick_us": {str(n): round(r.pick_us, 3) for n, r in by_size.items()},
                    "bookkeeping_us": {
                        str(n): round(r.bookkeeping_us, 3) for n, r in by_size.items()
                    },
                    "ratio_512_64": round(by_size[512].pick_us / by_size[64].pick_us, 3),
                }
                for name, by_size in results.items()
            },
        }
        print(json.dumps(out, indent=2))
        return 0
    m = machine()
    print(f"Python {m['python']} on {m['nproc']} CPUs ({m['platform']}), {load_name} load\n")
    print(table(results, "pick_us", "median pick, microseconds (bookkeeping excluded)"))
    print()
    print(table(results, "bookkeeping_us", "dispatch + completion with update, microseconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
