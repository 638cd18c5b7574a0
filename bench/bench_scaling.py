"""Requests/s of ``gpurouter serve`` with 1, 2, ... workers on this machine.

    python bench/bench_scaling.py                  # 3 rounds, workers 1 and 2 (about 2 min)
    python bench/bench_scaling.py --quick          # 1 short round
    python bench/bench_scaling.py --workers 1 --workers 2 --workers 4 --workers 8
    python bench/bench_scaling.py --json           # the figures as JSON

The pieces are bench_proxy.py's: the zero-work upstream (a fixed chat completion, or 20 SSE
chunks for ``"stream": true``), the closed-loop raw HTTP load generator (one keep-alive
connection per user, every reply's status and length checked) and the CPU time of the
router's process tree (for ``--workers N``: the supervisor and its workers). The router is
the real command, ``gpurouter serve --workers N --no-telemetry``, on a fleet of
``--replicas`` replicas that all point at the upstream (routers_under_test.py's fleet file).

Every service is started once; each round measures every one at concurrency 32 and 256,
streaming and not, in an order rotated per cell, plus the direct path (load generator to
upstream) as the machine's ceiling. The table gives medians over rounds and each service's
requests/s over one worker's, per round, then the median.

Read it against the machine: the load generator and the upstream run on the same cores as
the workers (``--client-cpus`` pins them, and ``--router-cpus`` the router, with
``sched_setaffinity``; a worker inherits its supervisor's CPUs). With 2 cores, 2 workers and
the client share them; throughput can only grow with workers while a core is left idle.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bench_http_stack as stack
from routers_under_test import (
    Started,
    fleet_yaml,
    front_door_port,
    gpurouter_serve_argv,
    start_process,
)

CONCURRENCIES = (32, 256)
DIRECT = "direct"


@dataclass
class Settings:
    rounds: int
    warmup: float
    duration: float
    cap: int


FULL = Settings(rounds=3, warmup=0.5, duration=2.0, cap=40_000)
QUICK = Settings(rounds=1, warmup=0.2, duration=0.6, cap=10_000)


@dataclass
class Cell:
    samples: list[stack.Sample] = field(default_factory=list)
    base: list[stack.Sample] = field(default_factory=list)
    """One worker's sample of the same round, for the ratio."""


def cpus(text: str | None) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def start_service(workers: int, fleet: Path, workdir: Path, router_cpus: set[int] | None) -> Any:
    log_path = workdir / f"gpurouter-w{workers}.log"
    with log_path.open("wb") as out:
        proc = start_process(gpurouter_serve_argv(fleet, workers), out)
    if router_cpus:  # before its workers start: they inherit it
        os.sched_setaffinity(proc.pid, router_cpus)
    started = Started(proc, log_path)
    try:
        port = front_door_port(log_path, proc)
        stack.probe(port)
    except (OSError, RuntimeError):
        started.stop()
        raise
    return started, port


def measure_all(
    load: stack.LoadGenerator, targets: dict[str, stack.Target], settings: Settings, base: str
) -> dict[tuple[str, int, bool], Cell]:
    cells: dict[tuple[str, int, bool], Cell] = {}
    grid = [(c, s) for c in CONCURRENCIES for s in (False, True)]
    k = 0
    for r in range(settings.rounds):
        stack.log(f"round {r + 1}/{settings.rounds}: load average {os.getloadavg()[0]:.2f}")
        for concurrency, stream in grid:
            samples: dict[str, stack.Sample] = {}
            for name in stack.rotated(list(targets), k):
                samples[name] = sample = load.measure(
                    targets[name], stream, concurrency, settings.warmup, settings.duration,
                    settings.cap,
                )  # fmt: skip
                stack.log(
                    f"  c={concurrency:<3} stream={stream!s:<5} {name:<14} {sample.rps:8,.0f} "
                    f"req/s  p50 {sample.p50_ms:7.2f} ms  CPU {sample.cpu_us_per_request:5.0f} "
                    "us/req" + (f"  ERRORS {sample.errors}" if sample.errors else "")
                )
            for name, sample in samples.items():
                cell = cells.setdefault((name, concurrency, stream), Cell())
                cell.samples.append(sample)
                cell.base.append(samples[base])
            k += 1
    return cells


