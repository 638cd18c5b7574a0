"""The emulated replica's OpenAI-compatible API: bodies, streams, errors, models, metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from router.config.schema import FleetConfig
from router.emulator import EmulatedFleet
from router.emulator.tokens import filler_text
from router.errors import ConfigError
from tests.test_emulator_support import (
    MODEL,
    TIME_SCALE,
    Spec,
    any_ports,
    completion,
    fleet_config,
    json_chunks,
    metric,
    scrape,
    sse_events,
)

SPECS = (Spec("a100"), Spec("tiny-kv", kv_capacity=2048, max_context=4096))


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    emulated = EmulatedFleet(fleet_config(*SPECS), time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with emulated:
        yield emulated


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as c:
        yield c


async def test_completion_counts_prompt_by_characters_and_stops_at_max_tokens(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body = {"model": MODEL, "prompt": "x" * 401, "max_tokens": 7}
    response = await client.post(fleet.url("a100") + "/v1/completions", json=body)
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "text_completion"
    assert data["id"].startswith("cmpl-")
    assert data["model"] == MODEL
    assert data["usage"] == {
        "prompt_tokens": 101,
        "completion_tokens": 7,
        "total_tokens": 108,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    (choice,) = data["choices"]
    assert choice["text"] == filler_text(7)
    assert choice["finish_reason"] == "length"


async def test_chat_counts_all_messages_and_honours_max_completion_tokens(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    messages = [
        {"role": "system", "content": "s" * 40},
        {"role": "user", "content": [{"type": "text", "text": "u" * 40}]},
    ]
    body = {"model": MODEL, "messages": messages, "max_completion_tokens": 5, "max_tokens": 50}
    response = await client.post(fleet.url("a100") + "/v1/chat/completions", json=body)
    data = response.json()
    assert data["object"] == "chat.completion"
    usage = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
    assert data["usage"] == usage | {
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    message = data["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == filler_text(5)
    # What vLLM fills only for features the emulator lacks is there, and null.
    extras = {"annotations", "audio", "function_call", "reasoning", "refusal"}
    assert {k: v for k, v in message.items() if k not in ("role", "content")} == dict.fromkeys(
        extras
    )


async def test_hint_sets_both_lengths_and_an_early_end_is_a_stop(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body = completion(prompt_tokens=900, output_tokens=12, max_tokens=40)
    data = (await client.post(fleet.url("a100") + "/v1/completions", json=body)).json()
    assert data["usage"]["prompt_tokens"] == 900
    assert data["usage"]["completion_tokens"] == 12
    assert data["choices"][0]["finish_reason"] == "stop"


async def test_output_length_without_max_tokens_is_drawn_from_the_seed(
    client: httpx.AsyncClient,
) -> None:
    """Two emulators with the same seed give the same lengths to the same requests."""
    lengths = []
    for _ in range(2):
        emulated = EmulatedFleet(
            fleet_config(SPECS[0]), time_scale=1000, seed=3, ports=any_ports(SPECS[:1])
        )
        async with emulated:
            url = emulated.url("a100") + "/v1/completions"
            body = {"model": MODEL, "prompt": "hi"}
            runs = [(await client.post(url, json=body)).json() for _ in range(3)]
        lengths.append([r["usage"]["completion_tokens"] for r in runs])
    assert lengths[0] == lengths[1]
    assert all(n >= 1 for n in lengths[0])


async def test_stream_sends_one_chunk_per_token_and_ends_with_done(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body = completion(50, 6, max_tokens=6, stream=True)
    async with client.stream("POST", fleet.url("a100") + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = "".join([t async for t in r.aiter_text()])
    chunks = json_chunks(sse_events(raw))
    assert len(chunks) == 6
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == filler_text(6)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert all("usage" not in c for c in chunks)


async def test_chat_stream_opens_with_the_role_and_ends_with_a_usage_chunk(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "abcd" * 10}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = fleet.url("a100") + "/v1/chat/completions"
    async with client.stream("POST", url, json=body) as r:
        raw = "".join([t async for t in r.aiter_text()])
    chunks = json_chunks(sse_events(raw))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-1]
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == filler_text(4)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks[:-1])  # as vLLM: only the last carries it
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}


async def test_models_lists_the_served_model_and_health_is_ok(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    models = (await client.get(fleet.url("tiny-kv") + "/v1/models")).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 4096
    assert (await client.get(fleet.url("tiny-kv") + "/health")).status_code == 200


def _body(**fields: object) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", **fields}).encode()


@pytest.mark.parametrize(
    ("replica", "body", "status", "kind", "param"),
    [
        # A body its schema refuses: "Bad Request", where from the body down (as vLLM).
        pytest.param("a100", b"{not json", 400, "Bad Request", "body.1", id="malformed"),
        pytest.param("a100", b'["a list"]', 400, "Bad Request", "body", id="not-an-object"),
        pytest.param("a100", _body(model=5), 400, "Bad Request", "body.model", id="model-a-number"),
        pytest.param("a100", _body(stream="yes"), 400, "Bad Request", "body.stream", id="stream"),
        # A value the engine refuses, or a model it lacks.
        pytest.param("a100", _body(prompt=None), 400, "BadRequestError", "prompt", id="no-prompt"),
        pytest.param(
            "a100", _body(max_tokens=0), 400, "BadRequestError", "max_tokens", id="zero-max-tokens"
        ),
        pytest.param("a100", _body(model="gpt-4o"), 404, "NotFoundError", "model", id="unknown"),
        pytest.param(
            "a100",
            _body(model="gpt-4o", max_tokens=0),
            404,
            "NotFoundError",
            "model",
            id="the-model-is-checked-first",
        ),
        pytest.param(
            "tiny-kv",
            _body(max_tokens=4096),
            400,
            "BadRequestError",
            "max_tokens",
            id="over-max-context",
        ),
        pytest.param(
            "tiny-kv",
            _body(prompt="x" * 20_000),
            400,
            "BadRequestError",
            "input_tokens",
            id="prompt-over-max-context",
        ),
        pytest.param(
            "tiny-kv",
            _body(max_tokens=3000),
            400,
            "BadRequestError",
            "max_tokens",
            id="over-kv-capacity",
        ),
    ],
)
async def test_bad_requests_answer_vllms_error_body(
    fleet: EmulatedFleet,
    client: httpx.AsyncClient,
    replica: str,
    body: bytes,
    status: int,
    kind: str,
    param: str | None,
) -> None:
    """As vLLM: the type says what refused it, the code is the status."""
    url = fleet.url(replica) + "/v1/completions"
    response = await client.post(url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert (error["type"], error["param"], error["code"]) == (kind, param, status)


async def test_a_request_naming_no_model_gets_the_served_one(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body = {"prompt": "hi", "max_tokens": 2}
    response = await client.post(fleet.url("a100") + "/v1/completions", json=body)
    assert response.status_code == 200
    assert response.json()["model"] == MODEL


async def test_metrics_carry_vllm_names_and_count_tokens(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    base = fleet.url("a100")
    await client.post(base + "/v1/completions", json=completion(300, 20, max_tokens=20))
    await client.post(base + "/v1/completions", json=completion(100, 5, max_tokens=5))
    text = await scrape(client, base)
    label = f'{{engine="0",model_name="{MODEL}"}}'
    assert metric(text, "vllm:prompt_tokens_total" + label) == 400
    assert metric(text, "vllm:generation_tokens_total" + label) == 25
    assert metric(text, "vllm:time_to_first_token_seconds_count" + label) == 2
    assert metric(text, "vllm:e2e_request_latency_seconds_count" + label) == 2
    assert metric(text, "vllm:num_requests_running" + label) == 0
    assert metric(text, "vllm:num_requests_waiting" + label) == 0
    assert metric(text, "vllm:kv_cache_usage_perc" + label) == 0


def test_an_endpoint_off_loopback_is_refused_with_a_clear_error() -> None:
    config = fleet_config(Spec("remote"), endpoint_host="10.0.0.5")
    with pytest.raises(ConfigError, match="not on this machine's loopback"):
        EmulatedFleet(config)


def test_naming_a_replica_the_fleet_lacks_is_a_config_error() -> None:
    config: FleetConfig = fleet_config(Spec("a"))
    with pytest.raises(ConfigError, match="no replica 'b'"):
        EmulatedFleet(config, replicas=["b"])


async def test_unknown_routes_and_methods_answer_in_json_as_vllm(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    missing = await client.get(fleet.url("a100") + "/v1/no-such-route")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    wrong = await client.get(fleet.url("a100") + "/v1/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    assert wrong.headers["allow"] == "POST"
