"""Replica kills under load: does the router lose requests, cut streams silently, eject the fleet?

    python bench/bench_chaos.py                  # 150 s at 20 req/s, a kill every 5 s
    python bench/bench_chaos.py --duration 120 --rate 10 --kill-every 5 --dead-for 5 --seed 1
    python bench/bench_chaos.py --json

Processes on loopback ports picked at start: an emulated fleet of 8 replicas of mixed cards
(``gpurouter emulate`` with its fault API on ``--control-listen``) and the router (``gpurouter
serve``), whose health settings are the fleet file's defaults (printed, never tuned here).

- Load: an open-loop client sends ``--rate`` chat completions a second for ``--duration``
  seconds, every other one streamed. A request that gets no byte for ``--hang-after``
  seconds (10), or is not over ``--request-timeout`` seconds (60) after it was sent, is
  hung: the client gives up on it there, as one with a timeout would.
- The killer: every ``--kill-every`` seconds it kills one replica (round-robin over a seeded
  shuffle of the fleet) and revives each replica ``--dead-for`` seconds after its kill (the
  kill comes first when both fall on one tick, so two are down for a moment).
- Samplers: every 0.25 s the router's ``/admin/state`` and each replica's own ``/health``,
  from the start of the load until every revived replica is active again (at most
  ``--settle`` seconds after the load).

Printed: requests sent, completed, failed before their first byte (an error status instead
of an answer, or no status line at all; the 503s counted apart), streams cut with an error
event and without one, hung; each kill's time to readmit (from the revival to the first
sample with the replica ``active``); the most replicas ejected at once, and of them the most
that answered ``/health`` in the same sample; samples with no active replica while some
replica answered ``/health``. The aims: 0 failed
before first byte, 0 streams cut without an error event, 0 samples with the fleet out while
replicas answer. The client says when it fell behind its schedule (requests sent late).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CARDS = (
    ("A100-80GB", 80, 3),
    ("V100-32GB", 32, 3),
    ("L4", 24, 2),
)
"""(card, memory GiB, replicas): one node per card, one replica per GPU, weight 1."""
SAMPLE_PERIOD_S = 0.25
LATE_S = 0.1
"""A request sent this long after its scheduled time counts as sent late."""

# ---- outcomes of one request ------------------------------------------------------------

COMPLETED = "completed"
FAILED_BEFORE_FIRST_BYTE = "failed before first byte"
STREAM_CUT_WITH_ERROR = "stream cut with an error event"
STREAM_CUT_WITHOUT_ERROR = "stream cut without an error event"
BODY_CUT = "body cut (not streamed)"
HUNG_SILENT = "hung: no byte for too long"
HUNG_UNFINISHED = "hung: not finished in time"
OUTCOMES = (
    COMPLETED,
    FAILED_BEFORE_FIRST_BYTE,
    STREAM_CUT_WITH_ERROR,
    STREAM_CUT_WITHOUT_ERROR,
    BODY_CUT,
    HUNG_SILENT,
    HUNG_UNFINISHED,
)


class SseTally:
    """Follows a Server-Sent Events body chunk by chunk: its data events, whether one was an
    error event (``data: {"error": ...}`` or ``event: error``) and whether ``[DONE]`` came."""

    def __init__(self) -> None:
        self.events = 0
        self.error = False
        self.done = False
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            self._line(raw.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if line.startswith(b"event:") and line[6:].strip() == b"error":
            self.error = True
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        self.events += 1
        if data == b"[DONE]":
            self.done = True
        elif b'"error"' in data:  # parse only the rare candidates: the client shares 2 cores
            with contextlib.suppress(ValueError):
                parsed = json.loads(data)
                self.error = self.error or (isinstance(parsed, dict) and "error" in parsed)

    def outcome(self) -> str:
        """The stream's outcome once its body has ended (or broke off)."""
        if self.error:
            return STREAM_CUT_WITH_ERROR
        return COMPLETED if self.done else STREAM_CUT_WITHOUT_ERROR


@dataclass
class Tally:
    """What the client saw, by outcome and kind (streamed or not)."""

    sent: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    """Failures before the status line, by exception type."""
    late: int = 0
    worst_lag_s: float = 0.0
    not_sent_cap: int = 0
    """Requests the schedule called for while ``--max-in-flight`` were open: not sent."""
    durations_s: list[float] = field(default_factory=list)
    """Of completed requests."""

    def count(self, kind: str, outcome: str) -> None:
        self.outcomes[(kind, outcome)] += 1

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.outcomes.items() if o == outcome)


