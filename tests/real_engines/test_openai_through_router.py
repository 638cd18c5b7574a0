"""The real OpenAI client through a real gpurouter router in front of two real vLLM engines:
completions and chat, streamed and not, usage with and without ``include_usage``, and the
engine's own status and error body for a bad request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from router.core import Outcome
from router.http.server import RouterServer
from router.lab import Lab
from tests.real_engines.lab_router import fleet_of, openai_client, routed

# Random weights rarely produce the end-of-text token, but may: ignore_eos makes every length
# exactly what was asked.
FIXED = {"ignore_eos": True}


@pytest.fixture
async def server(vllm_lab: Lab) -> AsyncIterator[RouterServer]:
    async with routed(fleet_of(vllm_lab)) as router:
        yield router


@pytest.mark.real_engine_smoke
async def test_completions_and_chat_through_the_router(vllm_lab: Lab, server: RouterServer) -> None:
    client = openai_client(server)
    text = await client.completions.create(
        model=vllm_lab.model, prompt="hello", max_tokens=5, extra_body=FIXED
    )
    chat = await client.chat.completions.create(
        model=vllm_lab.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_body=FIXED,
    )
    await client.close()
    assert text.usage is not None
    assert text.usage.completion_tokens == 5
    assert text.choices[0].finish_reason == "length"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 3
    assert server.core.outcomes[Outcome.COMPLETED] == 2


async def test_a_chat_stream_with_usage_ends_with_a_usage_chunk(
    vllm_lab: Lab, server: RouterServer
) -> None:
    client = openai_client(server)
    stream = await client.chat.completions.create(
        model=vllm_lab.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=FIXED,
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    assert server.core.outcomes[Outcome.COMPLETED] == 1


async def test_a_completion_stream_without_usage_has_none(
    vllm_lab: Lab, server: RouterServer
) -> None:
    client = openai_client(server)
    stream = await client.completions.create(
        model=vllm_lab.model, prompt="hello", max_tokens=6, stream=True, extra_body=FIXED
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    assert all(c.usage is None for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert server.core.outcomes[Outcome.COMPLETED] == 1


ENGINE_REFUSES = [
    # (path, body): requests the router passes on and the engine refuses with a 400 of its own.
    ("/v1/completions", {"prompt": "hello", "max_tokens": 3, "temperature": -1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}),
]
ROUTER_REFUSES = [
    # (path, body, what the message says): requests the router itself refuses, before any
    # replica sees them, with the status the engine would give and an OpenAI-style body.
    ("/v1/completions", {"prompt": "hello", "max_tokens": 100_000}, "100002 tokens"),
    ("/v1/chat/completions", {"messages": "not a list", "max_tokens": 3}, "messages"),
]


@pytest.mark.parametrize(("path", "body"), ENGINE_REFUSES)
async def test_an_engines_refusal_reaches_the_client_as_the_engine_said_it(
    vllm_lab: Lab, server: RouterServer, path: str, body: dict[str, Any]
) -> None:
    """Status, error type and code are the engine's, and the OpenAI client raises the error
    that status means."""
    request = {"model": vllm_lab.model, **body}
    async with httpx.AsyncClient(timeout=30) as http:
        direct = await http.post(vllm_lab.engines[0].url + path, json=request)
        routed_ = await http.post(server.front_url + path, json=request)
    assert direct.status_code == 400
    assert routed_.status_code == direct.status_code
    error, expected = routed_.json()["error"], direct.json()["error"]
    assert (error["type"], error["code"]) == (expected["type"], expected["code"])
    assert error["message"]
    await _raises_bad_request(server, path, request)


@pytest.mark.parametrize(("path", "body", "says"), ROUTER_REFUSES)
async def test_what_the_router_refuses_itself_gets_the_engines_status(
    vllm_lab: Lab, server: RouterServer, path: str, body: dict[str, Any], says: str
) -> None:
    request = {"model": vllm_lab.model, **body}
    async with httpx.AsyncClient(timeout=30) as http:
        direct = await http.post(vllm_lab.engines[0].url + path, json=request)
        routed_ = await http.post(server.front_url + path, json=request)
    assert routed_.status_code == direct.status_code == 400
    error = routed_.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert says in error["message"]
    await _raises_bad_request(server, path, request)


async def _raises_bad_request(server: RouterServer, path: str, request: dict[str, Any]) -> None:
    client = openai_client(server)
    create = client.completions.create if "chat" not in path else client.chat.completions.create
    with pytest.raises(openai.BadRequestError) as raised:
        await create(**request)
    await client.close()
    assert raised.value.status_code == 400
