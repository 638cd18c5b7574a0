"""A slow replica under the silence watch: silent for longer than its idle limit, yet working.

An engine step that prefills a full token budget on a slow card takes seconds (an L4 with an
8B model: 1.6 s in the performance model), and every stream on that replica is silent
meanwhile. The emulator runs the L4 in real time here, the idle limit's ceiling is 1 s: the
silence makes the replica a suspect, the generation probe finds it working, and every stream
carries on to its end. A frozen replica under the same watch is ejected
(tests/test_http_frozen_replica.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from router.core import Outcome
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.http_support import MODEL, Spec, hint, routed
from tests.test_http_frozen_replica import FAST_RETRY, WATCHFUL  # the same watch

SLOW = (Spec("l4", gpu="L4"),)
FULL_BUDGET = 8000
"""Prompt tokens of the request whose prefill fills one step (vLLM's budget is 8192)."""


async def _stream(
    client: httpx.AsyncClient, server: RouterServer, body: dict[str, Any], first: asyncio.Event
) -> list[str]:
    events: list[str] = []
    body = {"model": MODEL, "stream": True, **body}
    async with client.stream("POST", server.front_url + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
                first.set()
    return events


async def test_streams_silent_through_a_long_prefill_step_are_kept_to_their_end() -> None:
    """A stream decoding on the L4 stalls while a full-budget prompt is prefilled beside it;
    the new request is silent until its prefill ends. Neither stream is ended, the replica
    stays in service, both requests complete."""
    async with routed(SLOW, time_scale=1, retries=FAST_RETRY, health=WATCHFUL) as (server, _):
        async with httpx.AsyncClient(timeout=30) as client:
            decoding, prefilling = asyncio.Event(), asyncio.Event()
            body = {"prompt": "a", "max_tokens": 40} | hint(8, 40)
            first = asyncio.create_task(_stream(client, server, body, decoding))
            await decoding.wait()
            body = {"prompt": "b", "max_tokens": 3} | hint(FULL_BUDGET, 3)
            second = asyncio.create_task(_stream(client, server, body, prefilling))
            streams = await asyncio.gather(first, second)
        health = server.health
        assert health.silence.verified[0] > float("-inf")  # it was suspected, found working
        for events in streams:
            assert events[-1] == "data: [DONE]"
            assert not any('"error"' in e for e in events)
        assert server.core.replica("l4").state is ReplicaState.ACTIVE
        assert health.ejections_total == {}
        assert server.core.outcomes == {Outcome.COMPLETED: 2}
