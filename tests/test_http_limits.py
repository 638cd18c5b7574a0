"""The front door's connection limits (router/http/guard.py), over real loopback sockets:
hostile heads, silent and trickling clients, the connection cap, an oversized body sent by
the openai SDK, and what a client mid-request reads when the router shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from router.config.schema import ServerConfig
from router.http import guard
from router.http.server import RouterServer
from tests.http_support import MODEL, Spec, openai_client, routed

SPECS = (Spec("a"),)
LIMITS = ServerConfig(
    max_request_line_bytes=256,
    max_header_bytes=4096,
    max_headers=20,
    header_timeout_s=0.3,
    body_timeout_s=0.3,
)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def server() -> AsyncIterator[RouterServer]:
    async with routed(SPECS, server=LIMITS) as (router, _):
        yield router


_OPEN: list[Conn] = []


@pytest.fixture(autouse=True)
async def _close_connections() -> AsyncIterator[None]:
    yield
    for conn in _OPEN:
        conn.close()
        with contextlib.suppress(OSError):
            await conn.writer.wait_closed()
    _OPEN.clear()


class Conn:
    """One raw client connection to the front door (closed after its test)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, server: RouterServer) -> Conn:
        url = urlsplit(server.front_url)
        assert url.hostname is not None
        assert url.port is not None
        conn = cls(*await asyncio.open_connection(url.hostname, url.port))
        _OPEN.append(conn)
        return conn

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def answer(self, timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """The response's status, headers and body (read to the connection's end)."""
        raw = await asyncio.wait_for(self.reader.read(-1), timeout_s)
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        return int(lines[0].split()[1]), headers, body

    async def closed_without_answer(self, timeout_s: float = 10.0) -> bool:
        return await asyncio.wait_for(self.reader.read(-1), timeout_s) == b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()


def error_of(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= error.keys()
    return error


async def test_a_header_without_end_gets_431_and_the_connection_closes(
    server: RouterServer,
) -> None:
    conn = await Conn.open(server)
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Bomb: ")
    for _ in range(20):  # 20 x 1 KB: five times the limit, and no end of the header
        conn.send(b"a" * 1024)
    status, headers, body = await conn.answer()
    assert status == 431
    assert headers["connection"] == "close"
    assert "4096 bytes" in error_of(body)["message"]
    # The router still serves everyone else.
    client = openai_client(server)
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    await client.close()


async def test_a_head_too_large_after_a_kept_alive_request_gets_431(server: RouterServer) -> None:
    """The next request's head is counted from its first read, not from its second."""
    conn = await Conn.open(server)
    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(conn.reader.readuntil(b'{"status":"ok"}'), 5)
    conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Bomb: " + b"a" * 5000)
    status, _, body = await conn.answer()
    assert status == 431
    assert "4096 bytes" in error_of(body)["message"]


async def test_too_many_headers_get_431(server: RouterServer) -> None:
    conn = await Conn.open(server)
    fields = b"".join(b"X-F%d: 1\r\n" % i for i in range(21))
    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    status, _, body = await conn.answer()
    assert status == 431
    assert "more than 20 header fields" in error_of(body)["message"]


async def test_a_long_request_target_gets_414(server: RouterServer) -> None:
    conn = await Conn.open(server)
    conn.send(b"GET /health?" + b"q" * 300 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await conn.answer()
    assert status == 414
    assert error_of(body)["message"] == "the request target is longer than 256 bytes"


async def test_a_head_within_the_limits_is_served(server: RouterServer) -> None:
    conn = await Conn.open(server)
    fields = b"".join(b"X-F%d: 1\r\n" % i for i in range(17))
    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fields + b"\r\n")
    status, _, _ = await conn.answer()
    assert status == 200


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    server: RouterServer,
) -> None:
    conn = await Conn.open(server)
    assert await conn.closed_without_answer()


async def test_a_head_that_stops_coming_gets_408(server: RouterServer) -> None:
    conn = await Conn.open(server)
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    status, _, body = await conn.answer()
    assert status == 408
    assert error_of(body)["message"] == "the request head took longer than 0.3 s"


async def test_a_slowloris_head_gets_408_though_each_line_came_in_time(
    server: RouterServer,
) -> None:
    conn = await Conn.open(server)
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    answer = asyncio.ensure_future(conn.answer())
    for i in range(10):  # a line every 0.1 s: the head's clock runs from its first byte
        if answer.done():
            break
        conn.send(b"X-Slow-%d: 1\r\n" % i)
        await asyncio.sleep(0.1)
    status, _, _ = await answer
    assert status == 408


async def test_a_body_that_stops_coming_gets_408(server: RouterServer) -> None:
    conn = await Conn.open(server)
    conn.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model":'
    )
    status, _, body = await conn.answer()
    assert status == 408
    assert error_of(body)["message"] == "no part of the request body came for 0.3 s"
    assert not server.proxy.active


