"""A real engine is measured from the chat streams running on it before any of them
completes, and what the router measures is what the engine's own token counters say it did."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

from router.capacity import WEIGHT_PRIOR_EVIDENCE_S, Source, stream_cost
from router.lab import Engine, Lab
from tests.real_engines.lab_router import (
    admin_state,
    counter,
    engine_metrics,
    fleet_of,
    openai_client,
    replica_state,
    routed,
)

STREAMS = 4
MAX_TOKENS = 1500
"""Far more than the test waits for: no stream completes while it looks."""
TOKENS_SEEN = 20
"""Content chunks every stream has relayed before the router's figure is read."""
RUN_S = 2 * WEIGHT_PRIOR_EVIDENCE_S
"""Seconds the streams have run before the router's figure is read: the stand-in for a card
the model does not know weighs as much as a second of the streams' evidence, and on a host
with bf16 the slow engine streams 20 tokens in a third of a second."""


async def _counters(engine: Engine) -> tuple[float, float]:
    """The engine's prompt and generated tokens so far (``vllm:*_tokens_total``)."""
    page = await engine_metrics(engine)
    return counter(page, "vllm:prompt_tokens_total"), counter(page, "vllm:generation_tokens_total")


async def _stream(client: AsyncOpenAI, model: str, seen: asyncio.Event) -> None:
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=MAX_TOKENS,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            tokens += 1
            if tokens >= TOKENS_SEEN:
                seen.set()


async def test_the_slow_engine_is_measured_from_its_streams_before_any_completes(
    vllm_lab: Lab,
) -> None:
    slow = vllm_lab.engines[1]
    async with routed(fleet_of(vllm_lab, [slow])) as server:
        core = server.core
        replica = core.replica(slow.name)
        factor = core.settings.cost.prompt_factor
        client = openai_client(server)
        prompt_before, generated_before = await _counters(slow)
        started = core.clock()
        seen = [asyncio.Event() for _ in range(STREAMS)]
        tasks = [asyncio.create_task(_stream(client, vllm_lab.model, e)) for e in seen]
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in seen)), 120.0)
            await asyncio.sleep(max(0.0, started + RUN_S - core.clock()))
            prompt_after, generated_after = await _counters(slow)
            core.refresh_capacity()
            now = core.clock()
            estimate = core.capacity.estimate(replica, now)
            state = await admin_state(server)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()
    assert replica.completed == 0
    assert estimate.completions == 0
    assert estimate.rate_source is Source.MEASURED
    assert estimate.measured_rate is not None
    row = replica_state(state, slow.name)
    assert row["capacity_source"] == "measured"
    assert row["capacity_age_s"] is not None
    # The streams ran at once from the start, so the router's figure (cost over each
    # stream's share of the engine) is the engine's cost a second over the same stretch,
    # its counters priced as the router prices a stream (0.90 of it when this test was
    # written: the two are not read at the same instant, and the router prices a prompt
    # from its own estimate of its tokens).
    prompt = (prompt_after - prompt_before) / STREAMS
    generated = (generated_after - generated_before) / STREAMS
    done = STREAMS * stream_cost(prompt * factor, round(generated), MAX_TOKENS)
    engine_rate = done / (now - started)
    assert 0.7 < estimate.measured_rate / engine_rate < 1 / 0.7
