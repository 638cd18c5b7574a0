"""Relaying streamed tokens: router CPU per million tokens, gpurouter beside the Rust routers.

    python bench/bench_token_relay.py             # 3 rounds (about 5 minutes on 2 cores)
    python bench/bench_token_relay.py --quick     # 1 short round, 2 concurrencies
    python bench/bench_token_relay.py --json      # the figures as JSON

Processes, each on loopback ports the OS picked:

- the **upstream**: a zero-work OpenAI-like server (raw uvloop protocol) on ``--replicas``
  ports (one per replica, so that every router picks among several): a streamed chat
  completion of ``max_tokens`` SSE events (default 256) of one token each, in the OpenAI
  chat-completion chunk format, then ``data: [DONE]``. **Paced** (``--gap-ms``, default 20):
  one clock ticks every gap and writes the next token of every open stream at once, as an
  engine's decode step does for its whole batch; **unpaced**: every stream writes its next
  token on every loop turn, to find the most tokens/s a router relays. It also answers the
  GETs the routers send at start (``/health``, ``/v1/models``, ...);
- the **routers**, all on the same upstream ports: ``gpurouter serve --workers 1`` and
  ``--workers 2`` (default strategy), ``vllm-router`` and ``sglang-router`` (each with its
  default policy, ``cache_aware``; see routers_under_test.py), and nginx (one worker, upstream
  keep-alive, ``proxy_buffering off``: bench_proxy.py's), plus the **direct** path (load
  generator to upstream), which shows what the machine delivers with no router;
- the **load generator**: closed loop, one keep-alive connection per stream, raw HTTP/1.1 on
  uvloop; it counts SSE events as they arrive and checks every finished reply's status and
  length. A user's first request asks for a share of the tokens (user k of C: ``1 + k*N/C``)
  so that streams start and end spread out from the first second, as on a busy engine.

Per round, every router at every concurrency (paced: ``--concurrency``, default 32, 128 and
512 streams; unpaced: ``--max-concurrency``, default 64) in an order rotated per cell. A
measurement is a warm-up, then a window over which the load generator counts the tokens
received and reads the router's CPU time (user + system, its process and every descendant:
the supervisor and workers of ``--workers 2``, from /proc) at the window's two ends; at the
end its connections are closed mid-stream. The table gives medians over rounds; the ratios
to the Rust routers are taken within each round, then the median.

From gpurouter's ``--workers 1`` CPU per token at the highest paced concurrency it derives
the tokens/s one worker relays at 80% of a core, and divides it by what one GPU decodes at
full load according to the project's performance model (``router.perf.saturation``:
Llama-3.1-8B on one GPU at bench/calibrate.py's conversation mix): the number of GPUs of
each kind one worker can front.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import bench_http_stack as stack
import bench_proxy
import orjson
from routers_under_test import (
    Started,
    fleet_yaml,
    front_door_port,
    gpurouter_serve_argv,
    rust_environment,
    rust_router_argv,
    start_process,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # router.perf, when run as a script

PATH = "/v1/chat/completions"
MODEL = "bench-model"
DIRECT = "direct"
GPUROUTER_1, GPUROUTER_2 = "gpurouter w1", "gpurouter w2"
VLLM_ROUTER, SGLANG_ROUTER, NGINX = "vllm-router", "sglang-router", "nginx"
RUST = (VLLM_ROUTER, SGLANG_ROUTER)
RUST_POLICY = "cache_aware"  # both routers' default policy
WORKER_SHARE = 0.8
"""Share of a core one worker is planned to use at full load: headroom for bursts."""
GPU_KINDS = ("H100-SXM", "A100-80GB", "L4")
GPU_MODEL = "Llama-3.1-8B"


# ---- the SSE payload -----------------------------------------------------------------------


def token_event(i: int) -> bytes:
    """One chat-completion chunk of one token; every token event has the same length (the
    load generator checks replies by length)."""
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": f" w{i % 1000:03d}"}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
TOKEN_EVENTS = [token_event(i) for i in range(1000)]
EVENT_LENGTH = len(TOKEN_EVENTS[0])
assert all(len(e) == EVENT_LENGTH for e in TOKEN_EVENTS)


def stream_length(tokens: int) -> int:
    """Bytes of the body of a stream of ``tokens`` tokens."""
    return tokens * EVENT_LENGTH + len(DONE_EVENT)


def first_request_tokens(user: int, users: int, tokens: int) -> int:
    """The length of user ``user``'s first request: spread over 1..tokens so that the
    streams' ends (and the next requests' starts) are spread out from the start."""
    return 1 + (user * tokens) // users


def request_body(tokens: int) -> bytes:
    return orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": tokens,
            "stream": True,
        }
    )


# ---- the upstream ---------------------------------------------------------------------------

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)
MODELS = orjson.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
)


def _json_reply(body: bytes, status: bytes = b"200 OK") -> bytes:
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (status, len(body))
        + body
    )


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Pacer:
    """The upstream's clock: every ``gap_s`` one token to every open stream (an engine's
    decode step); with no gap, each stream sends a token on every loop turn."""

    def __init__(self) -> None:
        self.gap_s = 0.02
        self.streams: set[UpstreamStream] = set()
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._next = 0.0

    def set_gap(self, gap_s: float) -> None:
        self.gap_s = gap_s
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if gap_s > 0:
            self._next = self._loop.time() + gap_s
            self._handle = self._loop.call_at(self._next, self._tick)

    def _tick(self) -> None:
        for stream in list(self.streams):
            stream.send_next()
        # On a fixed grid, not gap after the tick's end: a late tick does not slow the pace.
        self._next = max(self._next + self.gap_s, self._loop.time())
        self._handle = self._loop.call_at(self._next, self._tick)


class UpstreamStream:
    def __init__(self, conn: UpstreamProtocol, tokens: int) -> None:
        self.conn = conn
        self.left = tokens
        self.sent = 0

    def send_next(self) -> None:
        conn = self.conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            conn.end_stream(self)
            return
        if self.left > 0:
            transport.write(_frame(TOKEN_EVENTS[self.sent % 1000]))
            self.sent += 1
            self.left -= 1
            return
        transport.write(_frame(DONE_EVENT) + b"0\r\n\r\n")
        conn.end_stream(self)


class UpstreamProtocol(asyncio.Protocol):
    """One connection: requests answered in order (a request that arrives while a stream is
    being sent waits for its end, as HTTP/1.1 requires)."""

    def __init__(self, pacer: Pacer) -> None:
        import httptools

        self.pacer = pacer
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body = bytearray()
        self._pending: list[tuple[bytes, bytes, bytes]] = []
        self._stream: UpstreamStream | None = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._stream is not None:
            self.pacer.streams.discard(self._stream)
            self._stream = None

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = bytearray()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        self._pending.append((method, self._url, bytes(self._body)))
        if self._stream is None:
            self._answer_pending()

    def _answer_pending(self) -> None:
        while self._pending and self._stream is None and self.transport is not None:
            method, url, body = self._pending.pop(0)
            self._answer(method, url, body)

    def _answer(self, method: bytes, url: bytes, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        path, _, query = url.partition(b"?")
        if method == b"GET":
            if path == b"/bench/pace":  # the orchestrator's control, sent directly
                gap_ms = float(dict(q.split(b"=", 1) for q in query.split(b"&"))[b"gap_ms"])
                self.pacer.set_gap(gap_ms / 1000)
                transport.write(_json_reply(b"{}"))
            elif path == b"/v1/models":
                transport.write(_json_reply(MODELS))
            else:  # /health and whatever else a router probes: healthy, nothing to report
                transport.write(_json_reply(b"{}"))
            return
        if method != b"POST" or path != PATH.encode():
            transport.write(_json_reply(b'{"error": "not found"}', b"404 Not Found"))
            return
        payload = orjson.loads(body)
        # sglang-router re-serializes the body with max_tokens as max_completion_tokens.
        tokens = int(payload.get("max_completion_tokens") or payload.get("max_tokens") or 256)
        transport.write(STREAM_HEAD)
        self._stream = stream = UpstreamStream(self, tokens)
        if self.pacer.gap_s > 0:
            self.pacer.streams.add(stream)
        else:
            self._loop.call_soon(self._unpaced, stream)

    def _unpaced(self, stream: UpstreamStream) -> None:
        stream.send_next()
        if self._stream is stream:
            self._loop.call_soon(self._unpaced, stream)

    def end_stream(self, stream: UpstreamStream) -> None:
        self.pacer.streams.discard(stream)
        if self._stream is stream:
            self._stream = None
            self._answer_pending()


async def start_upstream(replicas: int) -> tuple[Pacer, list[asyncio.Server], list[int]]:
    """The upstream's listeners on ``replicas`` loopback ports, one pacer for them all."""
    loop = asyncio.get_running_loop()
    pacer = Pacer()
    pacer.set_gap(pacer.gap_s)
    sockets = [stack._bind_loopback() for _ in range(replicas)]
    servers = [
        await loop.create_server(lambda: UpstreamProtocol(pacer), sock=s, backlog=2048)
        for s in sockets
    ]
    return pacer, servers, [int(s.getsockname()[1]) for s in sockets]


