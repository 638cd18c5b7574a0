"""How much latency each HTTP stack adds on the proxy hot path, under concurrency.

    python bench/bench_http_stack.py            # the full run (about 4.5 minutes on 2 cores)
    python bench/bench_http_stack.py --quick    # a 1-round smoke run (under a minute)
    python bench/bench_http_stack.py --json     # the same figures as JSON
    python bench/bench_http_stack.py --save r.json  # the table, and the JSON (per round) to a file

Four kinds of process, each in its own subprocess on a loopback port the OS picked:

- an **upstream**: a zero-work OpenAI-like server (a raw uvloop protocol) answering
  ``POST /v1/chat/completions`` with a fixed chat completion, or, for ``"stream": true``,
  20 SSE chunks and ``data: [DONE]``, each chunk its own HTTP chunk on its own loop turn;
- **proxies**: one per (server, client) pair. Servers: uvicorn (uvloop + httptools, a raw
  ASGI app), aiohttp.web, granian (ASGI). Clients: httpx, httpx2, httpx over the aiohttp
  transport of ``httpx-aiohttp``, aiohttp. Each proxy parses the body once (orjson), forwards
  the original bytes over a warm keep-alive pool and relays the reply chunk by chunk;
- a **load generator**: closed loop on uvloop with a raw HTTP/1.1 client (httptools parser),
  one keep-alive connection per simulated user; it checks every reply's status and length.

A short **pilot** measures the whole cross product (concurrency 1 and 32, non-streaming) and
picks the fastest-looking server and client (geometric mean of req/s). The **main rounds**
then measure every client behind that server, every server with that client, and the direct
baseline (load generator to upstream), at concurrency 1, 32 and 256, streaming and not. Each
round interleaves the variants (in a rotated order) so that a noisy neighbour on the shared
machine hits all of them alike; "added" latency and the throughput ratio are taken against
the direct baseline of the same round, and the table shows medians over rounds. The last
column is the proxy's CPU time (its process and any worker it forks, from /proc) per request,
warm-up included: on a shared 2-core machine it is steadier than latency.

The direct baseline is a ceiling rather than a typical server: both ends are raw protocols,
so no Python HTTP stack comes near its non-streaming throughput. Every measurement is bounded
(``--quick``: 0.2 s warm-up + 0.4 s, full: 0.5 s + 1.5 s, and at most 1,500 / 6,000 requests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.client
import importlib.metadata
import json
import math
import os
import platform
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol, cast

import orjson

PATH = "/v1/chat/completions"
SERVERS = ("uvicorn", "aiohttp.web", "granian")
CLIENTS = ("httpx", "httpx2", "httpx-aiohttp", "aiohttp")
DIRECT = "direct"
CONCURRENCIES = (1, 32, 256)
POOL_SIZE = 512  # upstream connections per proxy: more than the highest concurrency
KEEPALIVE_S = 30.0  # longer than a round, so pools stay warm between a variant's turns
UPSTREAM_TIMEOUT_S = 30.0
STREAM_CHUNKS = 20
LIBRARIES = (
    "aiohttp",
    "anyio",
    "granian",
    "httpcore",
    "httpcore2",
    "httptools",
    "httpx",
    "httpx-aiohttp",
    "httpx2",
    "orjson",
    "uvicorn",
    "uvloop",
)

# --- the fixed payloads ---------------------------------------------------------------------

REQUEST_BODY = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "max_tokens": 16,
}
COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there, how are you?"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21},
    }
)


def _sse_event(i: int) -> bytes:
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


SSE_EVENTS = [_sse_event(i) for i in range(STREAM_CHUNKS)] + [b"data: [DONE]\n\n"]
EXPECTED_LENGTH = {False: len(COMPLETION), True: sum(len(e) for e in SSE_EVENTS)}


def request_body(stream: bool) -> bytes:
    return orjson.dumps({**REQUEST_BODY, "stream": stream})


# --- the upstream: a raw asyncio protocol ---------------------------------------------------

NON_STREAM_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(COMPLETION) + COMPLETION
)
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)
STREAM_FRAMES = [b"%x\r\n%s\r\n" % (len(e), e) for e in SSE_EVENTS]
STREAM_FRAMES[0] = STREAM_HEAD + STREAM_FRAMES[0]
STREAM_FRAMES[-1] += b"0\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class UpstreamProtocol(asyncio.Protocol):
    """Answers each request on a keep-alive connection; streams one SSE chunk per loop turn."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._streaming:
            self._answer_buffered()

    def _answer_buffered(self) -> None:
        transport = self._transport
        assert transport is not None
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self._buffer[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:  # this server takes Content-Length bodies only, as the clients send
                transport.write(BAD_REQUEST)
                transport.close()
                return
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : line_end if line_end >= 0 else None])
            total = end + 4 + length
            if len(self._buffer) < total:
                return
            body = bytes(self._buffer[end + 4 : total])
            del self._buffer[:total]
            if orjson.loads(body).get("stream") is True:
                self._streaming = True
                self._send_frame(0)
                return
            transport.write(NON_STREAM_RESPONSE)

    def _send_frame(self, i: int) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(STREAM_FRAMES[i])
        if i + 1 < len(STREAM_FRAMES):
            self._loop.call_soon(self._send_frame, i + 1)
        else:
            self._streaming = False
            self._answer_buffered()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve_upstream(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, sock=sock, backlog=1024)
    await _wait_for_termination()
    server.close()
    await server.wait_closed()


