"""A real engine that dies mid-stream (SIGTERM to its tree, SIGKILL of its engine core), comes
back, or is drained, with gpurouter in front: streams on a dying engine end at once with an
error event and later requests go to the other engine; a restarted engine is readmitted; a
drained one finishes its streams and takes nothing new."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from router.config.schema import HealthConfig
from router.control import Drain
from router.http.proxy import REPLICA_HEADER
from router.http.server import RouterServer
from router.lab import Engine, Lab
from tests.real_engines.lab_router import (
    QUIET_HEALTH,
    admin_state,
    eventually,
    fleet_of,
    replica_state,
    routed,
)

REPLICA = REPLICA_HEADER.decode()
STREAMS = 6
"""Streams in flight at once: three on each engine under round-robin."""


@dataclass
class Stream:
    """One streamed completion through the router, read event by event."""

    replica: str = ""
    events: list[Any] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ended_with_error(self) -> bool:
        """Its last event is an error, or an error then ``[DONE]``: vLLM itself ends a stream
        whose engine core died so, and the router relays it; when the API server dies
        first, the router writes the error event."""
        events = self.events[:-1] if self.events[-1:] == ["[DONE]"] else self.events
        return bool(events) and isinstance(events[-1], dict) and "error" in events[-1]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


async def _stream(
    client: httpx.AsyncClient, url: str, model: str, tokens: int, out: Stream
) -> None:
    body = {
        "model": model,
        "prompt": "hello",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        out.replica = response.headers.get(REPLICA, "")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                out.events.append(data if data == "[DONE]" else json.loads(data))
                out.started.set()


async def _open_streams(
    client: httpx.AsyncClient, server: RouterServer, model: str, tokens: int
) -> tuple[list[Stream], list[asyncio.Task[None]]]:
    """``STREAMS`` streams, returned once every one has received its first event."""
    streams = [Stream() for _ in range(STREAMS)]
    tasks = [
        asyncio.create_task(_stream(client, server.front_url, model, tokens, s)) for s in streams
    ]
    await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in streams)), 120)
    return streams, tasks


async def _served_by(server: RouterServer, model: str, count: int) -> list[str]:
    """The replica of each of ``count`` short, non-streamed requests, one after another."""
    replicas = []
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(count):
            body = {"model": model, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
            response = await client.post(server.front_url + "/v1/completions", json=body)
            assert response.status_code == 200, response.text
            replicas.append(response.headers[REPLICA])
    return replicas


def _ids(lab: Lab) -> tuple[str, str, Engine]:
    """The surviving replica's id, the victim's id, and the victim (the slow engine: its
    streams last longest)."""
    return lab.engines[0].name, lab.engines[1].name, lab.engines[1]


@pytest.mark.parametrize("fault", ["terminate", "kill_core"])
async def test_an_engine_that_dies_mid_stream_ends_its_streams_with_an_error(
    vllm_lab: Lab, fault: str
) -> None:
    survivor, victim_id, victim = _ids(vllm_lab)
    async with (
        routed(fleet_of(vllm_lab), strategy="round-robin") as server,
        httpx.AsyncClient(timeout=httpx.Timeout(120)) as client,
    ):
        streams, tasks = await _open_streams(client, server, vllm_lab.model, 1500)
        on_victim = [i for i, s in enumerate(streams) if s.replica == victim_id]
        assert on_victim, [s.replica for s in streams]
        getattr(victim, fault)()

        await asyncio.wait_for(asyncio.gather(*(tasks[i] for i in on_victim)), 60)
        assert all(streams[i].ended_with_error for i in on_victim)
        # The router counts them as the client saw them, even those vLLM closed with [DONE].
        victim_state = replica_state(await admin_state(server), victim_id)
        assert victim_state["failed"] == len(on_victim), victim_state
        assert victim_state["completed"] == 0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        assert await _served_by(server, vllm_lab.model, 4) == [survivor] * 4


async def test_a_restarted_engine_is_readmitted(vllm_lab: Lab) -> None:
    _, victim_id, victim = _ids(vllm_lab)
    health = HealthConfig(
        check_interval_s=0.5,
        check_timeout_s=1.0,
        eject_after_failures=2,
        eject_base_s=1.0,
        eject_max_s=2.0,
        engine_metrics_interval_s=0.0,
    )
    async with routed(fleet_of(vllm_lab), health=health, strategy="round-robin") as server:

        async def victim_is(state: str) -> bool:
            return bool(replica_state(await admin_state(server), victim_id)["state"] == state)

        victim.terminate()
        await eventually(lambda: victim_is("ejected"), f"{victim_id} ejected once stopped")
        await asyncio.to_thread(victim.restart)
        await eventually(lambda: victim_is("active"), f"{victim_id} readmitted once restarted")
        assert victim_id in await _served_by(server, vllm_lab.model, 2)


async def test_a_drained_engine_finishes_its_streams_and_takes_nothing_new(
    vllm_lab: Lab,
) -> None:
    survivor, victim_id, _ = _ids(vllm_lab)
    async with (
        routed(fleet_of(vllm_lab), health=QUIET_HEALTH, strategy="round-robin") as server,
        httpx.AsyncClient(timeout=httpx.Timeout(120)) as client,
    ):
        streams, tasks = await _open_streams(client, server, vllm_lab.model, 200)
        server.control.apply(Drain(victim_id))

        assert await _served_by(server, vllm_lab.model, 4) == [survivor] * 4
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        on_victim = [s for s in streams if s.replica == victim_id]
        assert on_victim
        assert all(s.done and not s.ended_with_error for s in streams)
        final = replica_state(await admin_state(server), victim_id)
        assert final["state"] == "drained"
        assert final["completed"] == len(on_victim)
