"""Hostile clients against the front door: does the router keep serving everyone else?

    python bench/bench_hostile.py                 # every attack, 20 s each (about 2.5 min)
    python bench/bench_hostile.py --seconds 10 --attack header-bomb --attack idle-sockets
    python bench/bench_hostile.py --json

Processes on loopback ports picked at start: an MQTT broker (``gpurouter broker``), an
emulated two-replica fleet (``gpurouter emulate``) and the router (``gpurouter serve``, its
control link signed with a secret), the router started with a limit of 1,024 open files as
a small production box would have. Each attack runs for ``--seconds`` while a legitimate
client sends one chat completion every 0.1 s (each must answer 200) and a prober reads
``/health`` every 0.25 s. Attacks (each bounded in time and in connections):

- ``header-bomb``: 4 clients that send a request line, then one header's bytes without
  end, as fast as the socket takes them (again on a new connection when one is closed);
- ``slowloris``: 200 connections that each send one more header line every 2 s;
- ``idle-sockets``: 1,000 connections that send nothing (with the router's 1,024 files,
  they alone would take every descriptor it has);
- ``slow-body``: 50 requests that declare a 1 KB body and send one byte every 2 s;
- ``big-body``: the openai SDK sends a 50 MB chat completion: a 413 error is the answer
  wanted, not a reset connection;
- ``mqtt-flood``: 30,000 junk messages on a control topic (unsigned, badly signed, not
  JSON) as fast as the broker takes them, the operator's signed command sent halfway; the
  router (control signed with a secret) must apply that command and count the junk.

Last, the router gets SIGTERM while 50 clients trickle their bodies (its grace is 5 s): how
long until it exits, and what those clients read (a JSON 503 is wanted).

Per attack the table shows the router's peak resident memory, its CPU use, /health latency
(median and worst, and probes that failed), the legitimate requests served, and how many of
the attack's connections the router had closed by the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from bench_chaos import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ROUTER_FILES = 1024
GRACE_S = 5.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FLEET = """\
cluster: hostile
model: {model}
nodes:
  - name: n0
    gpus:
      - {{index: 0, model: A100-80GB, memory_gib: 80}}
      - {{index: 1, model: V100-32GB, memory_gib: 32}}
    replicas:
      - {{id: a100-0, endpoint: "http://127.0.0.1:{p1}", gpus: [0]}}
      - {{id: v100-0, endpoint: "http://127.0.0.1:{p2}", gpus: [1]}}
server: {{listen: "127.0.0.1:{front}", admin_listen: "127.0.0.1:{admin}",
          shutdown_grace_s: {grace}}}
broker: {{url: "mqtt://127.0.0.1:{mqtt}"}}
control: {{secret_env: BENCH_CONTROL_SECRET}}
"""
SECRET = "bench-hostile-control-secret"
FLOOD = 30_000
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Row:
    attack: str
    rss_peak_mb: float = 0.0
    cpu_share: float = 0.0
    health_p50_ms: float | None = None
    health_max_ms: float | None = None
    health_failed: int = 0
    legit_sent: int = 0
    legit_ok: int = 0
    attack_conns: int = 0
    attack_closed: int = 0
    note: str = ""
    health_ms: list[float] = field(default_factory=list, repr=False)


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (ROUTER_FILES, ROUTER_FILES))


class Processes:
    """The emulated fleet and the router, as subprocesses."""

    def __init__(self, workdir: str) -> None:
        p1, p2, front, admin, mqtt = free_ports(5)
        self.front = f"http://127.0.0.1:{front}"
        self.admin = f"http://127.0.0.1:{admin}"
        self.port = front
        self.mqtt_port = mqtt
        path = os.path.join(workdir, "fleet.yaml")
        with open(path, "w") as f:
            f.write(
                FLEET.format(
                    model=MODEL, p1=p1, p2=p2, front=front, admin=admin, mqtt=mqtt, grace=GRACE_S
                )
            )
        exe = [sys.executable, "-c", "from console.cli import main; main()"]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.broker = subprocess.Popen(  # type: ignore[call-overload]
            [*exe, "broker", "--port", str(mqtt)], **quiet
        )
        self.emulator = subprocess.Popen([*exe, "emulate", "--config", path], **quiet)  # type: ignore[call-overload]
        env = {**os.environ, "BENCH_CONTROL_SECRET": SECRET}
        serve = [*exe, "serve", "--workers", "1", "--config", path]
        self.router = subprocess.Popen(serve, preexec_fn=_limit_files, env=env, **quiet)  # type: ignore[call-overload]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError, TypeError):
                served = httpx.post(f"{self.front}/v1/chat/completions", json=CHAT, timeout=2)
                state = httpx.get(f"{self.admin}/admin/state", timeout=2).json()
                if served.is_success and state["telemetry"]["control"]["connected"]:
                    return
            time.sleep(0.3)
        raise SystemExit("the router did not serve a request and link to the broker within 60 s")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.router.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        with open(f"/proc/{self.router.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        for proc in (self.router, self.emulator, self.broker):
            proc.send_signal(signal.SIGTERM)
        for proc in (self.router, self.emulator, self.broker):
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---- attacks: each returns (connections opened, connections the router closed) -----------


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Whether the router has closed this connection (EOF or reset, after any answer)."""
    try:
        while True:
            data = await asyncio.wait_for(reader.read(65536), timeout=0.05)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


