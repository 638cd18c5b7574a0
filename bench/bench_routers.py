"""Several routers, one fleet: what N routers sustain, sharing their load or not.

    python bench/bench_routers.py                                  # the tables (see --help)
    python bench/bench_routers.py --duration 200 --steps 5         # the documented run
    python bench/bench_routers.py --json                           # one JSON document
    python bench/bench_routers.py --routers 1 --routers 4          # only these counts

N router cores (router/sim/routers.py) in front of the same simulated engines; a round-robin
L4 balancer gives each arrival to one of them. With sharing, each publishes its own load per
replica every stats period (1 s, as the live router's ``routers/<id>/stats``) and the others
count it a broker hop (5-50 ms) later (router/peer_load.py); without, none hears of the
others. For N = 1, 2, 4, 8, both fleets (examples/fleets/untuned-four-generations.yaml and
mixed-a100-v100.yaml) and two strategies (the default, shortest-expected-delay, and
least-connections): the max sustainable fraction of the fleet's capacity, exactly as
bench/bench_learned_capacity.py finds it (conv lengths, Poisson arrivals, p99 TTFT <= 2 s and
completions keeping up, by bisection) but over ``--bracket`` (0.8 to 1.05 of capacity by
default: every figure of that bench lies in it, and 5 steps then resolve 0.8%), and its ratio
to one router's. The aim: with sharing, N routers lose no more than 3% of what one reaches.
Each search is single-threaded; ``--jobs`` runs them in parallel processes. The 28 searches
of the default run take about 2,700 CPU-seconds (3.5 minutes on 16 cores, about 23 on 2);
``--duration 120`` takes about 60% of that (about 14 minutes on 2 cores) and resolves the
same bracket, with shorter runs' noisier tails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from bench_learned_capacity import SLO_TTFT_P99_S, _f, _fleet, _machine, _workload, default_strategy

from router.sim.routers import Routers
from router.sim.runner import fleet_capacity, max_sustainable

FLEET_FILES = ("untuned-four-generations.yaml", "mixed-a100-v100.yaml")
COUNTS = (1, 2, 4, 8)
CASE = "conv"
AIM_LOSS = 0.03


@dataclasses.dataclass(frozen=True)
class Task:
    """One search, in plain data (it crosses to a worker process)."""

    fleet: str
    strategy: str
    routers: int
    sharing: bool
    capacities: tuple[tuple[str, float], ...]
    duration: float
    steps: int
    seed: int
    bracket: tuple[float, float]


def run_task(task: Task) -> dict[str, Any]:
    t0 = time.perf_counter()
    capacities = dict(task.capacities)
    capacity = sum(capacities.values())
    rate, at = max_sustainable(
        _fleet(task.fleet),
        task.strategy,
        _workload(CASE),
        capacity,
        capacities,
        duration=task.duration,
        seed=task.seed,
        slo_ttft_p99_s=SLO_TTFT_P99_S,
        steps=task.steps,
        routers=Routers(task.routers, sharing=task.sharing),
        bracket=task.bracket,
    )
    return {
        "fleet": task.fleet,
        "strategy": task.strategy,
        "routers": task.routers,
        "sharing": task.sharing,
        "max_sustainable_fraction": round(rate / capacity, 4),
        "below_bracket": at is None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def plan(args: Any, capacities: Mapping[str, dict[str, float]]) -> list[Task]:
    tasks = []
    strategies = list(
        dict.fromkeys([default_strategy(), *(args.strategy or ["least-connections"])])
    )
    counts = sorted(set(args.routers or COUNTS) | {1})
    for fleet in args.fleet or FLEET_FILES:
        caps = tuple(sorted(capacities[fleet].items()))
        for strategy in strategies:
            for n in counts:
                # One router has nobody to share with: its figure is the reference for both.
                for sharing in (True,) if n == 1 else (True, False):
                    tasks.append(
                        Task(
                            fleet,
                            strategy,
                            n,
                            sharing,
                            caps,
                            args.duration,
                            args.steps,
                            args.seed,
                            tuple(args.bracket),
                        )
                    )
    # The most routers first: they are the slowest, so the pool ends evenly.
    return sorted(tasks, key=lambda t: -t.routers)


def run_all(tasks: list[Task], jobs: int, quiet: bool) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_task, task) for task in tasks]
        for future in as_completed(futures):
            row = future.result()
            rows.append(row)
            if not quiet:
                print(
                    f"  [{len(rows)}/{len(tasks)} {time.perf_counter() - t0:5.0f} s] "
                    f"{row['fleet']} {row['strategy']} {row['routers']} routers "
                    f"{'sharing' if row['sharing'] else 'alone'}: "
                    f"{row['max_sustainable_fraction']:.3f} ({row['wall_s']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def build_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fleet and strategy, each count's fraction with and without sharing, over one
    router's."""
    table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        table.setdefault(row["fleet"], {}).setdefault(row["strategy"], []).append(row)
    report: dict[str, Any] = {"fleets": {}}
    for fleet, by_strategy in table.items():
        report["fleets"][fleet] = {}
        for strategy, found in by_strategy.items():
            one = next(r["max_sustainable_fraction"] for r in found if r["routers"] == 1)
            lines = []
            for n in sorted({r["routers"] for r in found}):
                line: dict[str, Any] = {"routers": n}
                for sharing, key in ((True, "sharing"), (False, "alone")):
                    # One router is its own reference, with sharing and without alike.
                    hit = [
                        r
                        for r in found
                        if r["routers"] == n and (r["sharing"] is sharing or n == 1)
                    ]
                    if hit:
                        frac = hit[0]["max_sustainable_fraction"]
                        line[key] = frac
                        line[f"{key}_ratio"] = round(frac / one, 4) if one > 0 else None
                lines.append(line)
            report["fleets"][fleet][strategy] = lines
    return report


