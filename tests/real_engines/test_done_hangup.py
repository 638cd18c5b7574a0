"""Clients that hang up right after ``data: [DONE]`` from real vLLM engines: every stream
that reached ``[DONE]`` counts as completed (before the fix, 1 to 6 of 60 were counted as
failed: the hang-up raced the end of vLLM's body)."""

from __future__ import annotations

import asyncio

import httpx

from router.config.schema import FleetConfig
from router.core import Outcome
from router.lab import Lab
from tests.real_engines.lab_router import eventually, routed


async def _read_to_done_and_hang_up(client: httpx.AsyncClient, url: str, model: str) -> bool:
    body = {"model": model, "prompt": "a", "max_tokens": 24, "stream": True, "ignore_eos": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return True  # leaving the block closes the connection, the body unfinished
    return False


async def test_sixty_clients_hanging_up_at_done_are_sixty_completed_requests(
    vllm_lab: Lab, vllm_fleet: FleetConfig
) -> None:
    n = 60
    async with routed(vllm_fleet) as server, httpx.AsyncClient(timeout=30) as client:
        server.proxy.watch_after_s = 0.0  # every request watches its client from the start
        gate = asyncio.Semaphore(8)

        async def one() -> bool:
            async with gate:
                return await _read_to_done_and_hang_up(client, server.front_url, vllm_lab.model)

        reached = await asyncio.gather(*(one() for _ in range(n)))
        assert all(reached)

        async def settled() -> bool:
            return not server.proxy.active

        await eventually(settled, "every request's handler ended")
        assert server.core.outcomes == {Outcome.COMPLETED: n}
