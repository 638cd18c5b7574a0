"""``gpurouter sim``: compare strategies on the fleet simulator.

The fleet's capacity is measured once; then each strategy runs on the same arrivals, one
process per core (a strategy's run depends only on its inputs, so the rows are the serial
run's). Rows print as JSON as they come, or as a table at the end (``console/sim_table.py``);
Ctrl+C prints the rows done so far and exits 130.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from console.interrupts import deferred, interrupted
from console.sim_table import print_table, terminal_width
from router.config import load_fleet
from router.config.schema import FleetConfig
from router.errors import GpuRouterError
from router.perf.profiles import ProfileCatalog
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

PROG = "gpurouter sim"


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
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="strategies run at once, each in its own process (default: one per core; "
        "the rows are the same whatever N)",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rows: list[dict[str, Any]] = []
    names: list[str] = []
    try:
        job, setup = _prepare(args)
        names = sorted(STRATEGIES) if args.strategy == "all" else [args.strategy]
        for row in _results(job, setup, names, args.jobs):
            with deferred():
                rows.append(row)
                if args.json:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
    except GpuRouterError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    except KeyboardInterrupt:
        _print_table(rows, args, out)
        done = f"{len(rows)} of {len(names)} strategies done" if names else "before any ran"
        return interrupted(PROG, err, done)
    _print_table(rows, args, out)
    return 0


def _print_table(rows: list[dict[str, Any]], args: argparse.Namespace, out: TextIO) -> None:
    if rows and not args.json:
        print_table(rows, args.max_sustainable, out, terminal_width(out))


@dataclass(frozen=True, slots=True)
class _Job:
    """Everything one strategy's row depends on, in plain values: a worker process rebuilds the
    fleet and workload from it and gets the rows the serial run gets."""

    args: argparse.Namespace
    capacities: dict[str, float]
    rate: float
    """Arrivals per second of a plain run (0 for --max-sustainable)."""


@dataclass(frozen=True, slots=True)
class _Setup:
    fleet: FleetConfig
    workload: Workload
    catalog: ProfileCatalog


def _prepare(args: argparse.Namespace) -> tuple[_Job, _Setup]:
    """Check the arguments, read the fleet and measure its capacity (once, for every row)."""
    _check(args)
    setup = _setup(args)
    capacities = fleet_capacity(setup.fleet, setup.workload.mix, setup.catalog, seed=args.seed)
    capacity = sum(capacities.values())
    rate = args.rate if args.rate is not None else (args.load or 0.8) * capacity
    return _Job(args, capacities, 0.0 if args.max_sustainable else rate), setup


def _setup(args: argparse.Namespace) -> _Setup:
    fleet = load_fleet(args.fleet)
    try:
        workload = Workload(
            trace_rows(args.trace), args.arrivals, args.burstiness, args.lengths, args.max_tokens
        )
    except ValueError as exc:
        raise GpuRouterError(str(exc)) from None
    return _Setup(fleet, workload, catalog_for(fleet))


def _results(
    job: _Job, setup: _Setup, names: list[str], jobs: int | None
) -> Iterator[dict[str, Any]]:
    """Each strategy's row, in ``names`` order: in this process, or on ``jobs`` processes."""
    workers = min(len(names), jobs or _cores())
    if workers <= 1:
        for name in names:
            yield _row(job, setup, name)
        return
    yield from _pooled(job, names, workers)


def _pooled(job: _Job, names: list[str], workers: int) -> Iterator[dict[str, Any]]:
    # Workers ignore Ctrl+C (the disposition is inherited before they run any Python):
    # this process reports what is done and ends them.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pool = multiprocessing.get_context("spawn").Pool(
            workers, initializer=_start_worker, initargs=(job,)
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield from pool.imap(_worker_row, names)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


_WORKER: dict[str, tuple[_Job, _Setup]] = {}
"""In a worker process: its job, and the fleet and workload rebuilt from it once."""


def _start_worker(job: _Job) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER["job"] = (job, _setup(job.args))


def _worker_row(name: str) -> dict[str, Any]:
    return _row(*_WORKER["job"], name)


def _row(job: _Job, setup: _Setup, name: str) -> dict[str, Any]:
    args, capacities = job.args, job.capacities
    capacity = sum(capacities.values())
    if not args.max_sustainable:
        result = run_strategy(
            setup.fleet, name, setup.workload, job.rate, args.duration, args.seed, capacities,
            setup.catalog,
        )  # fmt: skip
        return result_dict(result, job.rate, capacity)
    rate, at_max = max_sustainable(
        setup.fleet,
        name,
        setup.workload,
        capacity,
        capacities,
        duration=args.duration,
        seed=args.seed,
        slo_ttft_p99_s=args.slo_ttft,
        steps=args.search_steps,
        catalog=setup.catalog,
    )
    return {
        "strategy": name,
        "max_sustainable_rps": round(rate, 4),
        "max_sustainable_fraction": round(rate / capacity, 4),
        "capacity_rps": round(capacity, 4),
        "slo_ttft_p99_s": args.slo_ttft,
        "at_max": None if at_max is None else result_dict(at_max, rate, capacity),
    }


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
    if args.jobs is not None and args.jobs < 1:
        raise GpuRouterError(f"--jobs must be >= 1, got {args.jobs}")
