"""Strategies live: the real router in front of an emulated fleet, over loopback HTTP.

    python bench/bench_live_strategies.py --load 0.8                  # one run per strategy
    python bench/bench_live_strategies.py --max-sustainable --steps 3 # bisection over load
    python bench/bench_live_strategies.py --strategy round-robin --duration 60 --json
    python bench/bench_live_strategies.py --from-json run.json        # tables of a saved run
    python bench/bench_live_strategies.py --agreement --strategy all  # live against simulator
    python bench/bench_live_strategies.py --strategy shortest-expected-delay --strategy oracle

Three processes on this machine's loopback: the emulated fleet (router.emulator's
EmulatedFleet, every replica of the fleet file on a free port), the router (RouterServer:
front door, core, upstream pool) and the open-loop load generator (router.loadgen), each
with its own event loop, so that what is measured is the router, not a process starved by
the other two. Every request streams, so the first byte is the first token (TTFT).

The emulator runs ``--slowdown`` N times slower than life (time scale 1/N): a fleet of
capacity C req/s serves C/N a wall second, the load generator sends N times slower, and the
router's own timers (queue deadline, health checks, timeouts, retry backoff, tuner interval)
are N times longer, so a run has the shape of a run at full speed on a machine that could
carry it. Every time below is emulated (wall seconds divided by N); ``--duration`` is
emulated seconds, the first fifth warm-up, as in the simulator.

capacity_rps is the simulator's (router.sim.runner.fleet_capacity on the trace's mix): the
sum of what each replica sustains alone. Per strategy: offered and completed req/s in the
steady window, completed / capacity, p50/p99 TTFT of the requests that reached the router in
the window (measured in the router, arrival to the replica's first byte, so that a request
cut off at the end of the run counts too: one that never got its first token is unbounded;
the client's p99 over what it saw is kept in the JSON as a check), requests completed per
replica (router accounting) and the mean requests in flight per GPU model. A load is
sustainable when p99 TTFT <= 2 s and completions keep up with arrivals (95%), as in the
simulator.

The machine has to keep up, or the figures are the machine's. Three checks, each printed:
the load generator's lateness (send time behind schedule, p99) and the router loop's lag
(p99 oversleep of a 50 ms ticker), each at most 0.1 emulated s (5% of the TTFT SLO), and
the emulator's clock (engine time over wall time x time scale, lowest replica: under 0.97
its steps ran late, and the cards looked slower than they are). A run that fails one is
marked BEHIND (and a search stops there); raise --slowdown until none is.

``--strategy oracle`` is the simulator bench's reference (bench/bench_learned_capacity.py):
weighted round-robin with every replica's weight set to its true capacity on the trace's mix
(capacity_rps_by_replica), the static split an operator who knew every card would write.
Its p99 TTFT beside the default strategy's, in the same run, is issue 13's ratio at load 0.8.

Learned capacity is read every ``--capacity-every`` emulated seconds from ``--capacity-after``
on, as bench/bench_capacity_accuracy.py reads it in the simulator: per replica, learned over
true at the first reading and at the end, its lowest and highest, and the largest move from
one reading to the next (issue 13: within 10% after 60 s at load 0.5, moving at most 5%).

``--agreement`` asks whether the simulator predicts the live router: per strategy, the
simulator's max sustainable load (its bisection over 0-1.2 of capacity, ``--sim-steps``
steps, the same duration, seed and arrivals), then two live runs at 0.9 and 1.1 times it.
Sustained at 0.9 and not at 1.1 means the live figure is within 10% of the simulator's.
The live router draws (random splits, p2c's candidates) from ``--seed``, as the simulator's
router does, so that a random split is judged on the draw the simulator made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench_learned_capacity import with_weights

from router.config import load_fleet
from router.config.schema import FleetConfig, RouterConfig
from router.sim.runner import Workload, fleet_capacity, trace_rows
from router.sim.runner import max_sustainable as sim_max_sustainable
from router.strategies import STRATEGIES

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"
DEFAULT_FLEET = "untuned-four-generations.yaml"
DEFAULT_STRATEGIES = (
    "weighted-least-connections",
    "least-connections",
    "shortest-expected-delay",
    "p2c-peak-ewma",
    "round-robin",
    "capacity-aware",
)
WARMUP_SHARE = 0.2
SLO_TTFT_P99_S = 2.0
KEEP_UP = 0.95
LATE_P99_S = 0.1
"""Load generator behind schedule by more than this (emulated s, p99): it fell behind."""
LOOP_LAG_P99_S = 0.1
"""Router loop oversleeping by more than this (emulated s, p99): the router was starved."""
AGREEMENT = (0.9, 1.1)
"""Live loads for --agreement, as multiples of the simulator's max sustainable load."""
ENGINE_CLOCK_MIN = 0.97
"""Emulator engine time below this share of wall time x time scale: its steps ran late."""
ORACLE = "oracle"
"""Not a strategy: weighted round-robin with every weight at the replica's true capacity."""


