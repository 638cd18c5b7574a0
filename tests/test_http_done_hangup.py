"""A stream that reached ``data: [DONE]`` is a success, whatever the client does next,
unless the replica's own error event came before it.

Clients (the openai SDK among them) stop reading at ``[DONE]`` and may close the connection
at once, before the replica has ended its chunked body. The router notices the hang-up and
must not count the request as failed: the client got all of it. But vLLM ends a stream whose
engine core died with an error event and then ``[DONE]``: that request failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from aiohttp import web

from router.core import Outcome
from router.http.server import RouterServer
from tests.http_support import MODEL, QUIET_HEALTH, Spec
from tests.test_emulator_support import fleet_config, until

_EVENTS = (
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"a"}]}\n\n',
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"b"}]}\n\n',
    b"data: [DONE]\n\n",
)


class HeldEnd:
    """A replica that streams a whole answer, ``[DONE]`` included, and ends its body only
    when told: the one ordering of events (hang-up before the replica's end) that a real
    engine gives only now and then. It speaks as vLLM does on the wire; the emulator cannot
    hold its end, so the test orders the race here instead of hoping for it."""

    def __init__(self, events: tuple[bytes, ...] = _EVENTS) -> None:
        self.events = events
        self.release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in self.events:
            await response.write(event)
        await self.release.wait()
        await response.write_eof()
        return response

    async def _models(self, _: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _health(self, _: web.Request) -> web.StreamResponse:
        return web.Response()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@asynccontextmanager
async def behind_router(upstream: HeldEnd) -> AsyncIterator[RouterServer]:
    config = fleet_config(Spec("a"))
    node = config.nodes[0]
    replica = dataclasses.replace(node.replicas[0], endpoint=upstream.url)
    config = dataclasses.replace(
        config,
        nodes=(dataclasses.replace(node, replicas=(replica,)),),
        router=dataclasses.replace(config.router, health=QUIET_HEALTH),
    )
    server = RouterServer(config, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0)


async def read_to_done_and_hang_up(client: httpx.AsyncClient, url: str) -> list[str]:
    """Read a stream up to ``data: [DONE]`` and close the connection there."""
    body = {"model": MODEL, "prompt": "p", "max_tokens": 2, "stream": True}
    events: list[str] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
            if line == "data: [DONE]":
                break  # leaving the block closes the unfinished response's connection
    return events


async def test_a_hang_up_after_done_while_the_replica_is_still_ending_is_a_success() -> None:
    upstream = HeldEnd()
    await upstream.start()
    try:
        async with behind_router(upstream) as server:
            server.proxy.watch_after_s = 0.0  # watch the client from the start
            async with httpx.AsyncClient(timeout=10) as client:
                events = await read_to_done_and_hang_up(client, server.front_url)
            assert events[-1] == "data: [DONE]"
            # The replica still holds its end, so only the hang-up can end the handler.
            await until(lambda: not server.proxy.active, timeout=5)
            upstream.release.set()
            assert server.core.outcomes == {Outcome.COMPLETED: 1}
            assert not server.core.running
    finally:
        await upstream.stop()


_DIED = (
    _EVENTS[0],
    b'data: {"error": {"message": "EngineCore encountered an issue.", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\n',
    b"data: [DONE]\n\n",
)


async def test_a_stream_with_the_replicas_error_event_before_done_is_a_failure() -> None:
    """As vLLM ends a stream whose engine core was killed: the client gets the error event
    and [DONE] as sent; the router counts a failed request and a failure of the replica."""
    upstream = HeldEnd(_DIED)
    upstream.release.set()
    await upstream.start()
    try:
        async with behind_router(upstream) as server:
            async with httpx.AsyncClient(timeout=10) as client:
                events = await read_to_done_and_hang_up(client, server.front_url)
            await until(lambda: not server.proxy.active, timeout=5)
            assert events[1].startswith('data: {"error"')
            assert events[-1] == "data: [DONE]"
            assert server.core.outcomes == {Outcome.FAILED: 1}
            assert server.health.failures == [1]
    finally:
        await upstream.stop()