# --- proxy clients: one interface over four libraries ---------------------------------------


@dataclass
class UpstreamReply:
    status: int
    content_type: str
    content_length: str | None
    chunks: AsyncIterator[bytes]


class Forwarder(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def forward(self, body: bytes) -> contextlib.AbstractAsyncContextManager[UpstreamReply]: ...


FORWARD_HEADERS = {"content-type": "application/json"}


class HttpxForwarder:
    """httpx, httpx2 and httpx over the aiohttp transport share this API."""

    def __init__(self, library: str, url: str) -> None:
        self._library = library
        self._url = url
        self._client: Any = None

    async def start(self) -> None:
        module: Any  # httpx and httpx2: the same API under two names
        if self._library == "httpx2":
            import httpx2  # type: ignore[import-not-found,unused-ignore]  # benchmark-only

            module = httpx2
        else:
            import httpx

            module = httpx
        limits = module.Limits(
            max_connections=POOL_SIZE,
            max_keepalive_connections=POOL_SIZE,
            keepalive_expiry=KEEPALIVE_S,
        )
        client_class: Any = module.AsyncClient
        if self._library == "httpx-aiohttp":  # an httpx.AsyncClient on aiohttp's connection pool
            from httpx_aiohttp import (  # type: ignore[import-not-found,unused-ignore]  # bench-only
                HttpxAiohttpClient,
            )

            client_class = HttpxAiohttpClient
        self._client = client_class(limits=limits, timeout=UPSTREAM_TIMEOUT_S)

    async def close(self) -> None:
        await self._client.aclose()

    @contextlib.asynccontextmanager
    async def forward(self, body: bytes) -> AsyncIterator[UpstreamReply]:
        request = self._client.build_request(
            "POST", self._url, content=body, headers=FORWARD_HEADERS
        )
        response = await self._client.send(request, stream=True)
        try:
            yield UpstreamReply(
                response.status_code,
                response.headers.get("content-type", "application/octet-stream"),
                response.headers.get("content-length"),
                response.aiter_raw(),
            )
        finally:
            await response.aclose()


class AiohttpForwarder:
    def __init__(self, url: str) -> None:
        self._url = url
        self._session: Any = None

    async def start(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=POOL_SIZE, keepalive_timeout=KEEPALIVE_S)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S),
        )

    async def close(self) -> None:
        await self._session.close()

    @contextlib.asynccontextmanager
    async def forward(self, body: bytes) -> AsyncIterator[UpstreamReply]:
        async with self._session.post(self._url, data=body, headers=FORWARD_HEADERS) as response:
            yield UpstreamReply(
                response.status,
                response.headers.get("content-type", "application/octet-stream"),
                response.headers.get("content-length"),
                response.content.iter_any(),
            )


