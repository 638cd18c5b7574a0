"""Every refusal of the front door is an OpenAI-style JSON error with the status a client
expects, never a traceback."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from router.config.schema import QueueConfig, ServerConfig
from router.control import Eject
from router.core import Outcome
from router.http.server import RouterServer
from tests.http_support import MODEL, Spec, hint, openai_client, routed

ONE = (Spec("a"),)


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert "Traceback" not in error["message"]
    return dict(error)


async def post(server: RouterServer, body: Any, **kw: Any) -> httpx.Response:
    """POST a JSON-able body, or raw bytes, or an async iterator of bytes (sent chunked)."""
    async with httpx.AsyncClient(timeout=10) as client:
        url = server.front_url + "/v1/chat/completions"
        if isinstance(body, dict):
            return await client.post(url, json=body, **kw)
        return await client.post(url, content=body, **kw)


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "%s"}' % MODEL.encode(), "messages"),
        (b'{"model": "%s", "messages": [], "max_tokens": 2}' % MODEL.encode(), "messages"),
        (
            b'{"model": "%s", "messages": [{"role": "user"}], "max_tokens": 0}' % MODEL.encode(),
            "max_tokens",
        ),
        (
            b'{"model": "%s", "messages": [{"role": "user"}], "stream": "yes"}' % MODEL.encode(),
            "stream",
        ),
    ],
)
async def test_malformed_json_and_missing_fields_are_400(body: bytes, param: str | None) -> None:
    async with routed(ONE) as (server, _):
        response = await post(server, body)
        assert_openai_error(response, 400, "invalid_request")
        assert response.json()["error"]["param"] == param
        assert not server.core.outcomes  # never reached the core


async def test_a_bad_priority_header_is_400() -> None:
    async with routed(ONE) as (server, _):
        response = await post(server, CHAT, headers={"X-Priority": "urgent"})
        assert_openai_error(response, 400, "invalid_priority")


async def test_an_unknown_model_is_404_and_the_openai_client_reads_it() -> None:
    async with routed(ONE) as (server, _):
        response = await post(server, {**CHAT, "model": "gpt-9"})
        error = assert_openai_error(response, 404, "model_not_found")
        assert MODEL in error["message"]  # says what is served
        client = openai_client(server)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="gpt-9", messages=[{"role": "user", "content": "x"}]
            )
        await client.close()


async def test_a_body_over_the_limit_is_413() -> None:
    async with routed(ONE, server=ServerConfig(max_body_bytes=2048)) as (server, _):
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
        assert_openai_error(await post(server, big), 413, "request_too_large")

        async def chunked() -> Any:  # no Content-Length: the limit holds while reading
            yield b'{"model": "m", "prompt": "'
            for _ in range(10):
                yield b"y" * 512
            yield b'"}'

        response = await post(server, chunked())
        assert_openai_error(response, 413, "request_too_large")


async def test_a_full_queue_is_429_with_retry_after() -> None:
    """One slot, one place in the queue: the third request at once is refused."""
    queue = QueueConfig(size=1, default_deadline_s=30)
    async with routed(ONE, batch_size=1, queue=queue, time_scale=20) as (server, _):
        long = {**CHAT, "max_tokens": 4000, **hint(10, 4000)}
        first = asyncio.create_task(post(server, long))
        second = asyncio.create_task(post(server, long))
        await _until(lambda: len(server.core.running) == 1 and len(server.core.queue) == 1)
        response = await post(server, CHAT)
        assert_openai_error(response, 429, "queue_full")
        assert int(response.headers["retry-after"]) >= 1
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def test_a_deadline_that_passes_in_the_queue_is_504() -> None:
    queue = QueueConfig(size=8, default_deadline_s=0.2)
    async with routed(ONE, batch_size=1, queue=queue, time_scale=20) as (server, emulated):
        await emulated.hang("a")  # the one slot stays taken
        blocker = asyncio.create_task(post(server, CHAT))
        await _until(lambda: len(server.core.running) == 1)
        response = await post(server, CHAT)
        assert_openai_error(response, 504, "deadline_exceeded")
        assert server.core.outcomes[Outcome.EXPIRED] == 1
        blocker.cancel()
        await asyncio.gather(blocker, return_exceptions=True)
        await emulated.heal("a")


async def test_no_healthy_replica_is_503() -> None:
    async with routed(ONE) as (server, _):
        server.control.apply(Eject("a"))
        response = await post(server, CHAT)
        assert_openai_error(response, 503, "no_healthy_replica")


async def test_a_request_no_replica_can_hold_is_400() -> None:
    async with routed((Spec("a", max_context=4096),)) as (server, _):
        response = await post(server, {**CHAT, "max_tokens": 100_000})
        error = assert_openai_error(response, 400, "context_length_exceeded")
        assert "100001 tokens" in error["message"]


async def test_unknown_routes_and_wrong_methods_answer_in_json() -> None:
    async with routed(ONE) as (server, _), httpx.AsyncClient(base_url=server.front_url) as c:
        assert_openai_error(await c.get("/v2/nothing"), 404, "not_found")
        response = await c.get("/v1/chat/completions")
        assert_openai_error(response, 405, "method_not_allowed")
        assert response.headers["allow"] == "POST"


async def _until(condition: Any, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.002)

    await asyncio.wait_for(wait(), timeout)


@pytest.mark.parametrize(
    "rid",
    # 4,000 characters: well below any limit on a header's size, so this check answers.
    ["x" * 129, "x" * 4000, "two words", "tab\there", "caf\u00e9"],
    ids=["129", "4000", "space", "tab", "latin-1"],
)
async def test_a_request_id_too_long_or_of_other_characters_is_400_and_not_forwarded(
    rid: str,
) -> None:
    async with routed(ONE) as (server, _):
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                server.front_url + "/v1/chat/completions",
                json=CHAT,
                headers=[(b"x-request-id", rid.encode("latin-1"))],
            )
        error = assert_openai_error(response, 400, "invalid_request_id")
        assert error["param"] == "X-Request-ID"
        assert "x-request-id" not in response.headers  # not echoed either
        assert not server.core.outcomes  # never reached the core, nor a replica


async def test_a_request_id_of_128_printable_characters_is_taken() -> None:
    rid = "r" * 100 + "-_.:/+=@!~" + "9" * 18
    async with routed(ONE) as (server, _):
        response = await post(server, CHAT, headers={"X-Request-ID": rid})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == rid
