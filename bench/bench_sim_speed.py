"""Simulator speed: simulated requests per wall-clock second, on one core.

    python bench/bench_sim_speed.py [--fleet FILE] [--duration S] [--load L]

Runs a few strategies on the same workload, one after another in this one single-threaded
process (so on one core), and prints, for each, the requests simulated, the wall-clock and CPU
seconds they took, and requests per wall-clock second and per CPU second. CPU seconds are
shown because the machine may be shared: wall-clock time then includes waiting for the core,
and requests per CPU second is what one core of one's own would give.
"""

from __future__ import annotations

import argparse
import time

from router.config import load_fleet
from router.sim.runner import Workload, fleet_capacity, run_strategy, trace_rows

STRATEGIES = ("round-robin", "weighted-least-connections", "p2c-peak-ewma", "affinity")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", default="examples/fleets/mixed-a100-v100.yaml")
    parser.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    parser.add_argument("--load", type=float, default=0.8, help="times capacity_rps")
    args = parser.parse_args()
    fleet = load_fleet(args.fleet)
    workload = Workload(trace_rows("conv"))
    capacities = fleet_capacity(fleet, workload.mix)
    rate = args.load * sum(capacities.values())
    print(
        f"fleet {args.fleet}, {len(fleet.replicas)} replicas, conv mix, "
        f"{rate:.1f} req/s for {args.duration:.0f} simulated s"
    )
    print(
        f"{'strategy':<28} {'requests':>9} {'wall s':>7} {'cpu s':>7} {'req/wall s':>11} "
        f"{'req/cpu s':>10}"
    )
    total_requests, total_wall, total_cpu = 0, 0.0, 0.0
    for name in STRATEGIES:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        result = run_strategy(fleet, name, workload, rate, args.duration, 0, capacities)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        total_requests += result.offered
        total_wall += wall
        total_cpu += cpu
        print(_row(name, result.offered, wall, cpu))
    print(_row("all", total_requests, total_wall, total_cpu))


def _row(name: str, requests: int, wall: float, cpu: float) -> str:
    return (
        f"{name:<28} {requests:>9} {wall:>7.2f} {cpu:>7.2f} {requests / wall:>11,.0f} "
        f"{requests / cpu:>10,.0f}"
    )


if __name__ == "__main__":
    main()
