"""Every strategy on fleets nobody tuned, against an oracle split at the true capacities.

    python bench/bench_learned_capacity.py                         # the tables (see --help)
    python bench/bench_learned_capacity.py --json                  # one JSON document instead
    python bench/bench_learned_capacity.py --duration 60 --steps 4 # a quicker, coarser look
    python bench/bench_learned_capacity.py --jobs 1                # one process
    python bench/bench_learned_capacity.py --strategy least-connections  # it and the default
    python bench/bench_learned_capacity.py --from-json run.json    # tables of a saved run

Three fleets: examples/fleets/untuned-four-generations.yaml and untuned-wide.yaml (every
weight 1, every batch size 256, no KV capacity given: what a team has the day it pools its
cards; an 11x spread in memory bandwidth) and the shipped examples/fleets/mixed-a100-v100.yaml.
Two cases per fleet, every strategy on the same seeded arrivals:

- ``conv``: the conv trace's length mix, Poisson arrivals. Each strategy's max sustainable
  fraction of the fleet's capacity (p99 TTFT <= 2 s and completions keeping up, by
  bisection), and its p99 TTFT at load 0.8.
- ``code-bursty``: the code trace's length mix, gamma arrivals of burstiness 0.25, load 0.8.

Beside them, in each case:

- ``oracle``: weighted-round-robin with every replica's weight set to its true capacity on
  the case's mix (from fleet_capacity): the static split an operator with perfect knowledge
  would write. The ratio default-strategy p99 TTFT / oracle p99 TTFT is the figure the aim
  bounds (at most 1.15).
- ``adaptive``: the default strategy with adaptive batch sizes on
  (``router.adaptive.batch_sizes``), next to the same strategy with them off, at load 0.8,
  and (conv) its max sustainable fraction.

The default strategy is the router's own default (StrategyConfig's), whatever a fleet file
names. Fleet paths are taken relative to this file's folder, so the script runs unchanged
against another checkout of the router put first on PYTHONPATH (the "before" figures).
Each simulation is single-threaded; ``--jobs`` runs them in parallel processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

from router.config import load_fleet
from router.config.schema import FleetConfig
from router.sim.runner import (
    Workload,
    fleet_capacity,
    max_sustainable,
    result_dict,
    run_strategy,
    trace_rows,
)
from router.strategies import STRATEGIES

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"
FLEET_FILES = ("untuned-four-generations.yaml", "untuned-wide.yaml", "mixed-a100-v100.yaml")
LOAD = 0.8
BURSTINESS = 0.25
SLO_TTFT_P99_S = 2.0
ORACLE = "oracle"
ADAPTIVE = "adaptive"

CASES: dict[str, tuple[str, str, float]] = {
    # case: (trace, arrivals, burstiness)
    "conv": ("conv", "poisson", 1.0),
    "code-bursty": ("code", "gamma", BURSTINESS),
}


def default_strategy() -> str:
    """The router's default strategy (the one a fleet file without ``strategy`` gets)."""
    try:
        from router.config.schema import StrategyConfig

        return str(StrategyConfig().name)
    except (ImportError, TypeError, AttributeError):
        return "weighted-least-connections"


# ---- one simulation, in a worker process --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
    """One simulation or one search, in plain data (it crosses to a worker process)."""

    kind: str
    """``search`` (max sustainable) or ``load`` (one run at ``load`` x capacity)."""
    fleet: str
    """File name under examples/fleets."""
    case: str
    strategy: str
    variant: str
    """``""``, ``oracle`` or ``adaptive``."""
    capacities: tuple[tuple[str, float], ...]
    load: float
    duration: float
    steps: int
    seed: int


@cache
def _fleet(name: str) -> FleetConfig:
    return load_fleet(FLEETS / name)


@cache
def _workload(case: str) -> Workload:
    trace, arrivals, burstiness = CASES[case]
    return Workload(trace_rows(trace), arrivals=arrivals, burstiness=burstiness)


