"""Adaptive batch sizes live on the emulator, for clients that stream and clients that do not.

A non-streamed answer's first byte is the whole answer. Taken for a time to first token, it
cut the batch sizes of engines that queued nothing (tests/test_first_token.py). This bench
runs, one after another in one run, four cases on a fleet nobody tuned (every weight 1, every
batch size 256) at one load with the default strategy, each with a fresh emulator and router:
static batch sizes or the tuner on (``router.adaptive.batch_sizes``), clients streaming or
not. Per case it prints the share of the window's arrivals completed, the clients' end-to-end
p50 and p99 and, when streamed, their first byte's p99, the tuner's batch-size changes and the
fleet's batch sizes summed at the end; then, per kind of client, tuner on over static.

    python bench/bench_tuner_clients.py [--fleet untuned-four-generations.yaml] [--load 0.8]

The emulator runs ``--slowdown`` times slower than real time (2: this machine's two cores keep
up); times are printed in emulated seconds. Load is bounded: one schedule of ``--duration``
emulated seconds per case, then at most ``--drain`` for the answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection
from typing import Any

from bench_live_strategies import (
    FLEETS,
    WARMUP_SHARE,
    _emulator_process,
    _pct,
    _pointed_at,
    _recv,
    scaled,
    stop_children,
)

from router.adaptive import TunerChange
from router.config import load_fleet
from router.config.schema import FleetConfig
from router.core import CoreListener
from router.sim.runner import Workload, fleet_capacity, trace_rows

CASES = (("static", False), ("tuner on", False), ("static", True), ("tuner on", True))
"""(batch sizes, streamed) in the order they run."""


def _loadgen_process(args: dict[str, Any], conn: Connection) -> None:
    conn.send(asyncio.run(_drive(args)))


async def _drive(a: dict[str, Any]) -> list[tuple[float, float | None, float | None, str]]:
    from router.loadgen import LoadGenerator, RatePhase, schedule

    mix = Workload(trace_rows(a["trace"])).mix
    shots = schedule([RatePhase(a["duration"], a["rate"], mix)], a["seed"])
    scale = a["time_scale"]
    timeout = (a["duration"] + a["drain"]) / scale + 60.0
    gen = LoadGenerator(
        a["url"], a["model"], max_in_flight=4096, stream=a["stream"], timeout_s=timeout
    )
    report = await gen.run(
        shots,
        max_requests=int(a["rate"] * a["duration"] * 2 + 100),
        max_duration_s=a["duration"] / scale,
        drain_s=a["drain"] / scale,
        time_scale=scale,
    )
    return [(r.shot.at_s, r.first_byte_s, r.latency_s, r.outcome) for r in report.results]


def _fleet(fleet: FleetConfig, tuner: bool, slowdown: float) -> FleetConfig:
    adaptive = dataclasses.replace(fleet.router.adaptive, batch_sizes=tuner)
    router = scaled(dataclasses.replace(fleet.router, adaptive=adaptive), slowdown)
    return dataclasses.replace(fleet, router=router)


async def one_case(
    args: argparse.Namespace, tuner: bool, stream: bool, rate: float
) -> dict[str, Any]:
    from router.http.server import RouterServer

    ctx = mp.get_context("spawn")
    loop = asyncio.get_running_loop()
    n = args.slowdown
    path = FLEETS / args.fleet
    emu_conn, emu_child = ctx.Pipe()
    emulator = ctx.Process(
        target=_emulator_process, args=(str(path), 1.0 / n, args.seed, emu_child), daemon=True
    )
    emulator.start()
    server: RouterServer | None = None
    loadgen: Any = None
    changes: list[str] = []
    try:
        urls = await _recv(loop, emu_conn, 60.0)
        config = _fleet(_pointed_at(load_fleet(path), urls), tuner, n)
        server = RouterServer(config, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
        await server.start()
        server.core.listeners.append(_Changes(changes))
        plan = {
            "url": server.front_url,
            "model": config.model or config.replicas[0].model,
            "trace": args.trace,
            "rate": rate,
            "duration": args.duration,
            "drain": args.drain,
            "seed": args.seed,
            "time_scale": 1.0 / n,
            "stream": stream,
        }
        gen_conn, gen_child = ctx.Pipe()
        loadgen = ctx.Process(target=_loadgen_process, args=(plan, gen_child), daemon=True)
        loadgen.start()
        emu_conn.send("measure")
        rows = await _recv(loop, gen_conn, (args.duration + args.drain) * n + 120.0)
        batch_sum = sum(r.batch_size for r in server.core.pool)
        emu_conn.send("stop")
        await _recv(loop, emu_conn, 30.0)
    finally:
        if server is not None:
            await server.stop(0.0)
        stop_children(loadgen, emulator)
    return _summary(rows, args, tuner, stream, changes, batch_sum)


class _Changes(CoreListener):
    """Collects the tuner's batch-size changes."""

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def on_tune(self, changes: list[TunerChange]) -> None:
        self.into.extend(c.message for c in changes if c.setting == "batch_size")


