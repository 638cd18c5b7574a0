"""Where each replica's time to first token goes: the router's queue or the engine.

    python bench/bench_ttft_split.py --fleet examples/fleets/untuned-wide.yaml --load 0.966
    python bench/bench_ttft_split.py --fleet FLEET --strategy least-connections --load 0.9
    python bench/bench_ttft_split.py --fleet FLEET --load 0.966 --adaptive-batch-sizes

One simulated run (conv lengths, Poisson arrivals, the fleet file as written). Each request's
time to first token is split at the moment the router sent it: the wait in the router's queue
before, the engine's own time after. Per replica: requests, mean prompt tokens, the two parts
at p50 and p99, TTFT p99 and how many requests took over the SLO. Tells which card a strategy
over-asks when p99 TTFT is over its bound. ``--oracle`` runs the static split at the true
capacities instead (the oracle of bench_learned_capacity.py). With ``--adaptive-batch-sizes``
the batch tuner is on (``router.adaptive.batch_sizes``; ``--grow-past-batch-size`` lets it
grow past the fleet file's sizes) and every change it made is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

from bench_learned_capacity import with_weights

from router.adaptive import TunerChange
from router.config import FleetConfig, load_fleet
from router.core import Assignment
from router.sim.runner import Workload, fleet_capacity, trace_rows
from router.sim.simulator import Simulation


class _Watched(Simulation):
    """The simulation, noting when and where each request was first sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: dict[str, tuple[float, str, int]] = {}
        """Request id: when it was sent, to which replica, its prompt tokens."""
        self.tuned: list[str] = []
        """The batch tuner's changes, with the simulated second of each."""

    def on_tune(self, changes: list[TunerChange]) -> None:
        self.tuned += [f"{self.clock.now:6.1f} s  {c.message}" for c in changes]
        super().on_tune(changes)

    def on_assign(self, a: Assignment) -> None:
        self.sent.setdefault(a.request.id, (self.clock.now, a.replica.id, a.request.prompt_tokens))
        super().on_assign(a)


def _q(xs: list[float], f: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


def with_batch_tuner(fleet: FleetConfig, grow_past: bool) -> FleetConfig:
    # Only when asked, so the bench runs on trees from before the option too.
    extra: dict[str, Any] = {"grow_past_batch_size": True} if grow_past else {}
    adaptive = dataclasses.replace(fleet.router.adaptive, batch_sizes=True, **extra)
    return dataclasses.replace(fleet, router=dataclasses.replace(fleet.router, adaptive=adaptive))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--fleet", required=True)
    p.add_argument("--strategy", default="shortest-expected-delay")
    p.add_argument("--load", type=float, default=0.9, help="arrivals over capacity (0.9)")
    p.add_argument("--duration", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slo", type=float, default=2.0, help="TTFT bound counted, s (2)")
    p.add_argument(
        "--oracle",
        action="store_true",
        help="weighted-round-robin with every weight at the replica's true capacity instead",
    )
    p.add_argument("--adaptive-batch-sizes", action="store_true", help="the batch tuner on")
    p.add_argument(
        "--grow-past-batch-size", action="store_true", help="and let it grow past the file's"
    )
    args = p.parse_args()
    fleet = load_fleet(args.fleet)
    if args.adaptive_batch_sizes or args.grow_past_batch_size:
        fleet = with_batch_tuner(fleet, args.grow_past_batch_size)
    workload = Workload(trace_rows("conv"))
    capacities = fleet_capacity(fleet, workload.mix, seed=args.seed)
    capacity = sum(capacities.values())
    strategy = args.strategy
    if args.oracle:
        fleet, strategy = with_weights(fleet, capacities), "weighted-round-robin"
    sim = _Watched(fleet, strategy, seed=args.seed)
    arrivals = workload.generate(args.load * capacity, args.duration, args.seed)
    result = sim.run(arrivals, args.duration)
    print(
        f"{strategy}{' (oracle)' if args.oracle else ''} at load {args.load} on {args.fleet}: "
        f"p99 TTFT {result.ttft_p99_s:.2f} s, completed {result.throughput_rps / capacity:.3f} "
        "of capacity in the steady window"
    )
    rows: dict[str, dict[str, list[float]]] = {}
    for rid, rec in sim._records.items():
        if rid not in sim.sent or rec.first_token is None:
            continue
        t, replica, prompt = sim.sent[rid]
        row = rows.setdefault(replica, {"wait": [], "engine": [], "prompt": [], "ttft": []})
        row["wait"].append(t - rec.arrival)
        row["engine"].append(rec.first_token - t)
        row["prompt"].append(prompt)
        row["ttft"].append(rec.first_token - rec.arrival)
    print("replica      n  prompt  wait p50  wait p99  engine p50  engine p99  ttft p99  over")
    over_all = 0
    for r in sim.core.pool:
        row = rows.get(r.id, {"wait": [], "engine": [], "prompt": [0.0], "ttft": []})
        over = sum(1 for x in row["ttft"] if x > args.slo)
        over_all += over
        print(
            f"{r.id:10} {len(row['ttft']):4d} {statistics.mean(row['prompt']):7.0f} "
            f"{_q(row['wait'], 0.5):9.2f} {_q(row['wait'], 0.99):9.2f} "
            f"{_q(row['engine'], 0.5):11.2f} {_q(row['engine'], 0.99):11.2f} "
            f"{_q(row['ttft'], 0.99):9.2f} {over:5d}"
        )
    print(f"over {args.slo:g} s: {over_all} requests")
    if args.adaptive_batch_sizes or args.grow_past_batch_size:
        print(f"batch tuner: {len(sim.tuned)} changes")
        for line in sim.tuned:
            print(f"  {line}")


if __name__ == "__main__":
    main()
