"""The front door with the real OpenAI client: completions and chat, streamed and not; the
probes, the model list, metrics, and the request-id and replica headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from router.config.schema import HealthConfig, ServerConfig
from router.control import Drain
from router.core import Outcome
from router.http.server import RouterServer
from router.request import Priority
from tests.http_support import MODEL, Spec, hint, openai_client, routed
from tests.recorder import Recorder
from tests.test_emulator_support import metric

SPECS = (Spec("a"), Spec("b"))


@pytest.fixture
async def server() -> AsyncIterator[RouterServer]:
    async with routed(SPECS) as (router, _):
        yield router


async def test_completion_and_chat_through_the_openai_client(server: RouterServer) -> None:
    client = openai_client(server)
    text = await client.completions.create(
        model=MODEL, prompt="hello", max_tokens=5, extra_body=hint(10, 5)
    )
    assert text.usage is not None
    assert text.usage.completion_tokens == 5
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    await client.close()
    assert server.core.outcomes[Outcome.COMPLETED] == 2


async def test_streams_arrive_chunk_by_chunk_through_the_openai_client(
    server: RouterServer,
) -> None:
    client = openai_client(server)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    contents = [c.choices[0].delta.content for c in chunks if c.choices]
    assert len(contents) >= 6  # the role chunk, then one per token
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert server.core.outcomes[Outcome.COMPLETED] == 1


async def test_a_stream_is_relayed_before_the_replica_has_finished(server: RouterServer) -> None:
    """SSE is passed through as it comes: the first event arrives while the replica is still
    generating (never buffered whole)."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 5000, "stream": True, **hint(10, 5000)}
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream("POST", server.front_url + "/v1/completions", json=body) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                break
        assert len(server.core.running) == 1  # still generating upstream
    await asyncio.wait_for(_until_idle(server), 5)


async def _until_idle(server: RouterServer) -> None:
    while server.core.running:
        await asyncio.sleep(0.005)


async def test_the_response_names_the_replica_and_echoes_the_request_id(
    server: RouterServer,
) -> None:
    client = openai_client(server)
    raw = await client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=2, extra_headers={"X-Request-ID": "req-42"}
    )
    made = await client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=2)
    await client.close()
    assert raw.headers["x-request-id"] == "req-42"
    assert raw.headers["x-gpurouter-replica"] in {"a", "b"}
    assert made.headers["x-request-id"]  # made up by the router when the client sent none
    assert made.headers["x-request-id"] != "req-42"