# ---- the killer's plan and the samples -----------------------------------------------------


@dataclass
class Kill:
    replica: str
    kill_at: float
    """Planned seconds from the start of the load."""
    revive_at: float
    killed_s: float | None = None
    """When the kill took effect (the fault API answered), seconds from the start."""
    revived_s: float | None = None
    readmit_s: float | None = None
    """From the revival to the first sample showing the replica active; None: none did."""
    ejected: bool = False
    """Whether a sample showed it ejected between its kill and its readmission."""
    note: str = ""


def plan_kills(
    replicas: Sequence[str], duration_s: float, kill_every_s: float, dead_for_s: float, seed: int
) -> list[Kill]:
    """A kill every ``kill_every_s`` from ``kill_every_s`` until ``duration_s``, round-robin
    over a seeded shuffle of ``replicas``; each revived ``dead_for_s`` later, at the latest at
    ``duration_s`` (the load's end), so every replica is alive when the load stops."""
    order = list(replicas)
    random.Random(seed).shuffle(order)
    kills = []
    n = 1
    while n * kill_every_s < duration_s:
        at = n * kill_every_s
        kills.append(Kill(order[(n - 1) % len(order)], at, min(at + dead_for_s, duration_s)))
        n += 1
    return kills


@dataclass
class Sample:
    t: float
    """Seconds from the start of the load, when the router's answer arrived."""
    states: dict[str, str] | None
    """Router state per replica; None: the admin API did not answer in time."""
    healthy: dict[str, bool]
    """Whether each replica's own /health answered 200."""


def readmissions(kills: list[Kill], samples: list[Sample]) -> None:
    """Fill each kill's ``readmit_s`` and ``ejected`` from the samples. The search for its
    readmission stops at the same replica's next kill (then ``note`` says so)."""
    for k in kills:
        k.readmit_s, k.ejected, k.note = None, False, ""
        if k.killed_s is None or k.revived_s is None:
            k.note = "kill or revival did not take effect"
            continue
        later = [
            x.killed_s
            for x in kills
            if x.replica == k.replica and x.killed_s is not None and x.killed_s > k.killed_s
        ]
        end = min(later, default=float("inf"))
        for s in samples:
            if s.states is None or s.t < k.killed_s or s.t >= end:
                continue
            state = s.states.get(k.replica)
            if state == "ejected":
                k.ejected = True
            if s.t >= k.revived_s and state == "active":
                k.readmit_s = s.t - k.revived_s
                break
        if k.readmit_s is None:
            k.note = "killed again before readmitted" if later else "not readmitted by the end"


@dataclass
class FleetView:
    samples: int = 0
    last_at: float = 0.0
    """Seconds from the start of the load to the last sample (sampling goes on after the
    load until the revived replicas are back, or ``--settle``)."""
    admin_unanswered: int = 0
    worst_gap_s: float = 0.0
    most_ejected: int = 0
    most_ejected_answering: int = 0
    """Most replicas ejected in one sample that answered /health in that same sample."""
    most_ejected_answering_at: float | None = None
    fleet_out_answering: int = 0
    """Samples with no active replica while at least one replica answered /health."""
    fleet_out_answering_first_at: float | None = None
    fleet_out: int = 0
    """Samples with no active replica at all."""


def fleet_view(samples: list[Sample]) -> FleetView:
    view = FleetView(samples=len(samples))
    previous: float | None = None
    for s in samples:
        if previous is not None:
            view.worst_gap_s = max(view.worst_gap_s, s.t - previous)
        previous = view.last_at = s.t
        if s.states is None:
            view.admin_unanswered += 1
            continue
        ejected = [r for r, state in s.states.items() if state == "ejected"]
        answering = [r for r in ejected if s.healthy.get(r)]
        view.most_ejected = max(view.most_ejected, len(ejected))
        if len(answering) > view.most_ejected_answering:
            view.most_ejected_answering = len(answering)
            view.most_ejected_answering_at = s.t
        if not any(state == "active" for state in s.states.values()):
            view.fleet_out += 1
            if any(s.healthy.values()):
                view.fleet_out_answering += 1
                if view.fleet_out_answering_first_at is None:
                    view.fleet_out_answering_first_at = s.t
    return view