async def serve_upstream(replicas: int) -> None:
    _, servers, ports = await start_upstream(replicas)
    sys.stdout.write("PORTS " + " ".join(map(str, ports)) + "\n")
    sys.stdout.flush()
    await stack._wait_for_termination()
    for server in servers:
        server.close()


# ---- the load generator ---------------------------------------------------------------------


class Counter:
    """Events received by every connection of a measurement."""

    def __init__(self) -> None:
        self.events = 0
        self.completed = 0
        self.errors = 0


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection; ``send()`` resolves with whether the reply was good."""

    def __init__(self, port: int, counter: Counter) -> None:
        import httptools

        self._port = port
        self._counter = counter
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._received = 0
        self._expected = 0
        self._newline = False  # the last body byte was a newline: an event may end next

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._received += len(body)
        # An event ends with a blank line; a read may split it between its two newlines.
        self._counter.events += body.count(b"\n\n") + (self._newline and body[:1] == b"\n")
        self._newline = body[-1:] == b"\n"

    def on_message_complete(self) -> None:
        good = self._parser.get_status_code() == 200 and self._received == self._expected
        self._counter.completed += 1
        self._counter.errors += not good
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(good)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection closed mid-request"))

    def send(self, tokens: int) -> asyncio.Future[bool]:
        assert self._transport is not None
        body = request_body(tokens)
        self._received = 0
        self._newline = False
        self._expected = stream_length(tokens)
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n"
            % (PATH.encode(), self._port, len(body))
            + body
        )
        return self._waiter

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


@dataclass
class Sample:
    tokens: int
    """Token events received in the window."""
    window_s: float
    tokens_per_s: float
    cpu_s: float
    """The router's CPU time in the window (its process tree); 0 for the direct path."""
    completed: int
    errors: int
    """Finished replies in the window with a wrong status or length, or cut."""

    @property
    def cpu_s_per_million(self) -> float:
        return self.cpu_s / self.tokens * 1e6 if self.tokens else math.nan

    @property
    def cores(self) -> float:
        return self.cpu_s / self.window_s if self.window_s else math.nan