async def test_request_id_priority_and_session_reach_upstream_and_the_core() -> None:
    """The request id is forwarded to the replica; X-Priority and X-Session-ID set the core's
    priority and affinity key; the body is forwarded byte for byte."""
    seen: list[tuple[dict[str, str], bytes]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.read()))
        return web.json_response({"id": "x", "object": "text_completion", "choices": []})

    app = web.Application()
    app.router.add_post("/v1/completions", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with routed(SPECS[:1]) as (server, _):
        server.proxy.bases[0] = f"http://127.0.0.1:{port}"
        recorder = Recorder()
        server.core.listeners.append(recorder)
        body = b'{"model": "%s",  "prompt": "hi"}' % MODEL.encode()
        async with httpx.AsyncClient() as client:
            response = await client.post(
                server.front_url + "/v1/completions",
                content=body,
                headers={"X-Request-ID": "abc", "X-Priority": "high", "X-Session-ID": "s1"},
            )
    await runner.cleanup()
    assert response.status_code == 200
    ((headers, forwarded),) = seen
    assert headers["X-Request-ID"] == "abc"
    assert forwarded == body
    (request,) = [a.request for a in recorder.assigned]
    assert request.priority is Priority.HIGH
    assert request.affinity_key == "s1"


async def test_models_health_ready_and_metrics(server: RouterServer) -> None:
    client = openai_client(server)
    models = await client.models.list()
    await client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    await client.close()
    assert [m.id for m in models.data] == [MODEL]
    async with httpx.AsyncClient(base_url=server.front_url) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/ready")).json() == {"ready": True, "active": 2, "answering": 2}
        text = (await http.get("/metrics")).text
        server.control.apply(Drain("a"))
        server.control.apply(Drain("b"))
        assert (await http.get("/ready")).status_code == 503
    assert metric(text, 'gpurouter_requests_total{outcome="completed"}') == 1
    # Not streamed: its first byte was the whole answer, no time to first token
    # (tests/test_first_token.py).
    assert total(text, "gpurouter_ttft_seconds_count") == 0
    assert total(text, "gpurouter_e2e_latency_seconds_count") == 1
    assert metric(text, 'gpurouter_replica_state{replica="a",state="active"}') == 1
    assert 'gpurouter_strategy_info{strategy="shortest-expected-delay"} 1.0' in text
    for name in (
        "gpurouter_queue_depth",
        "gpurouter_imbalance_factor",
        "gpurouter_replica_in_flight",
        'gpurouter_queue_depth_by_priority{priority="high"}',
        'gpurouter_retries_total{replica="a"}',
    ):
        metric(text, name)


async def test_ready_is_false_while_no_replica_answers_its_health_check() -> None:
    """Replicas still in service (not yet ejected) whose servers are gone cannot take a
    request: a failed health check each makes /ready 503; one answer makes it 200 again."""
    health = HealthConfig(check_interval_s=0.0, eject_after_failures=5)
    async with routed(SPECS, health=health) as (server, emu):
        for spec in SPECS:
            await emu.kill(spec.id)
        await server.health.check()
        async with httpx.AsyncClient(base_url=server.front_url) as http:
            down = await http.get("/ready")
            await emu.revive("b")
            await server.health.check()
            up = await http.get("/ready")
    assert down.status_code == 503
    assert down.json() == {"ready": False, "active": 2, "answering": 0}
    assert up.json() == {"ready": True, "active": 2, "answering": 1}


async def test_ready_is_false_once_every_replica_failed_its_last_request() -> None:
    """Without health checks, the requests themselves tell: after one that every replica
    failed (a 502 for the client), /ready is 503."""
    async with routed(SPECS) as (server, emu):
        for spec in SPECS:
            await emu.kill(spec.id)
        async with httpx.AsyncClient(base_url=server.front_url) as http:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            failed = await http.post("/v1/completions", json=body)
            ready = await http.get("/ready")
    assert failed.status_code == 502
    assert ready.status_code == 503
    assert ready.json() == {"ready": False, "active": 2, "answering": 0}


def total(text: str, name: str) -> float:
    """The sum of every sample called ``name``, whatever its labels."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


async def test_the_server_reads_each_replicas_engine_metrics() -> None:
    """With an engine-metrics interval, every replica's /metrics lands in Replica.engine."""
    polling = HealthConfig(
        check_interval_s=0.0, eject_after_failures=0, engine_metrics_interval_s=0.05
    )
    async with routed(SPECS, health=polling) as (server, _):
        for _ in range(200):
            if all(r.engine is not None for r in server.core.pool):
                break
            await asyncio.sleep(0.01)
        assert {r.engine.engine for r in server.core.pool if r.engine is not None} == {"vllm"}
        assert all(r.engine is not None for r in server.core.pool)


def test_the_front_door_outlives_client_pools_idle_connections() -> None:
    # A client pool that keeps an idle connection longer than the server races the server's
    # close: a request sent at that moment gets no answer. aiohttp keeps one 15 s, httpx 5 s.
    assert ServerConfig().client_keepalive_s > 15


async def test_the_front_door_keeps_an_idle_connection_for_the_configured_time() -> None:
    async with routed(SPECS, server=ServerConfig(client_keepalive_s=1)) as (router, _):
        host, port = router.front_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for _ in range(2):  # the same connection answers again while it is in use
                writer.write(b"GET /health HTTP/1.1\r\nHost: gpurouter\r\n\r\n")
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                await reader.readexactly(_content_length(head))
            # Then left idle, the front door closes it once client_keepalive_s has passed
            # (uvicorn's own default would keep it 5 s, past this wait).
            assert await asyncio.wait_for(reader.read(), timeout=4.5) == b""
        finally:
            writer.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no content-length in {head!r}")