async def test_a_kept_alive_connection_serves_requests_after_idle_pauses(
    server: RouterServer,
) -> None:
    """The head's clock starts with a request's first byte, not at its connection's start."""
    conn = await Conn.open(server)
    for _ in range(2):
        conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        line = await asyncio.wait_for(conn.reader.readline(), 5)
        assert line.startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(conn.reader.readuntil(b'{"status":"ok"}'), 5)
        await asyncio.sleep(0.2)  # idle, under the keep-alive time


async def test_the_openai_sdk_reads_413_for_a_body_too_large() -> None:
    """It sends the whole body before it reads: closing at once would reset its connection
    (APIConnectionError); the router answers, then reads the rest away."""
    async with routed(SPECS, server=ServerConfig(max_body_bytes=1024 * 1024)) as (server, _):
        client = openai_client(server)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x" * (8 * 1024 * 1024)}]
            )
        await client.close()
    assert caught.value.status_code == 413
    assert "larger than 1048576 bytes" in caught.value.message


async def test_at_the_connection_cap_a_new_client_replaces_the_longest_idle_one() -> None:
    settings = ServerConfig(max_connections=4, header_timeout_s=0)
    async with routed(SPECS, server=settings) as (server, _):
        idle = [await Conn.open(server) for _ in range(4)]
        await asyncio.sleep(0.05)
        client = openai_client(server)
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
        await client.close()
        assert await idle[0].closed_without_answer()


async def test_at_the_connection_cap_with_every_connection_busy_a_new_one_gets_503() -> None:
    settings = ServerConfig(max_connections=2, header_timeout_s=0, body_timeout_s=0)
    async with routed(SPECS, server=settings) as (server, _):
        busy = [await Conn.open(server) for _ in range(2)]
        for conn in busy:  # each mid-request: its body never ends
            conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
        await asyncio.sleep(0.05)
        late = await Conn.open(server)
        status, headers, body = await late.answer()
        assert status == 503
        assert headers["retry-after"] == "1"
        assert error_of(body)["message"] == "the router has too many open connections"


def test_the_connection_cap_leaves_room_in_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 1,024 files and 514 upstream connections allowed, 448 are left for clients."""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    limits = guard.ConnectionLimits.from_config(ServerConfig(), upstream_connections=514)
    assert limits.max_connections == 1024 - 512 - 64
    roomy = guard.ConnectionLimits.from_config(ServerConfig(max_connections=100), 514)
    assert roomy.max_connections == 100


async def test_a_client_mid_body_at_shutdown_reads_a_json_503_and_stop_returns() -> None:
    settings = ServerConfig(body_timeout_s=0)
    async with routed(SPECS, server=settings) as (server, _):
        conn = await Conn.open(server)
        conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
        await asyncio.sleep(0.05)
        await asyncio.wait_for(server.stop(grace_s=0.2), 10)
        status, headers, body = await conn.answer()
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert error_of(body)["code"] == "shutting_down"


async def test_the_limits_answers_are_counted_on_metrics(server: RouterServer) -> None:
    conn = await Conn.open(server)
    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-F: 1\r\n" * 21 + b"\r\n")
    status, _, _ = await conn.answer()
    assert status == 431
    text = (await asyncio.to_thread(_get, server.front_url + "/metrics")).decode()
    line = 'gpurouter_http_responses_total{reason="too_large",route="connection",status="431"}'
    assert f"{line} 1.0" in text


async def test_accepted_connections_send_without_waiting_for_acks(server: RouterServer) -> None:
    """Plain asyncio sets no TCP_NODELAY on accepted sockets: uvicorn's separate head and
    body writes then waited 40 ms for the client's delayed ACK on every answer."""
    conn = await Conn.open(server)
    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(conn.reader.readuntil(b'{"status":"ok"}'), 5)
    front = server._servers[0]
    (accepted,) = front.server_state.connections
    sock = accepted.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body: bytes = answer.read()
        return body