def with_weights(fleet: FleetConfig, weights: Mapping[str, float]) -> FleetConfig:
    """The fleet with each replica's static weight replaced."""
    nodes = tuple(
        dataclasses.replace(
            node,
            replicas=tuple(
                dataclasses.replace(r, weight=weights.get(r.id, r.weight)) for r in node.replicas
            ),
        )
        for node in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


def with_adaptive_batch_sizes(fleet: FleetConfig) -> FleetConfig:
    adaptive = dataclasses.replace(fleet.router.adaptive, batch_sizes=True)
    return dataclasses.replace(fleet, router=dataclasses.replace(fleet.router, adaptive=adaptive))


def run_task(task: Task) -> dict[str, Any]:
    t0 = time.perf_counter()
    fleet = _fleet(task.fleet)
    workload = _workload(task.case)
    capacities = dict(task.capacities)
    capacity = sum(capacities.values())
    strategy = task.strategy
    if task.variant == ORACLE:
        fleet = with_weights(fleet, capacities)
        strategy = "weighted-round-robin"
    elif task.variant == ADAPTIVE:
        fleet = with_adaptive_batch_sizes(fleet)
    row: dict[str, Any] = {"strategy": strategy, "variant": task.variant}
    if task.kind == "search":
        rate, at = max_sustainable(
            fleet,
            strategy,
            workload,
            capacity,
            capacities,
            duration=task.duration,
            seed=task.seed,
            slo_ttft_p99_s=SLO_TTFT_P99_S,
            steps=task.steps,
        )
        row["max_sustainable_rps"] = round(rate, 3)
        row["max_sustainable_fraction"] = round(rate / capacity, 4)
        row["at_max"] = None if at is None else result_dict(at, rate, capacity)
    else:
        rate = task.load * capacity
        result = run_strategy(fleet, strategy, workload, rate, task.duration, task.seed, capacities)
        row.update(result_dict(result, rate, capacity))
        row["strategy"] = strategy
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


# ---- the plan -----------------------------------------------------------------------------


def plan(
    fleets: list[str], capacities: Mapping[tuple[str, str], dict[str, float]], args: Any
) -> list[Task]:
    default = default_strategy()
    tasks: list[Task] = []

    def add(kind: str, fleet: str, case: str, strategy: str, variant: str = "") -> None:
        caps = tuple(sorted(capacities[(fleet, case)].items()))
        tasks.append(
            Task(
                kind,
                fleet,
                case,
                strategy,
                variant,
                caps,
                args.load,
                args.duration,
                args.steps,
                args.seed,
            )
        )

    # The default always runs: the oracle and adaptive columns are read beside it.
    names = sorted(set(args.strategy or STRATEGIES) | {default})
    for fleet in fleets:
        # Searches first: they are the long ones, so the pool ends evenly.
        for name in names:
            add("search", fleet, "conv", name)
        add("search", fleet, "conv", default, ADAPTIVE)
        for case in CASES:
            for name in names:
                add("load", fleet, case, name)
            add("load", fleet, case, "weighted-round-robin", ORACLE)
            add("load", fleet, case, default, ADAPTIVE)
    return tasks


def run_all(tasks: list[Task], jobs: int, quiet: bool) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    out: list[dict[str, Any] | None] = [None] * len(tasks)

    def note(i: int, row: dict[str, Any]) -> None:
        out[i] = row
        if not quiet:
            t = tasks[i]
            done = sum(r is not None for r in out)
            print(
                f"  [{done}/{len(tasks)} {time.perf_counter() - t0:5.0f} s] {t.fleet} {t.case} "
                f"{t.kind} {t.strategy}{' ' + t.variant if t.variant else ''} "
                f"({row['wall_s']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    if jobs <= 1:
        for i, task in enumerate(tasks):
            note(i, run_task(task))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures: dict[Future[dict[str, Any]], int] = {
                pool.submit(run_task, task): i for i, task in enumerate(tasks)
            }
            for future in _as_completed(futures):
                note(futures[future], future.result())
    return [r for r in out if r is not None]


def _as_completed(futures: Mapping[Future[dict[str, Any]], int]) -> Any:
    from concurrent.futures import as_completed

    return as_completed(futures)


# ---- the report ---------------------------------------------------------------------------


def build_report(
    fleets: list[str],
    capacities: Mapping[tuple[str, str], dict[str, float]],
    tasks: list[Task],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    default = default_strategy()
    report: dict[str, Any] = {"default_strategy": default, "fleets": {}}
    for fleet in fleets:
        config = _fleet(fleet)
        entry: dict[str, Any] = {"replicas": len(config.replicas)}
        for case in CASES:
            caps = capacities[(fleet, case)]
            by_model: dict[str, float] = {}
            for r in config.replicas:
                by_model[r.gpu_model] = round(caps[r.id], 3)
            mine = [
                (t, r)
                for t, r in zip(tasks, rows, strict=True)
                if t.fleet == fleet and t.case == case
            ]
            search = {t.strategy: r for t, r in mine if t.kind == "search" and not t.variant}
            load = {t.strategy: r for t, r in mine if t.kind == "load" and not t.variant}
            oracle = next(r for t, r in mine if t.kind == "load" and t.variant == ORACLE)
            adaptive_load = next(r for t, r in mine if t.kind == "load" and t.variant == ADAPTIVE)
            adaptive_search = next(
                (r for t, r in mine if t.kind == "search" and t.variant == ADAPTIVE), None
            )
            oracle_p99 = oracle["ttft_p99_s"]
            strategies = []
            for name in sorted(load):
                s, lo = search.get(name), load[name]
                strategies.append(
                    {
                        "strategy": name,
                        "max_sustainable_fraction": None
                        if s is None
                        else s["max_sustainable_fraction"],
                        "at_max": None if s is None else s["at_max"],
                        "at_load": lo,
                        "ttft_p99_over_oracle": _ratio(lo["ttft_p99_s"], oracle_p99),
                    }
                )
            c: dict[str, Any] = {
                "capacity_rps": round(sum(caps.values()), 3),
                "capacity_rps_per_replica_by_gpu_model": by_model,
                "capacity_spread": round(max(caps.values()) / min(caps.values()), 2),
                "strategies": strategies,
                "oracle": oracle,
                "default_ttft_p99_over_oracle": _ratio(load[default]["ttft_p99_s"], oracle_p99),
                "adaptive_batch_sizes": {
                    "strategy": default,
                    "off": _brief(load[default]),
                    "on": _brief(adaptive_load),
                    "max_sustainable_fraction_off": None
                    if default not in search
                    else search[default]["max_sustainable_fraction"],
                    "max_sustainable_fraction_on": None
                    if adaptive_search is None
                    else adaptive_search["max_sustainable_fraction"],
                },
            }
            if search:
                best = max(search.values(), key=lambda r: r["max_sustainable_fraction"])
                c["best"] = {
                    "strategy": best["strategy"],
                    "max_sustainable_fraction": best["max_sustainable_fraction"],
                }
                c["default_max_sustainable_fraction"] = search[default]["max_sustainable_fraction"]
            entry[case] = c
        report["fleets"][fleet] = entry
    return report


def _brief(row: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("throughput_rps", "capacity_fraction", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s")
    return {k: row[k] for k in keys} | {"lost_requests": row["lost_requests"]}


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None (unbounded) when a is unbounded or b is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 3)


# ---- printing -----------------------------------------------------------------------------


def _f(x: object, fmt: str = "{:.3f}", none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, (int, float)):
        return fmt.format(x)
    return str(x)


def print_report(report: Mapping[str, Any]) -> None:
    default = report["default_strategy"]
    for fleet, entry in report["fleets"].items():
        for case, c in entry.items():
            if case == "replicas":
                continue
            trace, arrivals, burstiness = CASES[case]
            caps = ", ".join(
                f"{k} {v:.2f}" for k, v in c["capacity_rps_per_replica_by_gpu_model"].items()
            )
            how = "Poisson" if arrivals == "poisson" else f"gamma burstiness {burstiness}"
            print(f"\n## examples/fleets/{fleet}: {trace} lengths, {how}")
            print(
                f"capacity_rps {c['capacity_rps']:.2f} (per replica: {caps}; spread "
                f"{c['capacity_spread']:.1f}x); load {report['settings']['load']} for the "
                f"p99 columns"
            )
            print(
                f"{'strategy':<28} {'max frac':>8} {'thr frac':>8} {'ttft p50':>8} "
                f"{'ttft p99':>9} {'/oracle':>8} {'e2e p99':>8} {'imbal':>6}"
            )
            rows = sorted(
                c["strategies"],
                key=lambda s: (-(s["max_sustainable_fraction"] or 0), _inf(s["at_load"])),
            )
            for s in rows:
                lo = s["at_load"]
                mark = " *" if s["strategy"] == default else ""
                print(
                    f"{s['strategy'] + mark:<28} {_f(s['max_sustainable_fraction']):>8} "
                    f"{lo['capacity_fraction']:>8.3f} {_f(lo['ttft_p50_s']):>8} "
                    f"{_f(lo['ttft_p99_s'], '{:.2f}', 'unbounded'):>9} "
                    f"{_f(s['ttft_p99_over_oracle'], '{:.2f}', 'unbnd'):>8} "
                    f"{_f(lo['e2e_p99_s'], '{:.1f}'):>8} {lo['imbalance_factor']:>6.2f}"
                )
            o = c["oracle"]
            print(
                f"{'oracle (wrr = capacity)':<28} {'-':>8} {o['capacity_fraction']:>8.3f} "
                f"{_f(o['ttft_p50_s']):>8} {_f(o['ttft_p99_s'], '{:.2f}', 'unbounded'):>9} "
                f"{'1.00':>8} {_f(o['e2e_p99_s'], '{:.1f}'):>8} {o['imbalance_factor']:>6.2f}"
            )
            a = c["adaptive_batch_sizes"]
            for label, key in (("off", "off"), ("on", "on")):
                r = a[key]
                frac = a[f"max_sustainable_fraction_{key}"]
                print(
                    f"{'adaptive batch ' + label:<28} {_f(frac):>8} "
                    f"{r['capacity_fraction']:>8.3f} {_f(r['ttft_p50_s']):>8} "
                    f"{_f(r['ttft_p99_s'], '{:.2f}', 'unbounded'):>9} "
                    f"{_f(_ratio(r['ttft_p99_s'], o['ttft_p99_s']), '{:.2f}', 'unbnd'):>8} "
                    f"{_f(r['e2e_p99_s'], '{:.1f}'):>8} {'':>6}"
                )
            best = c.get("best")
            only = report["settings"].get("strategies", "all") != "all"
            line = f"default ({default}, marked *): p99 / oracle p99 "
            line += _f(c["default_ttft_p99_over_oracle"], "{:.2f}", "unbounded")
            if best is not None:
                line += (
                    f"; max sustainable {c['default_max_sustainable_fraction']:.3f}; best"
                    f"{' of those run' if only else ''} {best['strategy']} "
                    f"{best['max_sustainable_fraction']:.3f}"
                )
            print(line)
    s = report["settings"]
    m = report["machine"]
    print(
        f"\nduration {s['duration_s']:.0f} simulated s per run, {s['search_steps']} bisection "
        f"steps, seed {s['seed']}, {s['jobs']} processes; total {report['wall_s']:.0f} s on "
        f"{m['nproc']} CPUs, load average {m['loadavg'][0]:.2f} at start, "
        f"{report['loadavg_at_end'][0]:.2f} at end"
    )


def _inf(row: Mapping[str, Any]) -> float:
    x = row["ttft_p99_s"]
    return float("inf") if x is None else float(x)


def _machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="simulated s per run (300)")
    parser.add_argument("--steps", type=int, default=7, help="bisection steps (7: 1%% of capacity)")
    parser.add_argument("--seed", type=int, default=1, help="one seed for every run (1)")
    parser.add_argument("--load", type=float, default=LOAD, help="load of the p99 columns (0.8)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (all CPUs)"
    )
    parser.add_argument(
        "--fleet",
        action="append",
        choices=FLEET_FILES,
        help="only this fleet (repeatable; default: all three)",
    )
    parser.add_argument(
        "--strategy",
        action="append",
        choices=sorted(STRATEGIES),
        help="only this strategy, beside the default (repeatable; default: every one)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--from-json", metavar="FILE", help="print the tables of a saved --json run, run nothing"
    )
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            print_report(json.load(f))
        return
    if args.duration <= 0 or args.steps < 1 or args.load <= 0 or args.jobs < 1:
        parser.error("--duration, --load must be > 0; --steps, --jobs >= 1")
    t0 = time.perf_counter()
    machine = _machine()
    fleets = list(dict.fromkeys(args.fleet or FLEET_FILES))
    capacities = {
        (fleet, case): fleet_capacity(_fleet(fleet), _workload(case).mix, seed=args.seed)
        for fleet in fleets
        for case in CASES
    }
    tasks = plan(fleets, capacities, args)
    rows = run_all(tasks, args.jobs, args.quiet)
    report = build_report(fleets, capacities, tasks, rows)
    report["settings"] = {
        "duration_s": args.duration,
        "search_steps": args.steps,
        "seed": args.seed,
        "load": args.load,
        "burstiness": BURSTINESS,
        "slo_ttft_p99_s": SLO_TTFT_P99_S,
        "jobs": args.jobs,
        "strategies": sorted(args.strategy) if args.strategy else "all",
    }
    report["machine"] = machine
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
