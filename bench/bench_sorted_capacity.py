"""What a strategy asks of each card against what the card does on the lengths it is sent.

    python bench/bench_sorted_capacity.py --fleet mixed-a100-v100.yaml --load 0.9

A strategy that sorts by size sends each card its own cut of the lengths, and a card's
saturation rate on its cut is not its rate on the fleet's mix. This runs one strategy on the
simulator, then measures each card alone on the very requests it completed
(``router.sim.capacity.measure_capacity``, as the fleet's capacity is measured) and prints,
per card, its share of the completions, its rate on its own cut and on the fleet's mix, and
how much of its own-cut rate the run asked of it (offered load times share over that rate).
The fleet's rate at which the first card saturates, under this sorting, is the smallest
``own-cut rate / share``: the most the fleet can be sent before a card sets its limit.
Seeded: the same arguments give the same table on any machine.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from router.config import load_fleet
from router.core import CoreListener, Finished, Outcome
from router.sim.capacity import measure_capacity
from router.sim.replica_model import engine_for
from router.sim.runner import Workload, catalog_for, fleet_capacity, trace_rows
from router.sim.simulator import Simulation
from router.sim.workload import TraceMix, TraceRow

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"


class Served(CoreListener):
    """The lengths each replica completed. The workload sends each request's own output
    length as ``max_tokens``, so that is what the engine generated."""

    def __init__(self, rows: dict[str, list[TraceRow]]) -> None:
        self.rows = rows

    def on_finish(self, finished: Finished) -> None:
        req = finished.request
        if finished.outcome is Outcome.COMPLETED and finished.replica is not None:
            self.rows[finished.replica].append(TraceRow(0.0, req.prompt_tokens, req.max_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fleet", default="mixed-a100-v100.yaml")
    parser.add_argument("--strategy", default="shortest-expected-delay")
    parser.add_argument("--load", type=float, default=0.9, help="times capacity (0.9)")
    parser.add_argument("--duration", type=float, default=200.0, help="simulated s (200)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    fleet = load_fleet(FLEETS / args.fleet)
    workload, catalog = Workload(trace_rows("conv")), catalog_for(fleet)
    true = fleet_capacity(fleet, workload.mix, catalog, seed=args.seed)
    capacity = sum(true.values())
    sim = Simulation(fleet, args.strategy, seed=args.seed, catalog=catalog, capacities=true)
    served = Served({r.id: [] for r in sim.core.pool})
    sim.core.listeners.append(served)
    rate = args.load * capacity
    result = sim.run(workload.generate(rate, args.duration, args.seed), args.duration)
    total = sum(len(rows) for rows in served.rows.values())
    print(
        f"{args.fleet}, {args.strategy}, load {args.load:g} of {capacity:.2f} req/s; "
        f"served {result.throughput_rps / capacity:.3f} of capacity, p99 TTFT "
        f"{result.ttft_p99_s:.2f} s"
    )
    print(f"{'replica':<10} {'share':>6} {'own r/s':>8} {'fleet r/s':>9} {'asked':>6} {'limit':>6}")
    limits = []
    for r in sim.core.pool:
        rows = served.rows[r.id]
        own = measure_capacity(
            partial(engine_for, r.config, catalog), TraceMix(rows), seed=args.seed
        )
        share = len(rows) / total
        limits.append(own / share)
        print(
            f"{r.id:<10} {share:>6.3f} {own:>8.2f} {true[r.id]:>9.2f} "
            f"{rate * share / own:>6.2f} {own / share / capacity:>6.3f}"
        )
    print(f"the fleet's limit under this sorting: {min(limits) / capacity:.3f} of capacity")
    print("(asked: offered load times share over the card's rate on its own requests; limit:")
    print(" own rate over share, as a fraction of the fleet's capacity)")


if __name__ == "__main__":
    main()