def _summary(
    rows: list[tuple[float, float | None, float | None, str]],
    args: argparse.Namespace,
    tuner: bool,
    stream: bool,
    changes: list[str],
    batch_sum: int,
) -> dict[str, Any]:
    n = args.slowdown
    start = WARMUP_SHARE * args.duration
    window = [r for r in rows if r[0] > start and r[3] != "not_sent"]
    done = [r for r in window if r[3] == "completed" and r[2] is not None]
    e2e = [r[2] / n for r in done if r[2] is not None]
    first = [r[1] / n for r in done if r[1] is not None]
    return {
        "batch sizes": "tuner on" if tuner else "static",
        "clients": "streamed" if stream else "not streamed",
        "arrived": len(window),
        "completed": len(done) / len(window) if window else 0.0,
        "e2e_p50_s": _pct(e2e, 0.5),
        "e2e_p99_s": _pct(e2e, 0.99),
        "first_byte_p99_s": _pct(first, 0.99) if stream else None,
        "batch_changes": len(changes),
        "first_change": changes[0] if changes else "",
        "batch_sum_at_end": batch_sum,
    }


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_table(rows: list[dict[str, Any]], fleet: str, load: float, wall_s: float) -> None:
    print(f"examples/fleets/{fleet}, default strategy, load {load}, emulated seconds")
    print(
        f"{'batch sizes':<11} {'clients':<13} {'arrived':>7} {'done':>6} {'e2e p50':>8} "
        f"{'e2e p99':>8} {'1st p99':>8} {'changes':>8} {'sizes at end':>12}"
    )
    for r in rows:
        print(
            f"{r['batch sizes']:<11} {r['clients']:<13} {r['arrived']:>7} {r['completed']:>6.3f} "
            f"{_f(r['e2e_p50_s']):>8} {_f(r['e2e_p99_s']):>8} {_f(r['first_byte_p99_s']):>8} "
            f"{r['batch_changes']:>8} {r['batch_sum_at_end']:>12}"
        )
    for clients in ("not streamed", "streamed"):
        on, off = (
            next(r for r in rows if r["clients"] == clients and r["batch sizes"] == b)
            for b in ("tuner on", "static")
        )
        if on["e2e_p99_s"] and off["e2e_p99_s"]:
            print(
                f"{clients}: tuner on / static, e2e p99 {on['e2e_p99_s'] / off['e2e_p99_s']:.2f}, "
                f"completed {on['completed'] / max(off['completed'], 1e-9):.3f}"
            )
    for r in rows:
        if r["first_change"]:
            print(f"first change, {r['batch sizes']}, {r['clients']}: {r['first_change']}")
    print(f"({wall_s:.0f} s; load average {os.getloadavg()[0]:.2f} at end)")


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    fleet = load_fleet(FLEETS / args.fleet)
    capacity = sum(
        fleet_capacity(fleet, Workload(trace_rows(args.trace)).mix, seed=args.seed).values()
    )
    rows = []
    for batches, stream in CASES:
        row = await one_case(args, batches == "tuner on", stream, args.load * capacity)
        print(f"  {row['batch sizes']}, {row['clients']}: done {row['completed']:.3f}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--fleet", default="untuned-four-generations.yaml", help="under examples/fleets")
    p.add_argument("--load", type=float, default=0.8, help="fraction of capacity (0.8)")
    p.add_argument("--trace", default="conv", choices=("conv", "code"), help="length mix (conv)")
    p.add_argument("--slowdown", type=float, default=2.0, help="emulator N times slower (2)")
    p.add_argument("--duration", type=float, default=60.0, help="emulated s of load a case (60)")
    p.add_argument("--drain", type=float, default=30.0, help="emulated s for answers after (30)")
    p.add_argument("--seed", type=int, default=1, help="seed (1)")
    args = p.parse_args()
    if not (args.load > 0 and args.slowdown > 0 and args.duration > 0 and args.drain >= 0):
        p.error("--load, --slowdown and --duration must be > 0, --drain >= 0")
    t0 = time.perf_counter()
    rows = asyncio.run(main_async(args))
    with contextlib.suppress(BrokenPipeError):
        print_table(rows, args.fleet, args.load, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
