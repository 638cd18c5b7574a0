"""A frozen vLLM engine behind gpurouter: found in seconds, routed around, readmitted.

The slow engine's ``VLLM::EngineCore`` is stopped (SIGSTOP, what a hung GPU or a stuck
collective looks like from outside: the API server still answers ``/health`` 200) while
streams run on it. Before the silence watch, 8-10 of 20 requests sent 6 s into such a freeze
waited until their client gave up, and the streams on it sat silent for 30-40 s.

The test holds outcomes only (no timing threshold); it prints what it measured: time from
the freeze to the ejection, how the streams in flight ended, what became of requests sent
just after the freeze and 6 s into it, and time from the thaw to the readmission. Run with
``-s`` to read them. Round-robin, so that half of what is sent lands on the frozen engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import httpx
import openai
import pytest

from router.config.schema import FleetConfig, HealthConfig
from router.core import Outcome
from router.lab import Lab
from router.replica import ReplicaState
from tests.real_engines.lab_router import openai_client, routed

pytestmark = pytest.mark.real_engine_smoke

CLIENT_TIMEOUT_S = 20.0
"""How long a client waits before it gives up (the issue's clients: 15-20 s)."""


@dataclasses.dataclass
class StreamSeen:
    replica: str = ""
    events: list[str] = dataclasses.field(default_factory=list)
    first: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    ended_at: float = 0.0


@dataclasses.dataclass
class Answer:
    status: int
    replica: str
    seconds: float


HEALTH = HealthConfig(eject_base_s=2.0, eject_max_s=8.0, models_interval_s=0.0)
"""The defaults (silence watch at 2.5 s, probes within 2 s), with short ejection windows so
that the readmission after the thaw is seen within the test."""


async def _stream(client: httpx.AsyncClient, url: str, model: str, seen: StreamSeen) -> None:
    body = {"model": model, "prompt": "a", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        seen.replica = response.headers["x-gpurouter-replica"]
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen.events.append(line)
                seen.first.set()
    seen.ended_at = time.monotonic()


async def _ask(client: openai.AsyncOpenAI, model: str, i: int) -> Answer:
    start = time.monotonic()
    try:
        raw = await client.completions.with_raw_response.create(
            model=model, prompt=f"request {i}", max_tokens=16, extra_body={"ignore_eos": True}
        )
    except openai.APITimeoutError:
        return Answer(0, "", time.monotonic() - start)
    return Answer(raw.status_code, raw.headers["x-gpurouter-replica"], time.monotonic() - start)


async def _until(condition: Any, timeout_s: float) -> float:
    """Wait for ``condition()``; the moment it held."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
    return time.monotonic()


async def test_a_frozen_engine_is_ejected_routed_around_and_readmitted(
    vllm_lab: Lab, vllm_fleet: FleetConfig
) -> None:
    slow_engine = vllm_lab.engines[1]
    model = vllm_lab.model
    async with (
        routed(vllm_fleet, health=HEALTH, strategy="round-robin") as server,
        openai_client(server, timeout=CLIENT_TIMEOUT_S) as api,
        httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client,
    ):
        slow = next(r for r in server.core.pool if r.config.endpoint == slow_engine.url)
        # Streams on both engines, running: the idle limits learn their gaps.
        streams = [StreamSeen() for _ in range(8)]
        tasks = [asyncio.create_task(_stream(client, server.front_url, model, s)) for s in streams]
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 60)
        await asyncio.sleep(1.0)
        limit = server.health.silence.limit_s(slow.index, server.core.clock())

        frozen_at = time.monotonic()
        slow_engine.freeze()
        await asyncio.sleep(0.5)
        early = asyncio.gather(*(_ask(api, model, i) for i in range(10)))
        ejected_at = await _until(lambda: slow.state is ReplicaState.EJECTED, 30)
        await asyncio.sleep(max(0.0, frozen_at + 6.0 - time.monotonic()))
        late = await asyncio.gather(*(_ask(api, model, i) for i in range(20)))
        early_answers = await early
        await asyncio.gather(*tasks)

        await asyncio.sleep(max(0.0, frozen_at + 15.0 - time.monotonic()))
        assert server.core.replica(slow.id).state is ReplicaState.EJECTED  # /health: 200
        thawed_at = time.monotonic()
        slow_engine.thaw()
        readmitted_at = await _until(lambda: slow.state is ReplicaState.ACTIVE, 60)
        after = await asyncio.gather(*(_ask(api, model, i) for i in range(4)))

    ejection = server.health.ejections_total
    on_slow = [s for s in streams if s.replica == slow.id]
    elsewhere = [s for s in streams if s.replica != slow.id]
    print(f"\nidle limit of the frozen engine at the freeze: {limit:.2f} s")
    print(f"freeze -> ejection: {ejected_at - frozen_at:.2f} s")
    for s in on_slow:
        print(f"stream on the frozen engine: ended {s.ended_at - frozen_at:.2f} s after the freeze")
        print(f"  with {s.events[-1][:150]}")
    print(f"streams on the other engine: {sum(s.events[-1] == 'data: [DONE]' for s in elsewhere)}")
    print(f"  of {len(elsewhere)} finished with [DONE]")
    for name, answers in (("0.5 s into the freeze", early_answers), ("6 s into it", late)):
        ok = sum(a.status == 200 for a in answers)
        worst = max(a.seconds for a in answers)
        print(f"{len(answers)} requests sent {name}: {ok} answered 200, slowest {worst:.2f} s")
    print(f"thaw -> readmission: {readmitted_at - thawed_at:.2f} s")
    print(f"ejections: {dict(ejection)}")

    assert on_slow, "round-robin put no stream on the engine that froze"
    for s in on_slow:
        assert '"error"' in s.events[-1]
    for s in elsewhere:
        assert s.events[-1] == "data: [DONE]"
    assert all(a.status == 200 for a in early_answers + late + after)
    assert all(a.replica != slow.id for a in early_answers + late)
    assert ejection[(slow.id, "silence")] >= 1
    assert any(a.replica == slow.id for a in after)  # back in rotation
    assert server.core.outcomes[Outcome.FAILED] == len(on_slow)