def summarize(cells: dict[tuple[str, int, bool], Cell]) -> list[dict[str, Any]]:
    med = statistics.median
    rows = []
    for (name, c, s), cell in cells.items():
        rows.append(
            {
                "service": name,
                "concurrency": c,
                "stream": s,
                "rps": med(x.rps for x in cell.samples),
                "rps_vs_one_worker": med(
                    x.rps / b.rps for x, b in zip(cell.samples, cell.base, strict=True)
                ),
                "p50_ms": med(x.p50_ms for x in cell.samples),
                "p99_ms": med(x.p99_ms for x in cell.samples),
                "router_cpu_us_per_request": med(x.cpu_us_per_request for x in cell.samples),
                "errors": sum(x.errors for x in cell.samples),
                "rounds": len(cell.samples),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    rank = {n: i for i, n in enumerate(names)}
    rows = sorted(rows, key=lambda r: (r["concurrency"], r["stream"], rank[r["service"]]))
    lines = [
        "| concurrency | stream | service | req/s | vs 1 worker | p50 ms | p99 ms "
        "| router CPU us/req | errors |",
        "|--:|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        direct = r["service"] == DIRECT
        lines.append(
            f"| {r['concurrency']} | {'yes' if r['stream'] else 'no'} | {r['service']} "
            f"| {r['rps']:,.0f} | {'-' if direct else format(r['rps_vs_one_worker'], '.2f')} "
            f"| {stack.ms(r['p50_ms'])} | {stack.ms(r['p99_ms'])} "
            f"| {'-' if direct else format(r['router_cpu_us_per_request'], '.0f')} "
            f"| {r['errors']} |"
        )
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    if args.rounds:
        settings = Settings(args.rounds, settings.warmup, settings.duration, settings.cap)
    started_at = time.monotonic()
    env = stack.environment()
    client_cpus, router_cpus = cpus(args.client_cpus), cpus(args.router_cpus)
    if client_cpus:  # the upstream and load generator started below inherit it
        os.sched_setaffinity(0, client_cpus)
    workdir = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    children: list[Any] = []
    load: stack.LoadGenerator | None = None
    try:
        upstream = stack.spawn("upstream", "--role", "upstream")
        children.append(upstream)
        upstream.port = stack.read_port(upstream)
        stack.probe(upstream.port)
        model = stack.REQUEST_BODY["model"]
        assert isinstance(model, str)
        fleet = workdir / "fleet.yaml"
        url = f"http://127.0.0.1:{upstream.port}"
        fleet.write_text(fleet_yaml([url] * args.replicas, model))
        targets = {DIRECT: stack.Target(upstream.port)}
        for n in args.workers:
            service, port = start_service(n, fleet, workdir, router_cpus)
            children.append(service)
            targets[f"gpurouter w{n}"] = stack.Target(port, service.proc.pid)
        load = stack.LoadGenerator()
        cells = measure_all(load, targets, settings, f"gpurouter w{args.workers[0]}")
    finally:
        if load is not None:
            load.stop()
        for child in children:
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    env["loadavg_at_end"] = os.getloadavg()
    rows = summarize(cells)
    errors = sum(r["errors"] for r in rows)
    report = {
        "settings": asdict(settings),
        "workers": args.workers,
        "replicas": args.replicas,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "router_cpus": sorted(router_cpus) if router_cpus else None,
        "elapsed_s": round(time.monotonic() - started_at, 1),
        "environment": env,
        "results": rows,
    }
    text = json.dumps(stack._nan_to_none(report), indent=2)
    if args.save:
        Path(args.save).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        pinned = (
            f"; client on CPUs {report['client_cpus']}, router on {report['router_cpus']}"
            if client_cpus or router_cpus
            else "; nothing pinned"
        )
        print(
            f"scaling: {settings.rounds} round(s), {settings.duration} s per measurement after "
            f"{settings.warmup} s warm-up, {report['elapsed_s']:.0f} s in all; "
            f"{env['usable_cpus']} CPUs{pinned}; load average "
            f"{env['loadavg_at_start'][0]:.2f} at start, {env['loadavg_at_end'][0]:.2f} at end\n"
        )
        print(format_table(rows, list(targets)))
    if errors:
        stack.log(f"WARNING: {errors} replies were wrong (status or length)")
    return 1 if errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument(
        "--workers", type=int, action="append", help="gpurouter --workers (default: 1 and 2)"
    )
    parser.add_argument("--replicas", type=int, default=4, help="replicas in the fleet file")
    parser.add_argument("--client-cpus", help="CPUs of the load generator and upstream: 0,1")
    parser.add_argument("--router-cpus", help="CPUs of the router's processes: 2,3")
    args = parser.parse_args()
    args.workers = args.workers or [1, 2]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        return orchestrate(args)
    return 130


if __name__ == "__main__":
    sys.exit(main())