def make_forwarder(client: str, upstream_url: str) -> Forwarder:
    if client == "aiohttp":
        return AiohttpForwarder(upstream_url)
    return HttpxForwarder(client, upstream_url)


def parse_chat_request(body: bytes) -> dict[str, Any] | None:
    """The router's one parse of the body: what it needs to route (model, stream)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
        return None
    return payload


# --- proxy servers ---------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ProxyASGI:
    """A raw ASGI proxy app (no framework), for uvicorn and granian."""

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._forwarder.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._forwarder.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST" or scope["path"] != PATH:
            await _asgi_reply(send, 404)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if parse_chat_request(body) is None:
            await _asgi_reply(send, 400)
            return
        async with self._forwarder.forward(body) as reply:
            headers = [(b"content-type", reply.content_type.encode())]
            if reply.content_length is not None:
                headers.append((b"content-length", reply.content_length.encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            async for chunk in reply.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _asgi_reply(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def granian_app() -> ProxyASGI:
    """Granian's factory target: it imports this module in its worker process."""
    return ProxyASGI(make_forwarder(os.environ["BENCH_CLIENT"], os.environ["BENCH_UPSTREAM"]))


async def serve_aiohttp_web(forwarder: Forwarder, sock: socket.socket) -> None:
    from aiohttp import web

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if parse_chat_request(body) is None:
            return web.Response(status=400)
        async with forwarder.forward(body) as reply:
            response = web.StreamResponse(
                status=reply.status, headers={"Content-Type": reply.content_type}
            )
            if reply.content_length is not None:
                response.content_length = int(reply.content_length)
            await response.prepare(request)
            async for chunk in reply.chunks:
                await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post(PATH, proxy)
    await forwarder.start()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=1024).start()
    await _wait_for_termination()
    await runner.cleanup()
    await forwarder.close()


def run_proxy(server: str, client: str, upstream_port: int, port: int) -> None:
    upstream_url = f"http://127.0.0.1:{upstream_port}{PATH}"
    if server == "granian":  # binds its own socket: the parent asked the OS for a free port
        # granian, httpx2 and httpx-aiohttp are benchmark-only: not project dependencies, so
        # their imports may be missing where mypy runs (hence the ignores).
        from granian import Granian  # type: ignore[import-not-found,unused-ignore]
        from granian.constants import (  # type: ignore[import-not-found,unused-ignore]
            HTTPModes,
            Interfaces,
            Loops,
        )

        os.environ["BENCH_CLIENT"] = client
        os.environ["BENCH_UPSTREAM"] = upstream_url
        _announce(port)
        Granian(
            "bench_http_stack:granian_app",
            factory=True,
            address="127.0.0.1",
            port=port,
            interface=Interfaces.ASGI,
            workers=1,
            runtime_threads=1,
            loop=Loops.uvloop,
            http=HTTPModes.http1,
            websockets=False,
            backlog=1024,
            log_enabled=False,
        ).serve()
        return
    sock = _bind_loopback()
    _announce(sock.getsockname()[1])
    forwarder = make_forwarder(client, upstream_url)
    if server == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            ProxyASGI(forwarder),
            loop="uvloop",
            http="httptools",
            lifespan="on",
            access_log=False,
            log_level="warning",
            backlog=1024,
        )
        uvicorn.Server(config).run(sockets=[sock])
    else:
        import uvloop

        uvloop.run(serve_aiohttp_web(forwarder, sock))


# --- the load generator ----------------------------------------------------------------------


class LoadConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; ``send()`` resolves with whether the reply was good."""

    def __init__(self, request: bytes, expected_length: int) -> None:
        import httptools

        self._request = request
        self._expected_length = expected_length
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._received += len(body)

    def on_message_complete(self) -> None:
        good = self._parser.get_status_code() == 200 and self._received == self._expected_length
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(good)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection closed mid-request"))

    def send(self) -> asyncio.Future[bool]:
        assert self._transport is not None
        self._received = 0
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(self._request)
        return self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    count: int  # requests in the measured window
    errors: int
    total: int  # requests in all, warm-up included (to share out the proxy's CPU time)
    cpu_us_per_request: float = math.nan  # filled in by the parent for proxies


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def measure(
    port: int, stream: bool, concurrency: int, warmup: float, duration: float, cap: int
) -> Sample:
    loop = asyncio.get_running_loop()
    body = request_body(stream)
    request = (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (PATH.encode(), port, len(body)) + body
    )
    connections: list[LoadConnection] = []
    for _ in range(concurrency):  # one at a time: no SYN storm against a small backlog
        _, conn = await loop.create_connection(
            lambda: LoadConnection(request, EXPECTED_LENGTH[stream]), "127.0.0.1", port
        )
        connections.append(conn)
    latencies: list[float] = []
    errors = 0
    total = 0
    last_end = 0.0
    record_from = time.perf_counter() + warmup
    record_until = record_from + duration

    async def user(conn: LoadConnection) -> None:
        nonlocal errors, total, last_end
        while True:
            start = time.perf_counter()
            if start >= record_until or len(latencies) >= cap:
                return
            good = await conn.send()
            end = time.perf_counter()
            total += 1
            if start >= record_from:
                latencies.append(end - start)
                errors += not good
                last_end = max(last_end, end)

    try:
        await asyncio.gather(*(user(c) for c in connections))
    finally:
        for conn in connections:
            conn.close()
    if not latencies:
        return Sample(0.0, math.nan, math.nan, 0, errors, total)
    latencies.sort()
    return Sample(
        rps=len(latencies) / max(last_end - record_from, 1e-9),
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        count=len(latencies),
        errors=errors,
        total=total,
    )


async def loadgen_main(
    measure: Callable[..., Awaitable[Any]] = measure, margin_s: float = 20.0
) -> None:
    """Reads one JSON command a line on stdin, answers one JSON sample a line on stdout
    (``measure(**command)``, given the command's warm-up and duration plus ``margin_s``)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        cmd = json.loads(line)
        limit = cmd["warmup"] + cmd["duration"] + margin_s
        try:
            sample = await asyncio.wait_for(measure(**cmd), timeout=limit)
            answer: dict[str, Any] = asdict(sample)
        except (OSError, TimeoutError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


# --- child process helpers -------------------------------------------------------------------


def _bind_loopback() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _announce(port: int) -> None:
    sys.stdout.write(f"PORT {port}\n")
    sys.stdout.flush()


async def _wait_for_termination() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    port: int = 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own group: granian's worker too
                self.proc.wait()
        self.log.close()

    def log_tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]


def spawn(name: str, *args: str, stdin: bool = False, script: str = __file__) -> Child:
    """``script`` (this file unless another bench's) in the role ``args`` give it."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    log = tempfile.TemporaryFile()  # noqa: SIM115  # the Child closes it in stop()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(script), *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    return Child(name, proc, log)


def read_port(child: Child, timeout: float = 30.0) -> int:
    assert child.proc.stdout is not None
    ready, _, _ = select.select([child.proc.stdout], [], [], timeout)
    line = child.proc.stdout.readline() if ready else b""
    if not line.startswith(b"PORT "):
        raise RuntimeError(f"{child.name} did not start:\n{child.log_tail()}")
    return int(line.split()[1])


def probe(port: int, timeout: float = 30.0) -> None:
    """Waits until the server answers both kinds of request correctly (or raises)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for stream in (False, True):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("POST", PATH, request_body(stream), FORWARD_HEADERS)
                response = conn.getresponse()
                data = response.read()
                conn.close()
                if response.status != 200 or len(data) != EXPECTED_LENGTH[stream]:
                    raise RuntimeError(f"bad reply: {response.status}, {len(data)} bytes")
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants (granian's worker)."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending.extend(int(child) for child in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


@dataclass
class Target:
    """Where the load goes; ``pid`` is the proxy whose CPU time is shared out per request."""

    port: int
    pid: int | None = None


class LoadGenerator:
    def __init__(self) -> None:
        self._child = spawn("loadgen", "--role", "loadgen", stdin=True)

    def measure(
        self,
        target: Target,
        stream: bool,
        concurrency: int,
        warmup: float,
        duration: float,
        cap: int,
    ) -> Sample:
        proc = self._child.proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        cpu_before = tree_cpu_seconds(target.pid) if target.pid else 0.0
        cmd = {
            "port": target.port,
            "stream": stream,
            "concurrency": concurrency,
            "warmup": warmup,
            "duration": duration,
            "cap": cap,
        }
        proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator died:\n{self._child.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"load generator on port {target.port}: {answer['error']}")
        sample = Sample(**answer)
        if target.pid and sample.total:
            cpu = tree_cpu_seconds(target.pid) - cpu_before
            sample.cpu_us_per_request = cpu / sample.total * 1e6
        return sample

    def stop(self) -> None:
        if self._child.proc.stdin is not None:
            self._child.proc.stdin.close()
        self._child.stop()


# --- the orchestration -----------------------------------------------------------------------


@dataclass
class Settings:
    rounds: int
    warmup: float
    duration: float
    cap: int
    pilot_warmup: float
    pilot_duration: float


FULL = Settings(rounds=3, warmup=0.5, duration=1.5, cap=6000, pilot_warmup=0.3, pilot_duration=0.8)
QUICK = Settings(
    rounds=1, warmup=0.2, duration=0.4, cap=1500, pilot_warmup=0.15, pilot_duration=0.3
)


def variant_name(server: str, client: str) -> str:
    return f"{server} + {client}"


@dataclass
class Cell:
    """One (variant, concurrency, stream) cell: a sample per round, plus the round's direct."""

    samples: list[Sample] = field(default_factory=list)
    direct: list[Sample] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        med = statistics.median
        pairs = list(zip(self.samples, self.direct, strict=True))
        return {
            "rps": med(s.rps for s in self.samples),
            "p50_ms": med(s.p50_ms for s in self.samples),
            "p99_ms": med(s.p99_ms for s in self.samples),
            "added_p50_ms": med(s.p50_ms - d.p50_ms for s, d in pairs),
            "added_p99_ms": med(s.p99_ms - d.p99_ms for s, d in pairs),
            "rps_vs_direct": med(s.rps / d.rps for s, d in pairs),
            "proxy_cpu_us_per_request": med(s.cpu_us_per_request for s in self.samples),
            "requests": sum(s.count for s in self.samples),
            "errors": sum(s.errors for s in self.samples),
        }


def rotated(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return items[by:] + items[:by]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in values))


def run_pilot(
    load: LoadGenerator, targets: dict[str, Target], settings: Settings
) -> tuple[str, str, dict[str, dict[str, float]]]:
    """The cross product at concurrency 1 and 32 (non-streaming): which server, which client."""
    rps: dict[str, dict[str, float]] = {name: {} for name in targets}
    for i, concurrency in enumerate((1, 32)):
        for name in rotated(list(targets), i):
            sample = load.measure(
                targets[name],
                False,
                concurrency,
                settings.pilot_warmup,
                settings.pilot_duration,
                settings.cap,
            )
            rps[name][f"c{concurrency}"] = sample.rps
            log(f"  pilot c={concurrency:<3} {name:<30} {sample.rps:8.0f} req/s")
    names = list(targets)
    servers = {s for s in SERVERS if any(n.startswith(s + " ") for n in names)}
    clients = {c for c in CLIENTS if any(n.endswith(" " + c) for n in names)}

    def score(group: list[str]) -> float:
        return geomean([v for n in group for v in rps[n].values()])

    best_server = max(servers, key=lambda s: score([n for n in names if n.startswith(s + " ")]))
    best_client = max(clients, key=lambda c: score([n for n in names if n.endswith(" " + c)]))
    return best_server, best_client, rps


def run_rounds(
    load: LoadGenerator,
    targets: dict[str, Target],
    settings: Settings,
    budget_s: float,
    started: float,
) -> tuple[dict[tuple[str, int, bool], Cell], int]:
    cells: dict[tuple[str, int, bool], Cell] = {}
    grid = [(c, s) for c in CONCURRENCIES for s in (False, True)]
    names = list(targets)
    round_s = 0.0
    done = 0
    for r in range(settings.rounds):
        elapsed = time.monotonic() - started
        if done and elapsed + round_s > budget_s:
            log(
                f"stopping after {done} rounds: the next one would pass the {budget_s:.0f} s budget"
            )
            break
        round_start = time.monotonic()
        for g, (concurrency, stream) in enumerate(grid):
            samples: dict[str, Sample] = {}
            for name in rotated(names, r * len(grid) + g):
                samples[name] = sample = load.measure(
                    targets[name],
                    stream,
                    concurrency,
                    settings.warmup,
                    settings.duration,
                    settings.cap,
                )
                log(
                    f"  round {r + 1}/{settings.rounds} c={concurrency:<3} "
                    f"stream={stream!s:<5} {name:<30} {sample.rps:8.0f} req/s "
                    f"p50 {sample.p50_ms:7.2f} ms  p99 {sample.p99_ms:7.2f} ms"
                    + (f"  ERRORS {sample.errors}" if sample.errors else "")
                )
            for name, sample in samples.items():
                cell = cells.setdefault((name, concurrency, stream), Cell())
                cell.samples.append(sample)
                cell.direct.append(samples[DIRECT])
        round_s = time.monotonic() - round_start
        done += 1
    return cells, done


def environment() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "loadavg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": versions,
    }