async def _count_closed(readers: list[asyncio.StreamReader]) -> int:
    return sum(await asyncio.gather(*(_closed_by_peer(r) for r in readers)))


async def header_bomb(port: int, seconds: float) -> tuple[int, int]:
    """Four clients, each sending one header without end, again on a new connection
    whenever the router closes the last one, for ``seconds``."""
    chunk = b"a" * 65536
    end = time.monotonic() + seconds
    counts = [0, 0]

    async def one() -> None:
        while time.monotonic() < end:
            reader, writer = await _open(port)
            counts[0] += 1
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Bomb: ")
            with contextlib.suppress(OSError, TimeoutError):
                while time.monotonic() < end and not reader.at_eof():
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), max(0.01, end - time.monotonic()))
                    await asyncio.sleep(0)
            counts[1] += await _closed_by_peer(reader)
            _close_all([writer])

    await asyncio.gather(*(one() for _ in range(4)))
    return counts[0], counts[1]


async def slowloris(port: int, seconds: float) -> tuple[int, int]:
    opened = [await _open(port) for _ in range(200)]
    for _, w in opened:
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        await asyncio.sleep(min(2.0, max(0.0, end - time.monotonic())))
        n += 1
        for _, w in opened:
            with contextlib.suppress(OSError):
                w.write(b"X-Slow-%d: 1\r\n" % n)
    closed = await _count_closed([r for r, _ in opened])
    _close_all(w for _, w in opened)
    return len(opened), closed


async def idle_sockets(port: int, seconds: float) -> tuple[int, int]:
    opened = []
    for _ in range(1000):
        try:
            opened.append(await _open(port))
        except OSError:
            break
    await asyncio.sleep(seconds)
    closed = await _count_closed([r for r, _ in opened])
    _close_all(w for _, w in opened)
    return len(opened), closed


async def slow_body(port: int, seconds: float) -> tuple[int, int]:
    opened = [await _open(port) for _ in range(50)]
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1024\r\n\r\n{"
    )
    for _, w in opened:
        w.write(head)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(min(2.0, max(0.0, end - time.monotonic())))
        for _, w in opened:
            with contextlib.suppress(OSError):
                w.write(b" ")
    closed = await _count_closed([r for r, _ in opened])
    _close_all(w for _, w in opened)
    return len(opened), closed


async def big_body(port: int, seconds: float) -> tuple[int, int]:
    from openai import APIConnectionError, APIStatusError, AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    text = "x" * (50 * 1024 * 1024)
    try:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=1
        )
        big_body.outcome = "200 (accepted)"  # type: ignore[attr-defined]
    except APIStatusError as exc:
        big_body.outcome = f"{exc.status_code} {exc.body}"  # type: ignore[attr-defined]
    except APIConnectionError as exc:
        big_body.outcome = f"connection error: {exc.__cause__!r}"  # type: ignore[attr-defined]
    finally:
        await client.close()
    await asyncio.sleep(seconds)
    return 1, 0


@dataclass
class Shutdown:
    """SIGTERM while 50 clients trickle their bodies: how long until the router exits,
    and what those clients read."""

    exit_s: float = 0.0
    answers: dict[str, int] = field(default_factory=dict)