def print_report(report: Mapping[str, Any]) -> None:
    s = report["settings"]
    lo, hi = s["bracket"]
    for fleet, by_strategy in report["fleets"].items():
        print(f"\n## examples/fleets/{fleet}: conv lengths, Poisson; max sustainable fraction")
        print(
            f"{'strategy':<26} {'routers':>7} {'sharing':>8} {'/ N=1':>6} {'alone':>7} {'/ N=1':>6}"
        )
        for strategy, lines in by_strategy.items():
            for line in lines:
                print(
                    f"{strategy:<26} {line['routers']:>7} {_f(line.get('sharing')):>8} "
                    f"{_f(line.get('sharing_ratio')):>6} {_f(line.get('alone')):>7} "
                    f"{_f(line.get('alone_ratio')):>6}"
                )
    worst = [
        line["sharing_ratio"]
        for by_strategy in report["fleets"].values()
        for lines in by_strategy.values()
        for line in lines
        if line["routers"] > 1 and line.get("sharing_ratio") is not None
    ]
    if worst:
        held = "holds" if min(worst) >= 1 - AIM_LOSS else "does NOT hold"
        print(
            f"\naim: with sharing, N routers >= {1 - AIM_LOSS:.2f} of one router's: "
            f"worst {min(worst):.3f} ({held})"
        )
    m = report["machine"]
    print(
        f"\nduration {s['duration_s']:.0f} simulated s per run, {s['search_steps']} bisection "
        f"steps over {lo:g}..{hi:g} of capacity (a figure at {lo:g}: below the bracket), seed "
        f"{s['seed']}, {s['jobs']} processes; total {report['wall_s']:.0f} s on {m['nproc']} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=200.0, help="simulated s per run (200)")
    parser.add_argument("--steps", type=int, default=5, help="bisection steps (5)")
    parser.add_argument(
        "--bracket",
        type=float,
        nargs=2,
        default=(0.8, 1.05),
        metavar=("LOW", "HIGH"),
        help="loads searched, times capacity (0.8 1.05)",
    )
    parser.add_argument("--seed", type=int, default=1, help="one seed for every run (1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--fleet", action="append", choices=FLEET_FILES, help="only this fleet")
    parser.add_argument(
        "--strategy",
        action="append",
        help="run beside the default strategy (repeatable; without it: least-connections)",
    )
    parser.add_argument("--routers", action="append", type=int, help="only these counts (and 1)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--from-json", metavar="FILE", help="print the tables of a saved --json run"
    )
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            print_report(json.load(f))
        return
    lo, hi = args.bracket
    if args.duration <= 0 or args.steps < 1 or args.jobs < 1 or not 0 <= lo < hi:
        parser.error("--duration must be > 0; --steps, --jobs >= 1; --bracket LOW < HIGH")
    t0 = time.perf_counter()
    machine = _machine()
    fleets = args.fleet or FLEET_FILES
    capacities = {f: fleet_capacity(_fleet(f), _workload(CASE).mix, seed=args.seed) for f in fleets}
    args.fleet = fleets
    rows = run_all(plan(args, capacities), args.jobs, args.quiet)
    report = build_report(rows)
    report["settings"] = {
        "duration_s": args.duration,
        "search_steps": args.steps,
        "bracket": [lo, hi],
        "seed": args.seed,
        "jobs": args.jobs,
        "slo_ttft_p99_s": SLO_TTFT_P99_S,
        "stats_interval_s": Routers().stats_interval_s,
        "broker_delay_s": list(Routers().broker_delay_s),
        "balancer": Routers().balancer,
    }
    report["machine"] = machine
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