def ms(value: float, sign: str = "") -> str:
    """Milliseconds with about three significant digits."""
    digits = 3 if abs(value) < 1 else 2 if abs(value) < 100 else 1
    return f"{value:{sign}.{digits}f}"


def format_table(
    cells: dict[tuple[str, int, bool], Cell], variants: list[str], first_column: str = "variant"
) -> list[str]:
    lines = [
        f"| {first_column} | concurrency | stream | req/s | p50 ms | p99 ms "
        "| added p50 | added p99 | req/s vs direct | proxy CPU us/req |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for concurrency in CONCURRENCIES:
        for stream in (False, True):
            for name in variants:
                cell = cells.get((name, concurrency, stream))
                if cell is None:
                    continue
                s = cell.summary()
                direct = name == DIRECT
                added = "-" if direct else ms(s["added_p50_ms"], "+")
                added99 = "-" if direct else ms(s["added_p99_ms"], "+")
                cpu = "-" if direct else f"{s['proxy_cpu_us_per_request']:.0f}"
                lines.append(
                    f"| {name} | {concurrency} | {'yes' if stream else 'no'} | {s['rps']:,.0f} "
                    f"| {ms(s['p50_ms'])} | {ms(s['p99_ms'])} | {added} | {added99} "
                    f"| {s['rps_vs_direct']:.2f} | {cpu} |"
                )
    return lines


def format_pilot(pilot: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| server + client | req/s at c=1 | req/s at c=32 |", "|---|--:|--:|"]
    for name, rps in sorted(pilot.items(), key=lambda kv: -kv[1].get("c32", 0.0)):
        lines.append(f"| {name} | {rps.get('c1', 0):,.0f} | {rps.get('c32', 0):,.0f} |")
    return lines


def render_text(
    report: dict[str, Any], cells: dict[tuple[str, int, bool], Cell], variants: list[str]
) -> str:
    settings, env = report["settings"], report["environment"]
    lines = [
        f"HTTP stack: {report['rounds_done']} round(s), {settings['duration']} s per "
        f"measurement after {settings['warmup']} s warm-up, {report['elapsed_s']:.0f} s in all; "
        f"Python {env['python']}, {env['usable_cpus']} CPUs, load average "
        f"{env['loadavg_at_start'][0]:.2f} at start, {env['loadavg_at_end'][0]:.2f} at end",
        "",
        "Pilot (non-streaming, one pass each):",
        "",
        *format_pilot(report["pilot"]),
        "",
        f"Main rounds (server {report['best_server']}, client {report['best_client']}; "
        "medians over rounds):",
        "",
        *format_table(cells, variants),
    ]
    lines += [f"\nskipped {name}: {why}" for name, why in report["skipped"].items()]
    return "\n".join(lines)


def _nan_to_none(value: Any) -> Any:
    """JSON has no NaN: direct runs have no proxy CPU figure."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_none(v) for v in value]
    return value


def available(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def orchestrate(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    if args.rounds:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    started = time.monotonic()
    env = environment()
    skipped: dict[str, str] = {}
    modules = {"httpx2": "httpx2", "httpx-aiohttp": "httpx_aiohttp", "granian": "granian"}
    clients = [c for c in CLIENTS if c not in modules or available(modules[c])]
    servers = [s for s in SERVERS if s not in modules or available(modules[s])]
    for name in (*CLIENTS, *SERVERS):
        if name not in clients and name not in servers:
            skipped[name] = "not installed"

    children: list[Child] = []
    load: LoadGenerator | None = None
    try:
        upstream = spawn("upstream", "--role", "upstream")
        children.append(upstream)
        upstream.port = read_port(upstream)
        probe(upstream.port)
        load = LoadGenerator()

        log(f"starting {len(servers) * len(clients)} proxies")
        proxies: dict[str, Child] = {}
        for server in servers:
            for client in clients:
                name = variant_name(server, client)
                args_ = ["--role", "proxy", "--server", server, "--client", client]
                args_ += ["--upstream-port", str(upstream.port)]
                if server == "granian":
                    args_ += ["--port", str(_free_port())]
                proxies[name] = child = spawn(name, *args_)
                children.append(child)
        for name, child in list(proxies.items()):
            try:
                child.port = read_port(child)
                probe(child.port)
            except (OSError, RuntimeError, http.client.HTTPException) as exc:
                skipped[name] = f"failed to start or answer: {exc}"
                log(f"skipping {name}: {exc}")
                child.stop()
                del proxies[name]

        log("pilot: the cross product at c=1 and c=32, non-streaming")
        best_server, best_client, pilot = run_pilot(
            load, {n: Target(c.port, c.proc.pid) for n, c in proxies.items()}, settings
        )
        log(f"fastest-looking server: {best_server}; client: {best_client}")
        chosen = [variant_name(best_server, c) for c in clients]
        chosen += [variant_name(s, best_client) for s in servers if s != best_server]
        chosen = [n for n in chosen if n in proxies]
        for name, child in proxies.items():
            if name not in chosen:
                child.stop()

        targets = {DIRECT: Target(upstream.port)}
        targets |= {n: Target(proxies[n].port, proxies[n].proc.pid) for n in chosen}
        cells, rounds_done = run_rounds(load, targets, settings, args.budget, started)
    finally:
        if load is not None:
            load.stop()
        for child in children:
            child.stop()

    env["loadavg_at_end"] = os.getloadavg()
    errors = sum(cell.summary()["errors"] for cell in cells.values())
    report = {
        "settings": asdict(settings),
        "rounds_done": rounds_done,
        "elapsed_s": round(time.monotonic() - started, 1),
        "environment": env,
        "skipped": skipped,
        "pilot": pilot,
        "best_server": best_server,
        "best_client": best_client,
        "results": [
            {
                "variant": n,
                "concurrency": c,
                "stream": s,
                **cell.summary(),
                "rounds": [asdict(x) for x in cell.samples],
            }
            for (n, c, s), cell in cells.items()
        ],
    }
    text = json.dumps(_nan_to_none(report), indent=2)
    if args.save:
        with open(args.save, "w") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
    else:
        print(render_text(report, cells, list(targets)))
    if errors:
        log(f"WARNING: {errors} replies were wrong (status or length)")
    return 1 if errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quick", action="store_true", help="a 1-round smoke run (< 60 s)")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument(
        "--budget", type=float, default=330.0, help="start no round that would end after this"
    )
    # the roles of the child processes
    parser.add_argument(
        "--role", choices=("bench", "upstream", "proxy", "loadgen"), default="bench"
    )
    parser.add_argument("--server", choices=SERVERS)
    parser.add_argument("--client", choices=CLIENTS)
    parser.add_argument("--upstream-port", type=int)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    if args.role == "bench":
        return orchestrate(args)
    import uvloop

    if args.role == "upstream":
        sock = _bind_loopback()
        _announce(sock.getsockname()[1])
        uvloop.run(serve_upstream(sock))
    elif args.role == "loadgen":
        uvloop.run(loadgen_main())
    else:
        run_proxy(args.server, args.client, args.upstream_port, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