async def sigterm_under_slow_bodies(procs: Processes) -> Shutdown:
    opened = [await _open(procs.port) for _ in range(50)]
    for _, w in opened:
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n{")
    await asyncio.sleep(1.0)
    t0 = time.monotonic()
    procs.router.send_signal(signal.SIGTERM)

    async def trickle() -> None:
        while procs.router.poll() is None and time.monotonic() - t0 < 4 * GRACE_S:
            for _, w in opened:
                with contextlib.suppress(OSError):
                    w.write(b" ")
            await asyncio.sleep(1.0)

    async def answer(reader: asyncio.StreamReader) -> str:
        try:
            raw = await asyncio.wait_for(reader.read(-1), 4 * GRACE_S)
        except (TimeoutError, OSError):
            return "no answer"
        head = raw.split(b"\r\n\r\n", 1)[0].lower()
        if not head:
            return "closed, no answer"
        kind = "json" if b"application/json" in head else "not json"
        return f"{head.split()[1].decode()} {kind}"

    trickling = asyncio.create_task(trickle())
    answers = await asyncio.gather(*(answer(r) for r, _ in opened))
    await asyncio.to_thread(procs.router.wait, 4 * GRACE_S)
    result = Shutdown(time.monotonic() - t0)
    await trickling
    for a in answers:
        result.answers[a] = result.answers.get(a, 0) + 1
    _close_all(w for _, w in opened)
    return result


async def mqtt_flood(procs: Processes, seconds: float) -> tuple[int, int]:
    """30,000 junk control messages (unsigned, badly signed, not JSON) as fast as the
    broker takes them, the operator's signed command halfway: was it applied?"""
    import aiomqtt

    from router.config.schema import BrokerConfig
    from router.control import SetWeight
    from router.telemetry.connection import resolve_target
    from router.telemetry.control_messages import encode_desired
    from router.telemetry.control_publisher import ControlPublisher
    from router.telemetry.topics import Topics

    topic = Topics("hostile").desired("weight/a100-0")
    now = int(time.time() * 1000)
    junk = [
        encode_desired(SetWeight("a100-0", 0.001), now, "mallory", time.time()),
        encode_desired(
            SetWeight("a100-0", 0.001), now, "mallory", time.time(), topic=topic, secret=b"x" * 32
        ),
        b"\xff not json",
    ]
    target = resolve_target(BrokerConfig(), url=f"mqtt://127.0.0.1:{procs.mqtt_port}")
    async with (
        aiomqtt.Client(
            "127.0.0.1", procs.mqtt_port, identifier="mallory", max_queued_outgoing_messages=None
        ) as mallory,
        ControlPublisher(target, "hostile", origin="alice", secret=SECRET.encode()) as operator,
    ):
        for i in range(FLOOD):
            await mallory.publish(topic, junk[i % len(junk)], qos=0)
            if i == FLOOD // 2:
                await operator.publish(SetWeight("a100-0", 2.0))
    await asyncio.sleep(seconds)
    async with httpx.AsyncClient(timeout=5) as client:
        state = (await client.get(f"{procs.admin}/admin/state")).json()
    weight = next(r["weight"] for r in state["replicas"] if r["id"] == "a100-0")
    dropped = state["telemetry"]["control"]["refused"]
    counted = ", ".join(f"{k} {v}" for k, v in dropped.items() if v)
    mqtt_flood.outcome = (  # type: ignore[attr-defined]
        f"operator's weight 2.0 applied: {weight == 2.0} (weight {weight}); dropped: {counted}"
    )
    return 0, 0  # no connection to the router: the flood goes through the broker


def _close_all(writers: Any) -> None:
    for w in writers:
        with contextlib.suppress(OSError):
            w.close()


PORT_ATTACKS: dict[str, Callable[[int, float], Awaitable[tuple[int, int]]]] = {
    "header-bomb": header_bomb,
    "slowloris": slowloris,
    "idle-sockets": idle_sockets,
    "slow-body": slow_body,
    "big-body": big_body,
}
ATTACKS = [*PORT_ATTACKS, "mqtt-flood"]


async def _attack(name: str, procs: Processes, seconds: float) -> tuple[tuple[int, int], str]:
    """Run one attack: (connections opened, closed by the router) and its note."""
    if name == "mqtt-flood":
        return await mqtt_flood(procs, seconds), getattr(mqtt_flood, "outcome", "")
    attack = PORT_ATTACKS[name]
    return await attack(procs.port, seconds), getattr(attack, "outcome", "")


# ---- the legitimate side ------------------------------------------------------------------


async def legit(front: str, row: Row, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=front, timeout=10.0) as client:

        async def one() -> None:
            row.legit_sent += 1
            with contextlib.suppress(httpx.HTTPError):
                r = await client.post("/v1/chat/completions", json=CHAT)
                row.legit_ok += r.status_code == 200

        tasks = []
        while not stop.is_set():
            tasks.append(asyncio.create_task(one()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
        await asyncio.gather(*tasks)


async def prober(front: str, row: Row, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            # A fresh connection each time, as a load balancer's health check makes.
            async with httpx.AsyncClient(timeout=5.0) as client:
                r = await client.get(f"{front}/health")
            if r.status_code == 200:
                row.health_ms.append((time.perf_counter() - t0) * 1000)
            else:
                row.health_failed += 1
        except httpx.HTTPError:
            row.health_failed += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def run_attack(procs: Processes, name: str, seconds: float) -> Row:
    row = Row(name)
    stop = asyncio.Event()
    cpu0, t0 = procs.cpu_s(), time.monotonic()

    async def sample_rss() -> None:
        while not stop.is_set():
            row.rss_peak_mb = max(row.rss_peak_mb, procs.rss_mb())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    side = [
        asyncio.create_task(legit(procs.front, row, stop)),
        asyncio.create_task(prober(procs.front, row, stop)),
        asyncio.create_task(sample_rss()),
    ]
    (row.attack_conns, row.attack_closed), row.note = await _attack(name, procs, seconds)
    stop.set()
    await asyncio.gather(*side)
    row.cpu_share = (procs.cpu_s() - cpu0) / (time.monotonic() - t0)
    if row.health_ms:
        row.health_p50_ms = statistics.median(row.health_ms)
        row.health_max_ms = max(row.health_ms)
    return row


def print_table(rows: list[Row]) -> None:
    head = (
        f"{'attack':<13} {'RSS peak':>9} {'CPU':>5} {'/health p50':>12} {'max':>8} "
        f"{'failed':>6} {'legit ok':>12} {'closed by router':>17}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        p50 = "-" if r.health_p50_ms is None else f"{r.health_p50_ms:.1f} ms"
        hmax = "-" if r.health_max_ms is None else f"{r.health_max_ms:.0f} ms"
        ok = f"{r.legit_ok}/{r.legit_sent}"
        closed = f"{r.attack_closed}/{r.attack_conns}" if r.attack_conns else "-"
        print(
            f"{r.attack:<13} {r.rss_peak_mb:>6.0f} MB {r.cpu_share:>5.0%} {p50:>12} {hmax:>8} "
            f"{r.health_failed:>6} {ok:>12} {closed:>17}"
        )
        if r.note:
            print(f"  {r.attack}: {r.note[:200]}")


async def main_async(args: argparse.Namespace) -> tuple[list[Row], Shutdown]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        procs = Processes(workdir)
        try:
            await asyncio.to_thread(procs.wait_ready)
            for name in args.attack or ATTACKS:
                rows.append(await run_attack(procs, name, args.seconds))
                await asyncio.sleep(2.0)  # let the router settle between attacks
            shutdown = await sigterm_under_slow_bodies(procs)
        finally:
            procs.stop()
    return rows, shutdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each attack")
    parser.add_argument("--attack", action="append", choices=ATTACKS)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    if not 0 < args.seconds <= 120:
        parser.error("--seconds must be in (0, 120]")
    os.chdir(ROOT)
    rows, shutdown = asyncio.run(main_async(args))
    if args.json:
        attacks = [{k: v for k, v in asdict(r).items() if k != "health_ms"} for r in rows]
        print(json.dumps({"attacks": attacks, "sigterm": asdict(shutdown)}))
        return
    print_table(rows)
    answers = ", ".join(f"{n} x {a}" for a, n in sorted(shutdown.answers.items()))
    print(
        f"\nSIGTERM with 50 bodies trickling (grace {GRACE_S:g} s): the router exited after "
        f"{shutdown.exit_s:.1f} s; the clients read: {answers}"
    )


if __name__ == "__main__":
    main()