# ---- the processes ----------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free now (bench_hostile.py uses it too)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def fleet_yaml(replica_ports: list[int], front: int, admin: int) -> tuple[str, dict[str, str]]:
    """The fleet file, and each replica's endpoint by id."""
    lines = ["cluster: chaos", f"model: {MODEL}", "nodes:"]
    endpoints: dict[str, str] = {}
    ports = iter(replica_ports)
    for card, memory, count in CARDS:
        short = card.split("-")[0].lower()
        lines += [f"  - name: {short}-node", "    gpus:"]
        lines += [
            f"      - {{index: {i}, model: {card}, memory_gib: {memory}}}" for i in range(count)
        ]
        lines.append("    replicas:")
        for i in range(count):
            rid, url = f"{short}-{i}", f"http://127.0.0.1:{next(ports)}"
            endpoints[rid] = url
            lines.append(f'      - {{id: {rid}, endpoint: "{url}", gpus: [{i}], weight: 1}}')
    lines.append(f'server: {{listen: "127.0.0.1:{front}", admin_listen: "127.0.0.1:{admin}"}}')
    return "\n".join(lines) + "\n", endpoints


class Processes:
    """The emulated fleet (with its fault API) and the router, as subprocesses."""

    def __init__(self, workdir: str, time_scale: float, seed: int) -> None:
        n = sum(count for _, _, count in CARDS)
        *replica_ports, front, admin, control = free_ports(n + 3)
        text, self.endpoints = fleet_yaml(replica_ports, front, admin)
        self.path = os.path.join(workdir, "fleet.yaml")
        with open(self.path, "w") as f:
            f.write(text)
        self.front = f"http://127.0.0.1:{front}"
        self.admin = f"http://127.0.0.1:{admin}"
        self.control = f"http://127.0.0.1:{control}"
        exe = [sys.executable, "-c", "from console.cli import main; main()"]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        emulate = [*exe, "emulate", "--config", self.path, "--seed", str(seed)]
        emulate += ["--time-scale", str(time_scale), "--control-listen", f"127.0.0.1:{control}"]
        self.emulator = subprocess.Popen(emulate, **quiet)  # type: ignore[call-overload]
        serve = [*exe, "serve", "--workers", "1", "--config", self.path]
        self.router = subprocess.Popen(serve, **quiet)  # type: ignore[call-overload]

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float = 60.0) -> None:
        """Until every replica answers /health, the fault API answers and the router serves a
        request."""
        deadline = time.monotonic() + timeout_s
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                healthy = await replica_health(session, self.endpoints)
                async with session.get(f"{self.control}/faults") as r:
                    control_ok = r.status == 200
                async with session.post(f"{self.front}/v1/chat/completions", json=body) as r:
                    served = r.status == 200
                if all(healthy.values()) and control_ok and served:
                    return
            await asyncio.sleep(0.3)
        raise SystemExit("the fleet and the router were not ready within 60 s")

    def stop(self) -> None:
        for proc in (self.router, self.emulator):
            proc.send_signal(signal.SIGTERM)
        for proc in (self.router, self.emulator):
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()


def health_settings(path: str) -> dict[str, Any]:
    """The router's health, retry and timeout settings as the fleet file gives them."""
    from router.config import load_fleet

    router = load_fleet(path).router
    return {
        "health": asdict(router.health),
        "retries": asdict(router.retries),
        "timeouts": asdict(router.timeouts),
    }


# ---- load ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSettings:
    rate: float
    duration_s: float
    max_tokens: int
    hang_after_s: float
    request_timeout_s: float
    max_in_flight: int


async def one_request(
    session: aiohttp.ClientSession, front: str, stream: bool, cfg: LoadSettings, tally: Tally
) -> None:
    kind = "streamed" if stream else "not streamed"
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcome = await _attempt(session, front, stream, cfg, tally)
    tally.count(kind, outcome)
    if outcome == COMPLETED:
        tally.durations_s.append(loop.time() - start)


