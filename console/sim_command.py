"""``gpurouter sim``: compare strategies on the fleet simulator."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from router.config import load_fleet
from router.errors import GpuRouterError
from router.sim.runner import (
    Workload,
    catalog_for,
    fleet_capacity,
    max_sustainable,
    result_dict,
    run_strategy,
    trace_rows,
)
from router.strategies import STRATEGIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", required=True, help="fleet YAML file")
    p.add_argument("--strategy", default="all", help="a strategy name, or 'all' (default)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="arrivals per second")
    load.add_argument("--load", type=float, help="arrivals as a multiple of capacity_rps")
    p.add_argument("--duration", type=float, default=300.0, help="simulated seconds (300)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument("--trace", default="conv", help="length mix: conv, code or a CSV path")
    p.add_argument(
        "--lengths",
        choices=("trace", "lognormal"),
        default="trace",
        help="draw lengths from the trace's rows, or from a lognormal fit of them (trace)",
    )
    p.add_argument(
        "--arrivals",
        choices=("poisson", "gamma", "trace"),
        default="poisson",
        help="arrival process; 'trace' replays the trace's own timing (default poisson)",
    )
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="max_tokens every client sends (default: each request's own output length); "
        "engines still stop at the trace's length, cut at N",
    )
    p.add_argument(
        "--max-sustainable",
        action="store_true",
        help="search each strategy's highest rate with p99 TTFT under --slo-ttft",
    )
    p.add_argument("--slo-ttft", type=float, default=2.0, help="p99 TTFT SLO, seconds (2)")
    p.add_argument(
        "--search-steps",
        type=int,
        default=7,
        help="bisection steps of --max-sustainable over 0-1.2 x capacity (7: 1%% of capacity)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per strategy")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        rows = _rows(args, out)
    except GpuRouterError as exc:
        err.write(f"gpurouter sim: {exc}\n")
        return 2
    if not args.json:
        _table(rows, args.max_sustainable, out)
    return 0


def _rows(args: argparse.Namespace, out: TextIO) -> list[dict[str, Any]]:
    _check(args)
    fleet = load_fleet(args.fleet)
    names = sorted(STRATEGIES) if args.strategy == "all" else [args.strategy]
    try:
        workload = Workload(
            trace_rows(args.trace), args.arrivals, args.burstiness, args.lengths, args.max_tokens
        )
    except ValueError as exc:
        raise GpuRouterError(str(exc)) from None
    catalog = catalog_for(fleet)
    capacities = fleet_capacity(fleet, workload.mix, catalog, seed=args.seed)
    capacity = sum(capacities.values())
    rows = []
    for name in names:
        if args.max_sustainable:
            rate, result = max_sustainable(
                fleet,
                name,
                workload,
                capacity,
                capacities,
                duration=args.duration,
                seed=args.seed,
                slo_ttft_p99_s=args.slo_ttft,
                steps=args.search_steps,
                catalog=catalog,
            )
            row: dict[str, Any] = {
                "strategy": name,
                "max_sustainable_rps": round(rate, 4),
                "max_sustainable_fraction": round(rate / capacity, 4),
                "capacity_rps": round(capacity, 4),
                "slo_ttft_p99_s": args.slo_ttft,
                "at_max": None if result is None else result_dict(result, rate, capacity),
            }
        else:
            rate = args.rate if args.rate is not None else (args.load or 0.8) * capacity
            result = run_strategy(
                fleet, name, workload, rate, args.duration, args.seed, capacities, catalog
            )
            row = result_dict(result, rate, capacity)
        rows.append(row)
        if args.json:
            out.write(json.dumps(row) + "\n")
            out.flush()
    return rows


def _check(args: argparse.Namespace) -> None:
    """Refuse what cannot run, before the fleet's capacity is measured."""
    if args.strategy != "all" and args.strategy not in STRATEGIES:
        known = ", ".join(sorted(STRATEGIES))
        raise GpuRouterError(f"unknown strategy {args.strategy!r}; known: all, {known}")
    for flag, value in (
        ("--rate", args.rate),
        ("--load", args.load),
        ("--duration", args.duration),
        ("--burstiness", args.burstiness),
        ("--slo-ttft", args.slo_ttft),
    ):
        if value is not None and not value > 0:
            raise GpuRouterError(f"{flag} must be > 0, got {value}")
    if args.search_steps < 1:
        raise GpuRouterError(f"--search-steps must be >= 1, got {args.search_steps}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise GpuRouterError(f"--max-tokens must be >= 1, got {args.max_tokens}")


def _table(rows: list[dict[str, Any]], sustainable: bool, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"capacity_rps = {rows[0]['capacity_rps']:.2f}")
    if sustainable:
        cols = ["strategy", "max_sustainable_rps", "max_sustainable_fraction"]
    else:
        cols = [
            "strategy",
            "offered_rps",
            "throughput_rps",
            "capacity_fraction",
            "ttft_p50_s",
            "ttft_p99_s",
            "e2e_p99_s",
            "imbalance_factor",
            "lost_requests",
        ]
    for c in cols:
        table.add_column(c, justify="left" if c == "strategy" else "right")
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in cols))
    Console(file=out, width=160).print(table)


def _cell(value: object) -> str:
    if value is None:
        return "unbounded"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