# ---- the emulated fleet, in its own process -------------------------------------------------


def _pointed_at(fleet: FleetConfig, urls: Mapping[str, str]) -> FleetConfig:
    nodes = tuple(
        dataclasses.replace(
            node,
            replicas=tuple(
                dataclasses.replace(r, endpoint=urls.get(r.id, r.endpoint)) for r in node.replicas
            ),
        )
        for node in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


def _emulator_process(path: str, time_scale: float, seed: int, conn: Connection) -> None:
    asyncio.run(_emulate(path, time_scale, seed, conn))


async def _emulate(path: str, time_scale: float, seed: int, conn: Connection) -> None:
    from router.emulator import EmulatedFleet

    fleet = load_fleet(path)
    loopback = _pointed_at(fleet, {r.id: "http://127.0.0.1:1" for r in fleet.replicas})
    emulated = EmulatedFleet(
        loopback, time_scale=time_scale, seed=seed, ports={r.id: 0 for r in fleet.replicas}
    )
    loop = asyncio.get_running_loop()
    await emulated.start()
    try:
        conn.send({rid: r.url for rid, r in emulated.replicas.items()})
        await loop.run_in_executor(None, conn.recv)  # "measure"
        wall0 = loop.time()
        engine0 = {rid: r.driver.now() for rid, r in emulated.replicas.items()}
        await loop.run_in_executor(None, conn.recv)  # "stop"
        wall = (loop.time() - wall0) * time_scale
        share = {
            rid: (r.driver.now() - engine0[rid]) / wall if wall > 0 else 1.0
            for rid, r in emulated.replicas.items()
        }
        conn.send(share)
    finally:
        await emulated.stop()


# ---- the load generator, in its own process ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    url: str
    model: str
    trace: str
    rate_rps: float
    """Emulated requests per second."""
    duration_s: float
    """Emulated seconds."""
    burstiness: float
    seed: int
    time_scale: float
    drain_s: float
    """Emulated seconds to wait for answers after the last shot."""
    max_requests: int


def _loadgen_process(plan: LoadPlan, conn: Connection) -> None:
    conn.send(asyncio.run(_drive(plan, conn)))


async def _drive(plan: LoadPlan, conn: Connection) -> dict[str, Any]:
    from router.loadgen import LoadGenerator, RatePhase, schedule

    mix = Workload(trace_rows(plan.trace)).mix
    shots = list(
        schedule([RatePhase(plan.duration_s, plan.rate_rps, mix, plan.burstiness)], plan.seed)
    )
    # The drain ends a run, not the client's timeout.
    timeout = (plan.duration_s + plan.drain_s) / plan.time_scale + 60.0
    generator = LoadGenerator(
        plan.url, plan.model, max_in_flight=4096, stream=True, timeout_s=timeout
    )
    conn.send(len(shots))  # ready
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # go
    report = await generator.run(
        shots,
        max_requests=plan.max_requests,
        max_duration_s=plan.duration_s / plan.time_scale,
        drain_s=plan.drain_s / plan.time_scale,
        time_scale=plan.time_scale,
    )
    rows = [
        (r.shot.at_s, r.sent_at, r.first_byte_s, r.latency_s, r.outcome) for r in report.results
    ]
    return {"rows": rows, "counts": dict(report.counts)}


# ---- the router, in this process -------------------------------------------------------------


def scaled(router: RouterConfig, slowdown: float) -> RouterConfig:
    """The router's timers ``slowdown`` times longer (the fleet runs that much slower)."""
    if slowdown == 1.0:
        return router
    h, q, t, r, a = router.health, router.queue, router.timeouts, router.retries, router.adaptive
    n = slowdown
    return dataclasses.replace(
        router,
        queue=dataclasses.replace(q, default_deadline_s=q.default_deadline_s * n),
        health=dataclasses.replace(
            h,
            check_interval_s=h.check_interval_s * n,
            eject_base_s=h.eject_base_s * n,
            eject_max_s=h.eject_max_s * n,
            # A step lasts n times longer: so may a working replica's silence, and its
            # probe's one token. Never shorter than configured: the machine is no faster.
            stream_idle_max_s=h.stream_idle_max_s * max(n, 1.0),
            check_timeout_s=h.check_timeout_s * max(n, 1.0),
        ),
        timeouts=dataclasses.replace(t, first_byte_s=t.first_byte_s * n, total_s=t.total_s * n),
        retries=dataclasses.replace(
            r, backoff_s=r.backoff_s * n, backoff_max_s=r.backoff_max_s * n
        ),
        adaptive=dataclasses.replace(a, interval_s=a.interval_s * n),
    )


class Sampler:
    """Every ``period`` wall seconds: the loop's oversleep and each replica's in-flight count."""

    def __init__(self, core: Any, period: float = 0.05, every: int = 20) -> None:
        self.core = core
        self.period = period
        self.every = every
        self.lags: list[float] = []
        self.in_flight: dict[str, list[int]] = defaultdict(list)
        self.recording = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        i = 0
        while True:
            t = loop.time()
            await asyncio.sleep(self.period)
            if not self.recording:
                continue
            self.lags.append(max(0.0, loop.time() - t - self.period))
            i += 1
            if i % self.every == 0:
                for r in self.core.snapshot().replicas:
                    self.in_flight[r.id].append(int(r.in_flight))


class CapacityReadings:
    """Learned capacity of every replica (emulated req/s), every ``every_s`` emulated seconds
    from ``after_s`` after the load began until it ends (the drain's falling load is not the
    steady load the readings are about)."""

    def __init__(
        self, core: Any, slowdown: float, after_s: float, every_s: float, until_s: float
    ) -> None:
        self.core, self.slowdown = core, slowdown
        self.after_s, self.every_s, self.until_s = after_s, every_s, until_s
        self.rps: dict[str, list[float]] = defaultdict(list)

    async def run(self) -> None:
        t = self.after_s
        await asyncio.sleep(t * self.slowdown)
        while t <= self.until_s:
            for rid, v in learned_capacity(self.core, self.slowdown).items():
                self.rps[rid].append(v["rps"])
            await asyncio.sleep(self.every_s * self.slowdown)
            t += self.every_s

    def to_dict(self) -> dict[str, Any]:
        return {"after_s": self.after_s, "every_s": self.every_s, "rps": dict(self.rps)}


class FirstTokens:
    """Router-side TTFT of every request: its arrival at the front door to the replica's first
    byte (the first token: every request streams), or none for one that never got it.

    Measured in the router, so that a request the load generator cuts off at the end of a
    run still counts by what happened to it: streaming already (its TTFT is known) or still
    waiting (unbounded). Attached as one more of the core's listeners.
    """

    def __init__(self) -> None:
        self.attempts: dict[str, Any] = {}
        self.finished: list[tuple[float, float | None, str]] = []
        """(arrival, TTFT or None, outcome), router clock."""
        self.where: list[tuple[str, float]] = []
        """Per finished request, as ``finished``: the GPU model of its last attempt's replica
        ("" for none) and how long it waited in the router's queue before that attempt."""
        self.reasons: Counter[str] = Counter()
        """Why the requests that did not complete ended (the replica id taken out)."""

    def listener(self) -> Any:
        from router.core import CoreListener

        tracker = self

        class _Listener(CoreListener):
            def on_assign(self, assignment: Any) -> None:
                tracker.attempts[assignment.request.id] = assignment

            def on_finish(self, finished: Any) -> None:
                req = finished.request
                a = tracker.attempts.pop(req.id, None)
                first = None if a is None else a.first_byte
                ttft = None if first is None else first - req.arrival
                tracker.finished.append((req.arrival, ttft, str(finished.outcome)))
                gpu = "" if a is None else a.replica.config.gpu_model
                wait = math.inf if a is None else a.started - req.arrival
                tracker.where.append((gpu, wait))
                if finished.reason and str(finished.outcome) != "completed":
                    tracker.reasons[_reason_kind(finished.reason)] += 1

        return _Listener()


def completed_by_replica(core: Any) -> dict[str, int]:
    return {r.id: int(r.completed) for r in core.snapshot().replicas}


async def one_run(
    fleet_path: Path,
    fleet: FleetConfig,
    strategy: str,
    load: float,
    capacity: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    from router.http.server import RouterServer

    ctx = mp.get_context("spawn")
    n = args.slowdown
    scale = 1.0 / n
    loop = asyncio.get_running_loop()
    emu_conn, emu_child = ctx.Pipe()
    emulator = ctx.Process(
        target=_emulator_process, args=(str(fleet_path), scale, args.seed, emu_child), daemon=True
    )
    emulator.start()
    server: RouterServer | None = None
    loadgen: Any = None
    sampler_task: asyncio.Task[None] | None = None
    reader_task: asyncio.Task[None] | None = None
    t_start = time.perf_counter()
    try:
        urls = await _recv(loop, emu_conn, 60.0)
        config = _pointed_at(fleet, urls)
        config = dataclasses.replace(config, router=scaled(config.router, n))
        # The router draws (random splits, p2c's candidates) from the seed the simulator's
        # router uses, so that a random split draws the same cards for the same arrivals in
        # both: its limit turns on which card draws the long requests, and an unseeded live
        # draw is one of many against the simulator's one.
        server = RouterServer(
            config,
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            rng=random.Random(args.seed),
        )
        await server.start()
        server.core.set_strategy(strategy, {})
        model = config.model or config.replicas[0].model
        rate = load * capacity
        plan = LoadPlan(
            server.front_url,
            model,
            args.trace,
            rate,
            args.duration,
            args.burstiness,
            args.seed,
            scale,
            args.drain,
            int(rate * args.duration * 2 + 100),
        )
        gen_conn, gen_child = ctx.Pipe()
        loadgen = ctx.Process(target=_loadgen_process, args=(plan, gen_child), daemon=True)
        loadgen.start()
        shots = await _recv(loop, gen_conn, 60.0)
        sampler = Sampler(server.core)
        sampler_task = asyncio.create_task(sampler.run())
        first_tokens = FirstTokens()
        server.core.listeners.append(first_tokens.listener())
        before = completed_by_replica(server.core)
        emu_conn.send("measure")
        t_go = server.core.clock()
        gen_conn.send("go")
        sampler.recording = True
        readings = CapacityReadings(
            server.core, n, args.capacity_after, args.capacity_every, args.duration
        )
        if args.capacity_every > 0:
            reader_task = asyncio.create_task(readings.run())
        wall_budget = (args.duration + args.drain) * n + 60.0
        result = await _recv(loop, gen_conn, wall_budget)
        sampler.recording = False
        after = completed_by_replica(server.core)
        learned = learned_capacity(server.core, n)
        # The generator has cut off what was left; let the router settle those requests.
        for _ in range(50):
            if not server.core.running and len(server.core.queue) == 0:
                break
            await asyncio.sleep(0.1)
        unsettled = len(server.core.running) + len(server.core.queue)
        emu_conn.send("stop")
        clock_share = await _recv(loop, emu_conn, 30.0)
    finally:
        for task in (sampler_task, reader_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if server is not None:
            await server.stop(0.0)
        stop_children(loadgen, emulator)
    in_window = [
        (math.inf if ttft is None else ttft / n, gpu, wait / n)
        for (arrival, ttft, _outcome), (gpu, wait) in zip(
            first_tokens.finished, first_tokens.where, strict=True
        )
        if WARMUP_SHARE * args.duration < (arrival - t_go) / n <= args.duration
    ]
    router_ttfts = [ttft for ttft, _gpu, _wait in in_window]
    row = summarise(
        result,
        shots,
        strategy,
        load,
        capacity,
        args,
        config,
        {rid: after[rid] - before.get(rid, 0) for rid in after},
        sampler,
        clock_share,
        router_ttfts,
    )
    row["wall_s"] = round(time.perf_counter() - t_start, 1)
    row["unsettled_at_end"] = unsettled
    row["learned_capacity"] = learned
    row["learned_capacity_readings"] = readings.to_dict()
    row.update(ttft_breakdown(in_window))
    row["not_completed_reasons"] = dict(first_tokens.reasons.most_common(8))
    return row


def _reason_kind(reason: str) -> str:
    """A reason without the replica's id, so that the same cause on two replicas counts once."""
    head, sep, tail = reason.partition(": ")
    return tail if sep and " " not in head else reason


def ttft_breakdown(in_window: Sequence[tuple[float, str, float]]) -> dict[str, Any]:
    """Where the slow first tokens were: p99 TTFT by the GPU model that served them, and the
    p99 of the wait in the router's own queue (the rest of a TTFT is the replica's)."""
    by_gpu: dict[str, list[float]] = defaultdict(list)
    for ttft, gpu, _wait in in_window:
        by_gpu[gpu or "none"].append(ttft)
    return {
        "ttft_p99_by_gpu_model": {k: _num(_pct(v, 0.99)) for k, v in sorted(by_gpu.items())},
        "router_wait_p99_s": _num(_pct([w for _t, _g, w in in_window], 0.99)),
    }


def learned_capacity(core: Any, slowdown: float) -> dict[str, Any]:
    """What the router learned of each replica when the load ended (emulated req/s: wall
    figures times the slowdown), with the source, if this router learns capacity at all."""
    out: dict[str, Any] = {}
    for r in core.snapshot().replicas:
        rps = getattr(r, "capacity_rps", None)
        if rps is not None:
            out[r.id] = {"rps": round(rps * slowdown, 4), "source": r.capacity_source}
    return out


def stop_children(*procs: Any) -> None:
    """Wait for each child process that was started (each ends once its pipe says so), and
    stop any that does not end in time."""
    for proc in procs:
        if proc is not None:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)


async def _recv(loop: asyncio.AbstractEventLoop, conn: Connection, timeout: float) -> Any:
    def wait() -> Any:
        if not conn.poll(timeout):
            raise TimeoutError(f"no answer from a child process within {timeout:.0f} s")
        return conn.recv()

    return await loop.run_in_executor(None, wait)


# ---- figures -------------------------------------------------------------------------------


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summarise(
    result: Mapping[str, Any],
    shots: int,
    strategy: str,
    load: float,
    capacity: float,
    args: argparse.Namespace,
    config: FleetConfig,
    per_replica: Mapping[str, int],
    sampler: Sampler,
    clock_share: Mapping[str, float],
    router_ttfts: Sequence[float],
) -> dict[str, Any]:
    n = args.slowdown
    d = args.duration
    start = WARMUP_SHARE * d
    window = d - start
    rows = result["rows"]
    # Emulated times: the schedule's own for arrivals, wall x 1/n for the rest.
    arrived = [r for r in rows if r[0] > start and r[4] != "not_sent"]
    # The client's view, for the requests whose first byte it saw (a cut-off one it never
    # learns about): a check on the router's own figures, which take every request.
    client = [first / n for _at, _sent, first, _lat, _outcome in arrived if first is not None]
    done_in_window = 0
    for _at, sent, _first, lat, outcome in rows:
        if outcome == "completed" and lat is not None:
            end = (sent + lat) / n
            if start < end <= d:
                done_in_window += 1
    # A cut-off shot's time is when it was cut off, a not-sent one's when it was skipped.
    late = [
        max(0.0, sent - at_s * n)
        for at_s, sent, _first, _lat, outcome in rows
        if outcome not in ("cut_off", "not_sent")
    ]
    offered = len(arrived) / window
    completed = done_in_window / window
    p99 = _pct(router_ttfts, 0.99)
    gpu = {r.id: r.gpu_model for r in config.replicas}
    by_model: dict[str, list[float]] = defaultdict(list)
    for rid, xs in sampler.in_flight.items():
        if xs:
            by_model[gpu[rid]].append(sum(xs) / len(xs))
    late_p99 = (_pct(late, 0.99) or 0.0) / n
    lag_p99 = (_pct(sampler.lags, 0.99) or 0.0) / n
    clock_min = min(clock_share.values()) if clock_share else 1.0
    behind = []
    if late_p99 > LATE_P99_S:
        behind.append(f"load generator {late_p99:.2f} s late (p99)")
    if result["counts"].get("not_sent"):
        behind.append(f"{result['counts']['not_sent']} shots not sent")
    if lag_p99 > LOOP_LAG_P99_S:
        behind.append(f"router loop lag {lag_p99:.2f} s (p99)")
    if clock_min < ENGINE_CLOCK_MIN:
        behind.append(f"emulator clock {clock_min:.2f} of wall time")
    return {
        "strategy": strategy,
        "load": load,
        "shots": shots,
        "offered_rps": round(offered, 3),
        "completed_rps": round(completed, 3),
        "capacity_rps": round(capacity, 3),
        "completed_over_capacity": round(completed / capacity, 4),
        "kept_up": round(completed / offered, 4) if offered else None,
        "ttft_p50_s": _num(_pct(router_ttfts, 0.5)),
        "ttft_p99_s": _num(p99),
        "requests_in_window": len(router_ttfts),
        "never_first_token": sum(math.isinf(x) for x in router_ttfts),
        "client_ttft_p99_s_seen": _num(_pct(client, 0.99)),
        "client_first_byte_unseen": len(arrived) - len(client),
        "outcomes": result["counts"],
        "completed_by_replica": dict(per_replica),
        "mean_in_flight_by_gpu_model": {k: round(sum(v) / len(v), 1) for k, v in by_model.items()},
        "checks": {
            "loadgen_late_p99_s": round(late_p99, 3),
            "router_loop_lag_p99_s": round(lag_p99, 3),
            "emulator_clock_min": round(clock_min, 3),
        },
        "behind": behind,
        "sustainable": bool(
            not behind
            and p99 is not None
            and p99 <= SLO_TTFT_P99_S
            and offered > 0
            and completed / offered >= KEEP_UP
        ),
    }


def _num(x: float | None) -> float | None:
    if x is None or math.isinf(x):
        return None
    return round(x, 3)


async def max_sustainable(
    fleet_path: Path, fleet: FleetConfig, strategy: str, capacity: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Bisection on the load between --lo and --hi: the highest sustainable load found."""
    lo, hi = args.lo, args.hi
    best: dict[str, Any] | None = None
    tried = []
    for _ in range(args.steps):
        mid = (lo + hi) / 2
        run = await one_run(fleet_path, fleet, strategy, mid, capacity, args)
        tried.append(run)
        _progress(run)
        if run["behind"]:
            break  # the machine, not the strategy, set this limit
        if run["sustainable"]:
            lo, best = mid, run
        else:
            hi = mid
    return {
        "strategy": strategy,
        "max_sustainable_fraction": round(lo, 4) if best is not None else None,
        "at_max": best,
        "runs": tried,
        "behind": any(r["behind"] for r in tried),
    }


def _progress(row: Mapping[str, Any]) -> None:
    print(
        f"  {row['strategy']} load {row['load']:.3f}: completed/capacity "
        f"{row['completed_over_capacity']:.3f}, p99 TTFT {_f(row['ttft_p99_s'])} "
        f"({row['wall_s']:.0f} s){' BEHIND: ' + '; '.join(row['behind']) if row['behind'] else ''}",
        file=sys.stderr,
        flush=True,
    )


def _f(x: object, fmt: str = "{:.2f}", none: str = "unbounded") -> str:
    if x is None:
        return none
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def _per_replica(row: Mapping[str, Any]) -> str:
    return " ".join(f"{rid} {n}" for rid, n in row["completed_by_replica"].items())


def print_load(report: Mapping[str, Any]) -> None:
    print(
        f"{'strategy':<27} {'offered':>7} {'done':>6} {'done/cap':>8} {'ttft p50':>8} "
        f"{'ttft p99':>9}  in flight by GPU model; BEHIND if the machine fell behind"
    )
    for r in report["rows"]:
        flight = " ".join(
            f"{k.split('-')[0]} {v:.0f}" for k, v in r["mean_in_flight_by_gpu_model"].items()
        )
        print(
            f"{r['strategy']:<27} {r['offered_rps']:>7.2f} {r['completed_rps']:>6.2f} "
            f"{r['completed_over_capacity']:>8.3f} {_f(r['ttft_p50_s']):>8} "
            f"{_f(r['ttft_p99_s']):>9}  {flight}"
            f"{'  BEHIND: ' + '; '.join(r['behind']) if r['behind'] else ''}"
        )
    print("requests completed per replica (router accounting, whole run):")
    for r in report["rows"]:
        print(f"  {r['strategy']:<27} {_per_replica(r)}")
    if any("ttft_p99_by_gpu_model" in r for r in report["rows"]):
        print("p99 TTFT by the GPU model that served the request; p99 wait in the router's queue:")
        for r in report["rows"]:
            by_gpu = " ".join(
                f"{k.split('-')[0]} {_f(v)}" for k, v in r.get("ttft_p99_by_gpu_model", {}).items()
            )
            print(f"  {r['strategy']:<27} {by_gpu}; router wait {_f(r.get('router_wait_p99_s'))}")
    true = report.get("capacity_rps_by_replica") or {}
    if any(r.get("learned_capacity") for r in report["rows"]) and true:
        print("learned capacity at the end of the load / true (emulated req/s; source):")
        for r in report["rows"]:
            cells = " ".join(
                f"{rid} {v['rps'] / true[rid]:.2f}{v['source'][0]}"
                for rid, v in r.get("learned_capacity", {}).items()
                if rid in true and true[rid] > 0
            )
            print(f"  {r['strategy']:<27} {cells}")
        print("  (ratio learned/true; p prior, m measured, o operator)")
        print_capacity_readings(report["rows"], true)
    print(
        "machine checks (load generator late p99, router loop lag p99, emulated s; emulator clock):"
    )
    for r in report["rows"]:
        c = r["checks"]
        print(
            f"  {r['strategy']:<27} {c['loadgen_late_p99_s']:.3f} {c['router_loop_lag_p99_s']:.3f} "
            f"{c['emulator_clock_min']:.3f}  ({r['wall_s']:.0f} s wall)"
        )


def print_capacity_readings(rows: Sequence[Mapping[str, Any]], true: Mapping[str, float]) -> None:
    """Per run and replica: learned over true at the first reading and the last, the lowest
    and highest, and the largest move between two readings."""
    for r in rows:
        readings = r.get("learned_capacity_readings") or {}
        by_replica = {k: v for k, v in readings.get("rps", {}).items() if v and true.get(k)}
        if not by_replica:
            continue
        print(
            f"  {r['strategy']}: read every {readings['every_s']:g} s from "
            f"{readings['after_s']:g} s (first, last, lowest-highest over true; largest move):"
        )
        for rid, values in by_replica.items():
            ratios = [v / true[rid] for v in values]
            moves = [abs(b - a) / a for a, b in itertools.pairwise(values) if a > 0]
            print(
                f"    {rid:<10} {ratios[0]:.3f} {ratios[-1]:.3f} "
                f"{min(ratios):.3f}-{max(ratios):.3f} {max(moves, default=0.0):.3f}"
                f"  ({len(values)} readings)"
            )


def print_search(report: Mapping[str, Any]) -> None:
    print(f"{'strategy':<27} {'max frac':>8} {'done/cap':>8} {'ttft p99':>9}  loads tried")
    for s in report["rows"]:
        at = s["at_max"] or {}
        tried = ", ".join(
            f"{r['load']:.3f}{'ok' if r['sustainable'] else 'x'}{'!' if r['behind'] else ''}"
            for r in s["runs"]
        )
        print(
            f"{s['strategy']:<27} {_f(s['max_sustainable_fraction'], '{:.3f}', '-'):>8} "
            f"{_f(at.get('completed_over_capacity'), '{:.3f}', '-'):>8} "
            f"{_f(at.get('ttft_p99_s'), '{:.2f}', '-'):>9}  {tried}"
            f"{'  BEHIND' if s['behind'] else ''}"
        )
    print("(ok: sustainable; x: not; !: the machine fell behind, search stopped)")


async def agreement(
    fleet_path: Path, fleet: FleetConfig, strategy: str, capacity: float, args: argparse.Namespace
) -> dict[str, Any]:
    """The simulator's max sustainable load, and live runs at 0.9 and 1.1 times it."""
    arrivals = "poisson" if args.burstiness == 1.0 else "gamma"
    workload = Workload(trace_rows(args.trace), arrivals, args.burstiness)
    capacities = fleet_capacity(fleet, workload.mix, seed=args.seed)
    rate, _ = sim_max_sustainable(
        fleet,
        strategy,
        workload,
        capacity,
        capacities,
        duration=args.duration,
        seed=args.seed,
        steps=args.sim_steps,
    )
    sim = rate / capacity
    print(f"  {strategy}: simulator sustains {sim:.3f}", file=sys.stderr, flush=True)
    # Sustaining nothing the bisection could resolve, the simulator says: not even its
    # first step above 0; live should fail there too.
    loads = [f * sim for f in AGREEMENT] if sim > 0 else [1.2 / 2**args.sim_steps]
    runs = []
    for load in loads:
        run = await one_run(fleet_path, fleet, strategy, load, capacity, args)
        _progress(run)
        runs.append(run)
    if sim > 0:
        agrees = runs[0]["sustainable"] and not runs[1]["sustainable"]
    else:
        agrees = not runs[0]["sustainable"]
    return {
        "strategy": strategy,
        "sim_max_sustainable_fraction": round(sim, 4),
        "runs": runs,
        "behind": any(r["behind"] for r in runs),
        "agrees": agrees,
    }


def print_agreement(report: Mapping[str, Any]) -> None:
    print(f"{'strategy':<27} {'sim max':>7}  {'live at 0.9x':>18}  {'live at 1.1x':>18}  verdict")
    for row in report["rows"]:
        cells = [
            f"{r['load']:.3f} {'ok' if r['sustainable'] else 'x '} {_f(r['ttft_p99_s']):>9}"
            for r in row["runs"]
        ]
        if len(cells) == 1:
            cells.insert(0, "-")  # the simulator sustained nothing: one run, above it
        above = row["runs"][-1]["sustainable"]
        verdict = (
            "BEHIND"
            if row["behind"]
            else "within 10%"
            if row["agrees"]
            else "live above sim by >10%"
            if above
            else "live below sim by >10%"
        )
        print(
            f"{row['strategy']:<27} {row['sim_max_sustainable_fraction']:>7.3f}  "
            f"{cells[0]:>18}  {cells[1]:>18}  {verdict}"
        )
    agree = sum(r["agrees"] for r in report["rows"])
    print(
        f"(load, ok sustainable / x not, p99 TTFT in emulated s) {agree} of "
        f"{len(report['rows'])} strategies within 10%"
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    fleet_path = FLEETS / args.fleet
    fleet = load_fleet(fleet_path)
    mix = Workload(trace_rows(args.trace)).mix
    capacities = fleet_capacity(fleet, mix, seed=args.seed)
    capacity = sum(capacities.values())
    strategies = args.strategy or list(DEFAULT_STRATEGIES)
    if "all" in strategies:
        strategies = sorted(STRATEGIES)
    report: dict[str, Any] = {
        "fleet": f"examples/fleets/{args.fleet}",
        "capacity_rps": round(capacity, 3),
        "capacity_rps_wall": round(capacity / args.slowdown, 3),
        "capacity_rps_by_replica": {k: round(v, 3) for k, v in capacities.items()},
        "settings": {
            "slowdown": args.slowdown,
            "duration_s": args.duration,
            "drain_s": args.drain,
            "trace": args.trace,
            "burstiness": args.burstiness,
            "seed": args.seed,
            "mode": _mode(args),
        },
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "nproc": os.cpu_count(),
        "rows": [],
    }
    for name in strategies:
        runs_on, strategy = _as_run(name, fleet, capacities)
        if args.agreement:
            row = await agreement(fleet_path, runs_on, strategy, capacity, args)
        elif args.max_sustainable:
            row = await max_sustainable(fleet_path, runs_on, strategy, capacity, args)
        else:
            row = await one_run(fleet_path, runs_on, strategy, args.load, capacity, args)
        row = {**row, "strategy": name}
        if not (args.agreement or args.max_sustainable):
            _progress(row)
        report["rows"].append(row)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--fleet", default=DEFAULT_FLEET, help=f"under examples/fleets ({DEFAULT_FLEET})"
    )
    parser.add_argument(
        "--strategy",
        action="append",
        choices=["all", ORACLE, *sorted(STRATEGIES)],
        help="a strategy (repeatable; all: every one; oracle: weighted round-robin at the true "
        "capacities; default: six load-aware and reference ones)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--load", type=float, default=0.8, help="fraction of capacity (0.8)")
    mode.add_argument("--max-sustainable", action="store_true", help="bisect over the load")
    mode.add_argument(
        "--agreement", action="store_true", help="live at 0.9x and 1.1x the simulator's max"
    )
    parser.add_argument(
        "--sim-steps", type=int, default=7, help="simulator bisection steps for --agreement (7)"
    )
    parser.add_argument("--lo", type=float, default=0.4, help="bisection's low end (0.4)")
    parser.add_argument("--hi", type=float, default=1.1, help="bisection's high end (1.1)")
    parser.add_argument("--steps", type=int, default=3, help="bisection steps (3)")
    parser.add_argument("--slowdown", type=float, default=2.0, help="emulator N times slower (2)")
    parser.add_argument("--duration", type=float, default=60.0, help="emulated s of load (60)")
    parser.add_argument(
        "--drain", type=float, default=20.0, help="emulated s for answers after (20)"
    )
    parser.add_argument(
        "--trace", default="conv", choices=("conv", "code"), help="length mix (conv)"
    )
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape, 1 = Poisson")
    parser.add_argument("--seed", type=int, default=1, help="seed (1)")
    parser.add_argument(
        "--capacity-after", type=float, default=60.0, help="first learned-capacity reading (60)"
    )
    parser.add_argument(
        "--capacity-every", type=float, default=5.0, help="between readings, emulated s (5; 0 off)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.add_argument(
        "--from-json", metavar="FILE", help="print the tables of a saved --json run, run nothing"
    )
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            print_report(json.load(f))
        return
    if not (args.slowdown > 0 and args.duration > 0 and args.drain >= 0 and args.load > 0):
        parser.error("--slowdown, --duration, --load must be > 0 and --drain >= 0")
    if args.steps < 1 or not 0 < args.lo < args.hi:
        parser.error("--steps >= 1 and 0 < --lo < --hi")
    t0 = time.perf_counter()
    report = asyncio.run(main_async(args))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)


def _as_run(
    name: str, fleet: FleetConfig, capacities: Mapping[str, float]
) -> tuple[FleetConfig, str]:
    """The fleet and strategy ``name`` runs: the oracle is the static split an operator who
    knew every card's capacity would write, as the simulator's bench runs it."""
    if name == ORACLE:
        return with_weights(fleet, capacities), "weighted-round-robin"
    return fleet, name


def _mode(args: argparse.Namespace) -> str:
    if args.agreement:
        return "agreement"
    return "max-sustainable" if args.max_sustainable else f"load {args.load}"


def print_report(report: Mapping[str, Any]) -> None:
    s = report["settings"]
    print(
        f"{report['fleet']}: capacity_rps {report['capacity_rps']:.2f} emulated "
        f"({report['capacity_rps_wall']:.2f} a wall second at slowdown {s['slowdown']:g}); "
        f"{s['trace']} lengths, burstiness {s['burstiness']:g}; {s['duration_s']:g} emulated s "
        f"per run (first fifth warm-up) + {s['drain_s']:g} s drain; {s['mode']}; times in "
        "emulated seconds"
    )
    printers = {"max-sustainable": print_search, "agreement": print_agreement}
    printers.get(s["mode"], print_load)(report)
    print(
        f"total {report['wall_s']:.0f} s wall on {report['nproc']} CPUs; load average "
        f"{report['loadavg_at_start'][0]:.2f} at start, {report['loadavg_at_end'][0]:.2f} at end"
    )


if __name__ == "__main__":
    main()