async def _attempt(
    session: aiohttp.ClientSession, front: str, stream: bool, cfg: LoadSettings, tally: Tally
) -> str:
    """One request's outcome."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about GPUs."}],
        "max_tokens": cfg.max_tokens,
        "stream": stream,
    }
    loop = asyncio.get_running_loop()
    end = loop.time() + cfg.request_timeout_s
    sse = SseTally()
    got_status = False
    try:
        async with asyncio.timeout(None) as limit:

            def rearm() -> None:  # a byte came: the silence bound starts again
                limit.reschedule(min(loop.time() + cfg.hang_after_s, end))

            rearm()
            async with session.post(f"{front}/v1/chat/completions", json=body) as resp:
                got_status = True
                tally.statuses[resp.status] += 1
                if resp.status != 200:
                    await resp.read()
                    return FAILED_BEFORE_FIRST_BYTE
                rearm()
                if not stream:
                    data = json.loads(await resp.read())
                    return COMPLETED if isinstance(data, dict) and "choices" in data else BODY_CUT
                async for chunk in resp.content.iter_any():
                    sse.feed(chunk)
                    rearm()
                return sse.outcome()
    except TimeoutError:
        return HUNG_UNFINISHED if loop.time() >= end - 0.01 else HUNG_SILENT
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        if not got_status:
            tally.transport_errors[type(exc).__name__] += 1
            return FAILED_BEFORE_FIRST_BYTE
        return sse.outcome() if stream else BODY_CUT


async def load(front: str, cfg: LoadSettings, tally: Tally, t0: float) -> None:
    """Open loop: request i is due at ``t0 + i / rate``, sent then whatever came back;
    every other one streamed. Waits for the last answers, bounded by the request timeout."""
    connector = aiohttp.TCPConnector(limit=cfg.max_in_flight)
    timeout = aiohttp.ClientTimeout(total=None)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks: set[asyncio.Task[None]] = set()
        for i in range(int(cfg.rate * cfg.duration_s)):
            due = t0 + i / cfg.rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            lag = loop.time() - due
            tally.worst_lag_s = max(tally.worst_lag_s, lag)
            tally.late += lag > LATE_S
            if len(tasks) >= cfg.max_in_flight:
                tally.not_sent_cap += 1
                continue
            stream = i % 2 == 0
            tally.sent["streamed" if stream else "not streamed"] += 1
            task = asyncio.create_task(one_request(session, front, stream, cfg, tally))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            # Every request ends by its own timeout; this bound is only a backstop.
            _, pending = await asyncio.wait(set(tasks), timeout=cfg.request_timeout_s + 5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


# ---- the killer and the samplers -------------------------------------------------------


async def fault(session: aiohttp.ClientSession, control: str, replica: str, name: str) -> bool:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.post(f"{control}/faults/{replica}", json={"fault": name}) as r:
            return r.status == 200
    return False


async def killer(control: str, kills: list[Kill], t0: float) -> None:
    """Kills and revivals at their planned times; on one tick, kills first."""
    actions = [(k.kill_at, 0, k) for k in kills] + [(k.revive_at, 1, k) for k in kills]
    actions.sort(key=lambda a: (a[0], a[1]))
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        for at, revive, k in actions:
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            ok = await fault(session, control, k.replica, "revive" if revive else "kill")
            if ok and revive:
                k.revived_s = loop.time() - t0
            elif ok:
                k.killed_s = loop.time() - t0


async def replica_health(
    session: aiohttp.ClientSession, endpoints: dict[str, str]
) -> dict[str, bool]:
    async def one(url: str) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                return r.status == 200
        return False

    answers = await asyncio.gather(*(one(url) for url in endpoints.values()))
    return dict(zip(endpoints, answers, strict=True))


async def router_states(session: aiohttp.ClientSession, admin: str) -> dict[str, str] | None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with session.get(f"{admin}/admin/state", timeout=timeout) as r:
            data = await r.json()
            return {rep["id"]: rep["state"] for rep in data["replicas"]}
    return None


async def sampler(procs: Processes, samples: list[Sample], t0: float, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            due = loop.time() + SAMPLE_PERIOD_S
            states, healthy = await asyncio.gather(
                router_states(session, procs.admin), replica_health(session, procs.endpoints)
            )
            samples.append(Sample(loop.time() - t0, states, healthy))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))


def _awaiting_readmission(kills: list[Kill], samples: list[Sample]) -> bool:
    readmissions(kills, samples)
    return any(k.note == "not readmitted by the end" for k in kills)


# ---- the run ------------------------------------------------------------------------------


@dataclass
class Result:
    settings: dict[str, Any]
    router_settings: dict[str, Any]
    tally: Tally
    kills: list[Kill]
    view: FleetView
    router_retries: int | None


async def run(args: argparse.Namespace) -> Result:
    cfg = LoadSettings(
        args.rate,
        args.duration,
        args.max_tokens,
        args.hang_after,
        args.request_timeout,
        args.max_in_flight,
    )
    tally = Tally()
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory() as workdir:
        procs = Processes(workdir, args.time_scale, args.seed)
        try:
            router_settings = health_settings(procs.path)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
                await procs.wait_ready(s)
            kills = plan_kills(
                list(procs.endpoints), args.duration, args.kill_every, args.dead_for, args.seed
            )
            loop = asyncio.get_running_loop()
            t0 = loop.time() + 0.5
            stop = asyncio.Event()
            watch = asyncio.create_task(sampler(procs, samples, t0, stop))
            await asyncio.gather(
                load(procs.front, cfg, tally, t0), killer(procs.control, kills, t0)
            )
            # Samples go on until every revived replica is back, or --settle seconds.
            settle_end = loop.time() + args.settle
            while loop.time() < settle_end and _awaiting_readmission(kills, samples):
                await asyncio.sleep(1.0)
            stop.set()
            await watch
            async with aiohttp.ClientSession() as s:
                retries = await router_retries(s, procs.admin)
        finally:
            procs.stop()
    readmissions(kills, samples)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    settings["replicas"] = {card: count for card, _, count in CARDS}
    return Result(settings, router_settings, tally, kills, fleet_view(samples), retries)


async def router_retries(session: aiohttp.ClientSession, admin: str) -> int | None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(f"{admin}/admin/state") as r:
            data = await r.json()
            return sum(int(rep["retries"]) for rep in data["replicas"])
    return None


# ---- output -------------------------------------------------------------------------------


def _aim(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def print_report(res: Result) -> None:
    st, t, v = res.settings, res.tally, res.view
    fleet = ", ".join(f"{n} x {card}" for card, n in st["replicas"].items())
    print(
        f"chaos: {fleet}; {st['duration']:.0f} s at {st['rate']:g} req/s (every other one "
        f"streamed, max_tokens {st['max_tokens']}), time scale {st['time_scale']:g}; a kill "
        f"every {st['kill_every']:g} s, each dead {st['dead_for']:g} s; seed {st['seed']}"
    )
    h = res.router_settings["health"]
    print("router health (fleet file defaults): " + ", ".join(f"{k}={h[k]}" for k in h))
    for key in ("retries", "timeouts"):
        print(
            f"router {key}: " + ", ".join(f"{k}={x}" for k, x in res.router_settings[key].items())
        )
    behind = f"{t.late} sent late (> {LATE_S * 1000:.0f} ms behind schedule)"
    print(f"client: {behind}, worst lag {t.worst_lag_s * 1000:.0f} ms; {t.not_sent_cap} not sent")
    print()
    kinds = ("streamed", "not streamed")
    head = f"{'requests':<36} {'all':>6} {'streamed':>9} {'not streamed':>13}"
    print(head)
    print("-" * len(head))
    print(f"{'sent':<36} {sum(t.sent.values()):>6} {t.sent[kinds[0]]:>9} {t.sent[kinds[1]]:>13}")
    bounds = {
        HUNG_SILENT: f"hung: no byte for {st['hang_after']:g} s",
        HUNG_UNFINISHED: f"hung: not over in {st['request_timeout']:g} s",
    }
    for o in OUTCOMES:
        row = [t.outcomes[(k, o)] for k in kinds]
        print(f"{bounds.get(o, o):<36} {sum(row):>6} {row[0]:>9} {row[1]:>13}")
    statuses = ", ".join(f"{code}: {n}" for code, n in sorted(t.statuses.items()))
    print(f"statuses: {statuses}; 503s: {t.statuses[503]}")
    if t.transport_errors:
        print(
            "failed before a status line: "
            + ", ".join(f"{k} {n}" for k, n in t.transport_errors.items())
        )
    if t.durations_s:
        q = statistics.quantiles(t.durations_s, n=20)
        print(
            f"completed requests took: median {statistics.median(t.durations_s):.2f} s, "
            f"p5 {q[0]:.2f} s, p95 {q[-1]:.2f} s"
        )
    print(f"router retries (sum over replicas): {res.router_retries}")
    print()
    times = [k.readmit_s for k in res.kills if k.readmit_s is not None]
    print(f"kills: {len(res.kills)}; time to readmit after revival (first sample showing active):")
    if times:
        print(
            f"  median {statistics.median(times):.2f} s, max {max(times):.2f} s, "
            f"{len(times)} readmitted, {len(res.kills) - len(times)} not"
        )
    for k in res.kills:
        back = "-" if k.readmit_s is None else f"{k.readmit_s:6.2f} s"
        killed = "-" if k.killed_s is None else f"{k.killed_s:6.1f}"
        revived = "-" if k.revived_s is None else f"{k.revived_s:6.1f}"
        ejected = "ejected" if k.ejected else "never seen ejected"
        print(
            f"  {k.replica:<7} killed {killed} s, revived {revived} s: readmitted after "
            f"{back} ({ejected}){'; ' + k.note if k.note else ''}"
        )
    print()
    at = "" if v.most_ejected_answering_at is None else f" (at {v.most_ejected_answering_at:.1f} s)"
    first = v.fleet_out_answering_first_at
    print(
        f"samples every {SAMPLE_PERIOD_S} s from 0 to {v.last_at:.0f} s: {v.samples} "
        f"(worst gap {v.worst_gap_s:.2f} s, {v.admin_unanswered} without an admin answer)"
    )
    print(f"most replicas ejected at once: {v.most_ejected}")
    print(f"most ejected at once while answering /health: {v.most_ejected_answering}{at}")
    print(
        f"samples with no active replica: {v.fleet_out}; of them while some replica answered "
        f"/health: {v.fleet_out_answering}"
        + ("" if first is None else f" (first at {first:.1f} s)")
    )
    print()
    lost = t.total(FAILED_BEFORE_FIRST_BYTE)
    silent = t.total(STREAM_CUT_WITHOUT_ERROR)
    print(f"aim: 0 failed before first byte: {lost} ({_aim(lost == 0)})")
    print(f"aim: 0 streams cut without an error event: {silent} ({_aim(silent == 0)})")
    print(
        f"aim: no sample with the fleet out while replicas answer /health: "
        f"{v.fleet_out_answering} ({_aim(v.fleet_out_answering == 0)})"
    )


def as_json(res: Result) -> dict[str, Any]:
    t = res.tally
    return {
        "settings": res.settings,
        "router_settings": res.router_settings,
        "sent": dict(t.sent),
        "outcomes": {
            o: {k: t.outcomes[(k, o)] for k in ("streamed", "not streamed")} for o in OUTCOMES
        },
        "statuses": {str(k): n for k, n in t.statuses.items()},
        "transport_errors": dict(t.transport_errors),
        "late": t.late,
        "worst_lag_s": t.worst_lag_s,
        "not_sent_cap": t.not_sent_cap,
        "router_retries": res.router_retries,
        "kills": [asdict(k) for k in res.kills],
        "fleet": asdict(res.view),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of load (150)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests a second (20)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--dead-for", type=float, default=5.0, help="seconds a replica is dead")
    parser.add_argument("--seed", type=int, default=0, help="kill order and emulator seed")
    parser.add_argument("--max-tokens", type=int, default=64, help="of every request (64)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="of the emulator (1)")
    parser.add_argument("--hang-after", type=float, default=10.0, help="silence that is a hang")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="per request")
    parser.add_argument("--max-in-flight", type=int, default=1000, help="client's open requests")
    parser.add_argument("--settle", type=float, default=60.0, help="wait for readmissions")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    n = sum(count for _, _, count in CARDS)
    if not 0 < args.duration <= 900:
        parser.error("--duration must be in (0, 900]")
    if not 0 < args.rate <= 200:
        parser.error("--rate must be in (0, 200]")
    if not 0 < args.kill_every < args.duration:
        parser.error("--kill-every must be in (0, --duration)")
    if not 0 < args.dead_for < n * args.kill_every:
        parser.error(
            f"--dead-for must be in (0, {n} x --kill-every): a replica dies once at a time"
        )
    if not 0 < args.hang_after <= args.request_timeout <= 600:
        parser.error("need 0 < --hang-after <= --request-timeout <= 600")
    if not 1 <= args.max_in_flight <= 10000 or not 1 <= args.max_tokens <= 4096:
        parser.error("--max-in-flight must be in [1, 10000] and --max-tokens in [1, 4096]")
    if not 0 <= args.settle <= 600 or args.time_scale <= 0:
        parser.error("--settle must be in [0, 600] and --time-scale > 0")
    os.chdir(ROOT)
    res = asyncio.run(run(args))
    if args.json:
        print(json.dumps(as_json(res)))
    else:
        print_report(res)


if __name__ == "__main__":
    main()