async def measure(
    port: int,
    pid: int | None,
    concurrency: int,
    tokens: int,
    warmup: float,
    duration: float,
) -> Sample:
    """``concurrency`` closed-loop streams for ``warmup + duration`` seconds; what arrived in
    the last ``duration`` seconds and what the router (``pid``'s tree) spent meanwhile."""
    loop = asyncio.get_running_loop()
    counter = Counter()
    connections: list[StreamConnection] = []
    for _ in range(concurrency):  # one at a time: no SYN storm against a small backlog
        _, conn = await loop.create_connection(
            lambda: StreamConnection(port, counter), "127.0.0.1", port
        )
        connections.append(conn)
    cut = 0

    async def user(k: int, conn: StreamConnection) -> None:
        nonlocal cut
        n = first_request_tokens(k, concurrency, tokens)
        while True:
            try:
                await conn.send(n)
            except ConnectionError:
                cut += 1
                return
            n = tokens

    users = [asyncio.ensure_future(user(k, c)) for k, c in enumerate(connections)]
    try:
        await asyncio.sleep(warmup)
        cpu0 = stack.tree_cpu_seconds(pid) if pid else 0.0
        events0, completed0, errors0 = counter.events, counter.completed, counter.errors
        t0 = time.perf_counter()
        await asyncio.sleep(duration)
        t1 = time.perf_counter()
        events1, completed1, errors1 = counter.events, counter.completed, counter.errors
        cut_in_time = cut  # before the window's end: the router's doing, not the abort's
        cpu1 = stack.tree_cpu_seconds(pid) if pid else 0.0
    finally:
        for conn in connections:  # mid-stream: the router's cancellation is not measured
            conn.abort()
        for task in users:
            task.cancel()
        await asyncio.gather(*users, return_exceptions=True)
    completed = completed1 - completed0
    # Every completed reply carried a [DONE] event, which is no token.
    got = events1 - events0 - completed
    window = t1 - t0
    errors = errors1 - errors0 + cut_in_time
    return Sample(got, window, got / window, cpu1 - cpu0, completed, errors)


