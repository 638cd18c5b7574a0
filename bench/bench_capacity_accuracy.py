"""How close and how steady learned capacity is, on the simulator.

    python bench/bench_capacity_accuracy.py                       # four generations, load 0.5
    python bench/bench_capacity_accuracy.py --fleet untuned-wide.yaml --load 0.8

Runs the default strategy at a steady load and reads the router's learned capacity of every
replica (router/capacity.py) every ``--every`` simulated seconds from ``--after`` on. Prints,
per replica, learned over true capacity at ``--after``, at the end, and its lowest and highest
over every reading (true: what the simulator measures the replica sustaining alone on the
trace's mix, ``fleet_capacity``), the largest move from one reading to the next, and the
estimate's source. Then the lowest and highest again against the replica's capacity on the
mix the run actually offered (its arrivals' lengths): a few thousand draws of a heavy-tailed
trace can be several percent lighter or heavier than the whole trace, and the router knows
only what it was sent. Seeded: the same arguments give the same tables on any machine.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from pathlib import Path

from router.config import load_fleet
from router.config.schema import StrategyConfig
from router.sim.runner import Workload, catalog_for, fleet_capacity, trace_rows
from router.sim.simulator import Simulation
from router.sim.workload import Arrival, TraceMix, TraceRow

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fleet", default="untuned-four-generations.yaml")
    parser.add_argument("--load", type=float, default=0.5, help="times capacity (0.5)")
    parser.add_argument("--duration", type=float, default=180.0, help="simulated s (180)")
    parser.add_argument("--after", type=float, default=60.0, help="first reading, s (60)")
    parser.add_argument("--every", type=float, default=5.0, help="between readings, s (5)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    fleet = load_fleet(FLEETS / args.fleet)
    workload = Workload(trace_rows("conv"))
    true = fleet_capacity(fleet, workload.mix, seed=args.seed)
    strategy = StrategyConfig().name
    sim = Simulation(fleet, strategy, seed=args.seed, catalog=catalog_for(fleet), capacities=true)
    readings: dict[str, list[tuple[float, str]]] = {r.id: [] for r in sim.core.pool}

    def read() -> None:
        for r in sim.core.pool:
            e = sim.core.capacity.estimate(r, sim.clock.now)
            readings[r.id].append((e.rps, str(e.rate_source)))

    t = args.after
    while t <= args.duration:
        sim.at(t, read)
        t += args.every
    rate = args.load * sum(true.values())
    offered: list[TraceRow] = []

    def noted(arrivals: Iterator[Arrival]) -> Iterator[Arrival]:
        for a in arrivals:
            offered.append(TraceRow(a.time, a.prompt_tokens, a.output_tokens))
            yield a

    sim.run(noted(workload.generate(rate, args.duration, args.seed)), args.duration)
    print(
        f"{args.fleet}, {strategy}, load {args.load:g}, conv mix; readings every "
        f"{args.every:g} s from {args.after:g} s to {args.duration:g} s"
    )
    print(
        f"{'replica':<10} {'true r/s':>8} {'first':>6} {'last':>6} {'low':>6} {'high':>6} "
        f"{'max move':>8}  source"
    )
    for rid, xs in readings.items():
        values = [v for v, _ in xs]
        moves = [abs(b - a) / a for a, b in itertools.pairwise(values) if a > 0]
        ratios = [v / true[rid] for v in values]
        print(
            f"{rid:<10} {true[rid]:>8.2f} {ratios[0]:>6.2f} {ratios[-1]:>6.2f} "
            f"{min(ratios):>6.3f} {max(ratios):>6.3f} {max(moves, default=0.0):>8.3f}  {xs[-1][1]}"
        )
    print(
        "(first, last, low, high: learned over true at the first and last reading, lowest and "
        "highest over all; max move: largest change between two readings)"
    )
    mine = fleet_capacity(fleet, TraceMix(offered), seed=args.seed)
    print(f"\nagainst the capacity on the {len(offered)} requests the run offered")
    print(f"{'replica':<10} {'true r/s':>8} {'low':>6} {'high':>6}")
    for rid, xs in readings.items():
        ratios = [v / mine[rid] for v, _ in xs]
        print(f"{rid:<10} {mine[rid]:>8.2f} {min(ratios):>6.3f} {max(ratios):>6.3f}")


if __name__ == "__main__":
    main()