# ---- the orchestration ----------------------------------------------------------------------


@dataclass
class Settings:
    rounds: int
    warmup: float
    duration: float
    unpaced_warmup: float
    unpaced_duration: float
    concurrencies: tuple[int, ...]


FULL = Settings(3, 1.0, 3.0, 0.5, 2.0, (32, 128, 512))
QUICK = Settings(1, 0.5, 1.0, 0.3, 0.8, (32, 128))


@dataclass
class Target:
    name: str
    port: int
    pid: int | None
    child: Any = None  # what stop() is called on


@dataclass
class Cell:
    """One (router, mode, concurrency) cell: a sample per round."""

    samples: list[Sample] = field(default_factory=list)


class LoadGenerator:
    def __init__(self) -> None:
        self._child = stack.spawn("loadgen", "--role", "loadgen", stdin=True, script=__file__)

    def measure(
        self, target: Target, concurrency: int, tokens: int, warmup: float, duration: float
    ) -> Sample:
        proc = self._child.proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        cmd = {
            "port": target.port,
            "pid": target.pid,
            "concurrency": concurrency,
            "tokens": tokens,
            "warmup": warmup,
            "duration": duration,
        }
        proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator died:\n{self._child.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{target.name}: {answer['error']}")
        return Sample(**answer)

    def stop(self) -> None:
        if self._child.proc.stdin is not None:
            self._child.proc.stdin.close()
        self._child.stop()


def probe_stream(port: int, timeout: float = 60.0) -> None:
    """Until a short stream through ``port`` arrives whole (or raises)."""
    import http.client

    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", PATH, request_body(4), {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            conn.close()
            if response.status != 200 or len(data) != stream_length(4):
                raise RuntimeError(f"bad reply: {response.status}, {data[:200]!r}")
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def set_pace(port: int, gap_ms: float) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/pace?gap_ms={gap_ms}") as r:
        r.read()


def start_routers(
    upstream_ports: Sequence[int], workdir: Path, workers: Sequence[int], skipped: dict[str, str]
) -> list[Target]:
    urls = [f"http://127.0.0.1:{p}" for p in upstream_ports]
    targets: list[Target] = []
    fleet = workdir / "fleet.yaml"
    fleet.write_text(fleet_yaml(urls, MODEL))

    def launch(name: str, argv: list[str], port: Callable[[Started], int] | int) -> None:
        log_path = workdir / f"{name.replace(' ', '-')}.log"
        with log_path.open("wb") as out:
            proc = start_process(argv, out)
        started = Started(proc, log_path)
        try:
            p = port(started) if callable(port) else port
            probe_stream(p)
        except (OSError, RuntimeError) as exc:
            started.stop()
            skipped[name] = f"did not start: {exc}: {started.tail()}"
            stack.log(f"skipping {name}: {skipped[name]}")
            return
        targets.append(Target(name, p, proc.pid, started))

    for n in workers:
        launch(f"gpurouter w{n}", gpurouter_serve_argv(fleet, n),
               lambda s: front_door_port(s.log_path, s.proc))  # fmt: skip
    rust = rust_environment(stack.log)
    for kind in RUST:
        if rust is None:
            skipped[kind] = "the reference routers' environment could not be built"
            continue
        port = stack._free_port()
        argv = rust_router_argv(kind, RUST_POLICY, rust, port, urls, stack._free_port())
        launch(kind, argv, port)
    binary = bench_proxy.find_nginx()
    if binary is None:
        skipped[NGINX] = "nginx is not installed"
    else:
        nginx_dir = workdir / "nginx"
        nginx_dir.mkdir()
        os.chmod(workdir, 0o755)  # nginx's worker may run as another user: it reads here
        os.chmod(nginx_dir, 0o755)
        child = bench_proxy.spawn_nginx(binary, upstream_ports, str(nginx_dir))
        try:
            probe_stream(child.port, timeout=10)
            targets.append(Target(NGINX, child.port, child.proc.pid, child))
        except (OSError, RuntimeError) as exc:
            child.stop()
            skipped[NGINX] = f"did not start: {exc}"
    return targets


PACED, UNPACED = "paced", "unpaced"


def run_rounds(
    load: LoadGenerator,
    targets: list[Target],
    upstream_port: int,
    settings: Settings,
    args: argparse.Namespace,
) -> dict[tuple[str, str, int], Cell]:
    cells: dict[tuple[str, str, int], Cell] = {}
    by_name = {t.name: t for t in targets}
    grid = [(PACED, c) for c in settings.concurrencies] + [(UNPACED, args.max_concurrency)]
    k = 0
    for r in range(settings.rounds):
        stack.log(f"round {r + 1}/{settings.rounds}: load average {os.getloadavg()[0]:.2f}")
        for mode, concurrency in grid:
            set_pace(upstream_port, args.gap_ms if mode == PACED else 0)
            warmup, duration = (
                (settings.warmup, settings.duration)
                if mode == PACED
                else (settings.unpaced_warmup, settings.unpaced_duration)
            )
            for name in stack.rotated(list(by_name), k):
                sample = load.measure(by_name[name], concurrency, args.tokens, warmup, duration)
                cells.setdefault((name, mode, concurrency), Cell()).samples.append(sample)
                stack.log(
                    f"  {mode:<7} c={concurrency:<4} {name:<14} {sample.tokens_per_s:9,.0f} tok/s"
                    f"  CPU {sample.cpu_s_per_million:6.1f} s/M tokens"
                    f"  {sample.cores:4.2f} cores"
                    + (f"  ERRORS {sample.errors}" if sample.errors else "")
                )
                time.sleep(0.3)  # the aborted streams' cancellations, outside every window
            k += 1
    return cells


def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def summarize(cells: dict[tuple[str, str, int], Cell]) -> list[dict[str, Any]]:
    rows = []
    for (name, mode, c), cell in cells.items():
        row: dict[str, Any] = {
            "router": name,
            "mode": mode,
            "concurrency": c,
            "tokens_per_s": median([s.tokens_per_s for s in cell.samples]),
            "cpu_s_per_million_tokens": median([s.cpu_s_per_million for s in cell.samples]),
            "cores": median([s.cores for s in cell.samples]),
            "tokens_per_s_per_core": median(
                [s.tokens / s.cpu_s if s.cpu_s else math.nan for s in cell.samples]
            ),
            "errors": sum(s.errors for s in cell.samples),
            "rounds": len(cell.samples),
        }
        for rust in RUST:  # within each round, then the median: the machine's noise cancels
            other = cells.get((rust, mode, c))
            if other is not None and name != DIRECT:
                row[f"cpu_vs_{rust}"] = median(
                    [
                        s.cpu_s_per_million / o.cpu_s_per_million
                        for s, o in zip(cell.samples, other.samples, strict=True)
                    ]
                )
        rows.append(row)
    return rows


def gpus_fronted(cpu_s_per_million: float) -> dict[str, Any]:
    """How many GPUs of each kind one worker relays for at full load, from its CPU per token
    and the performance model's saturation throughput of one GPU."""
    from calibrate import CONVERSATION

    from router.perf import Deployment, default_catalog, saturation

    catalog = default_catalog()
    per_worker = WORKER_SHARE / (cpu_s_per_million / 1e6)
    out: dict[str, Any] = {
        "worker_share_of_core": WORKER_SHARE,
        "worker_tokens_per_s": per_worker,
        "model": GPU_MODEL,
        "mix": {
            "prompt_tokens": CONVERSATION.prompt_tokens,
            "output_tokens": CONVERSATION.output_tokens,
        },
        "gpus": {},
    }
    for gpu in GPU_KINDS:
        sat = saturation(Deployment(catalog.gpu(gpu), catalog.model(GPU_MODEL)), CONVERSATION)
        out["gpus"][gpu] = {
            "gpu_output_tokens_per_s": sat.output_tokens_per_s,
            # The pace of each stream on that GPU: measure at --gap-ms of this for its figure.
            "decode_step_ms": sat.step_seconds * 1000,
            "batch": sat.batch,
            "gpus_per_worker": per_worker / sat.output_tokens_per_s,
        }
    return out


def _f(x: float, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def format_tables(rows: list[dict[str, Any]], names: list[str], gap_ms: float, tokens: int) -> str:
    rank = {n: i for i, n in enumerate(names)}
    rows = sorted(rows, key=lambda r: (r["mode"] != PACED, r["concurrency"], rank[r["router"]]))
    lines = [
        f"Paced: {gap_ms:g} ms between tokens, {tokens} tokens a stream. Unpaced: every "
        "stream's next token on every loop turn of the upstream; a router then reads several "
        "events at once, so its CPU per token there is a floor, not what a paced engine costs.",
        "",
        "| mode | streams | router | tokens/s | router CPU s per M tokens | cores used "
        "| tokens/s per core | CPU vs vllm-router | CPU vs sglang-router | errors |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        direct = r["router"] == DIRECT
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {r['router']} | {_f(r['tokens_per_s'])} "
            f"| {'-' if direct else _f(r['cpu_s_per_million_tokens'], '{:.1f}')} "
            f"| {'-' if direct else _f(r['cores'], '{:.2f}')} "
            f"| {'-' if direct else _f(r['tokens_per_s_per_core'])} "
            f"| {_f(r.get('cpu_vs_vllm-router', math.nan), '{:.2f}')} "
            f"| {_f(r.get('cpu_vs_sglang-router', math.nan), '{:.2f}')} | {r['errors']} |"
        )
    return "\n".join(lines)


def format_gpus(g: dict[str, Any], concurrency: int, cpu: float) -> str:
    lines = [
        f"One gpurouter worker: {cpu:.1f} CPU s per million tokens (paced, {concurrency} "
        f"streams) -> {g['worker_tokens_per_s']:,.0f} tokens/s at {g['worker_share_of_core']:.0%} "
        f"of a core. GPUs it fronts at full load ({g['model']}, "
        f"{g['mix']['prompt_tokens']:g} prompt + {g['mix']['output_tokens']:g} output tokens, "
        "router.perf.saturation):",
        "",
        "| GPU | its output tokens/s at saturation | its step (batch) | GPUs one worker fronts |",
        "|---|--:|--:|--:|",
    ]
    for gpu, v in g["gpus"].items():
        lines.append(
            f"| {gpu} | {v['gpu_output_tokens_per_s']:,.0f} "
            f"| {v['decode_step_ms']:.0f} ms ({v['batch']}) | {v['gpus_per_worker']:.1f} |"
        )
    return "\n".join(lines)


def most_relayed(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each router's most tokens/s in a paced cell, and the cores it used there."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["mode"] != PACED or r["router"] == DIRECT:
            continue
        best = out.get(r["router"])
        if best is None or r["tokens_per_s"] > best["tokens_per_s"]:
            out[r["router"]] = {k: r[k] for k in ("concurrency", "tokens_per_s", "cores")}
    return out


def aims(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["router"] != GPUROUTER_1 or r["mode"] != PACED:
            continue
        for rust in RUST:
            ratio = r.get(f"cpu_vs_{rust}")
            if ratio is None or math.isnan(ratio):
                continue
            met = "met" if ratio <= 3 else "NOT met"
            out.append(
                f"aim, {r['concurrency']} streams: one worker's CPU per token {ratio:.2f}x "
                f"{rust}'s (<= 3x: {met})"
            )
    return out


def orchestrate(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    if args.rounds:
        settings = Settings(**{**asdict(settings), "rounds": args.rounds})
    if args.concurrency:
        settings = Settings(**{**asdict(settings), "concurrencies": tuple(args.concurrency)})
    started = time.monotonic()
    env = stack.environment()
    workdir = Path(tempfile.mkdtemp(prefix="bench-token-relay-"))
    skipped: dict[str, str] = {}
    upstream: Any = None
    targets: list[Target] = []
    load: LoadGenerator | None = None
    try:
        upstream = stack.spawn(
            "upstream", "--role", "upstream", "--replicas", str(args.replicas), script=__file__
        )
        assert upstream.proc.stdout is not None
        line = upstream.proc.stdout.readline().decode()
        if not line.startswith("PORTS "):
            raise RuntimeError(f"the upstream did not start:\n{upstream.log_tail()}")
        ports = [int(p) for p in line.split()[1:]]
        probe_stream(ports[0])
        targets = [Target(DIRECT, ports[0], None)]
        targets += start_routers(ports, workdir, args.workers, skipped)
        load = LoadGenerator()
        cells = run_rounds(load, targets, ports[0], settings, args)
    finally:
        if load is not None:
            load.stop()
        for target in targets:
            if target.child is not None:
                target.child.stop()
        if upstream is not None:
            upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    env["loadavg_at_end"] = os.getloadavg()
    rows = summarize(cells)
    names = [t.name for t in targets]
    top = max(settings.concurrencies)
    w1 = next(
        (
            r
            for r in rows
            if r["router"] == GPUROUTER_1 and r["mode"] == PACED and r["concurrency"] == top
        ),
        None,
    )
    gpus = gpus_fronted(w1["cpu_s_per_million_tokens"]) if w1 else None
    errors = sum(r["errors"] for r in rows)
    report = {
        "settings": asdict(settings),
        "gap_ms": args.gap_ms,
        "tokens_per_stream": args.tokens,
        "replicas": args.replicas,
        "elapsed_s": round(time.monotonic() - started, 1),
        "environment": env,
        "skipped": skipped,
        "results": rows,
        "gpus_one_worker_fronts": gpus,
        "most_relayed_paced": most_relayed(rows),
        "aims": aims(rows),
    }
    text = json.dumps(stack._nan_to_none(report), indent=2)
    if args.save:
        Path(args.save).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print(
            f"token relay: {settings.rounds} round(s), paced {settings.warmup} s warm-up + "
            f"{settings.duration} s, unpaced {settings.unpaced_warmup} + "
            f"{settings.unpaced_duration} s; {report['elapsed_s']:.0f} s in all; "
            f"{args.replicas} upstream ports; Python {env['python']}, {env['usable_cpus']} CPUs, "
            f"load average {env['loadavg_at_start'][0]:.2f} at start, "
            f"{env['loadavg_at_end'][0]:.2f} at end\n"
        )
        print(format_tables(rows, names, args.gap_ms, args.tokens))
        if gpus and w1:
            print()
            print(format_gpus(gpus, top, w1["cpu_s_per_million_tokens"]))
        print()
        for name, best in report["most_relayed_paced"].items():
            print(
                f"most relayed, paced: {name} {best['tokens_per_s']:,.0f} tokens/s "
                f"({best['concurrency']} streams, {best['cores']:.2f} cores)"
            )
        print("\n".join(report["aims"]))
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
    if errors:
        stack.log(f"WARNING: {errors} replies were wrong (status or length) or cut")
    return 1 if errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument(
        "--concurrency", type=int, action="append", help="paced streams (repeatable)"
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=64, help="streams of the unpaced measurement"
    )
    parser.add_argument("--gap-ms", type=float, default=20.0, help="paced: ms between tokens")
    parser.add_argument("--tokens", type=int, default=256, help="tokens a stream")
    parser.add_argument("--replicas", type=int, default=4, help="upstream ports (replicas)")
    parser.add_argument(
        "--workers", type=int, action="append", help="gpurouter --workers (default: 1 and 2)"
    )
    parser.add_argument("--role", choices=("bench", "upstream", "loadgen"), default="bench")
    args = parser.parse_args()
    args.workers = args.workers or [1, 2]
    if args.role == "bench":
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return orchestrate(args)
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        if args.role == "upstream":
            uvloop.run(serve_upstream(args.replicas))
        else:
            # Streams end later than plain replies: a wider margin past warm-up and window.
            uvloop.run(stack.loadgen_main(measure, margin_s=60.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
