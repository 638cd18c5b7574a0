"""A frozen replica under the router: it answers /health but generates nothing (the emulator's
``freeze`` fault, as a vLLM whose engine core is stopped). Its silence gives it away; a
generation probe confirms; it is ejected, the requests waiting on it go elsewhere, and it
comes back on its own once it generates again."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import httpx

from router.config.schema import HealthConfig, RetryConfig
from router.core import Assignment, CoreListener, Outcome
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.http_support import MODEL, Spec, hint, routed
from tests.test_emulator_support import until

SPECS = (Spec("a"), Spec("b"))
FAST_RETRY = RetryConfig(attempts=3, backoff_s=0.001, backoff_max_s=0.01)
WATCHFUL = HealthConfig(
    check_interval_s=0,
    check_timeout_s=0.3,
    eject_after_failures=3,
    eject_base_s=60,
    stream_idle_max_s=1.0,
    engine_metrics_interval_s=0,
    models_interval_s=0,
)
"""Only the silence watch: no periodic checks; a short ceiling and probe timeout."""


class Placements(CoreListener):
    """Where each attempt went, and the state its replica was in when it was placed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ReplicaState]] = []

    def on_assign(self, assignment: Assignment) -> None:
        r = assignment.replica
        self.seen.append((r.id, r.state))


async def stream_events(
    client: httpx.AsyncClient,
    server: RouterServer,
    on_first: Callable[[str], Awaitable[None]] | None = None,
) -> tuple[str, list[str]]:
    """Stream a completion, calling ``on_first(replica)`` at its first event; the replica
    that answered and every ``data:`` event."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 400, "stream": True}
    events: list[str] = []
    url = server.front_url + "/v1/completions"
    async with client.stream("POST", url, json=body) as response:
        replica = response.headers["x-gpurouter-replica"]
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
                if len(events) == 1 and on_first is not None:
                    await on_first(replica)
    return replica, events


async def test_a_stream_on_a_replica_that_freezes_ends_with_an_error_and_it_is_ejected() -> None:
    async with routed(SPECS, time_scale=10, retries=FAST_RETRY, health=WATCHFUL) as (server, emu):
        async with httpx.AsyncClient(timeout=10) as client:
            replica, events = await stream_events(client, server, on_first=emu.freeze)
        assert '"error"' in events[-1]
        assert "silent for" in events[-1]
        assert "generation probe failed" in events[-1]  # silence alone ends no stream
        assert events[-1] != "data: [DONE]"
        r = server.core.replica(replica)
        assert r.state is ReplicaState.EJECTED  # before its streams were ended
        ejection = server.health.ejections[r.index]
        assert ejection.cause == "silence"
        assert "generation probe" in ejection.reason
        assert server.core.outcomes == {Outcome.FAILED: 1}
        await emu.thaw(replica)


async def test_requests_sent_to_a_frozen_replica_are_served_by_another() -> None:
    """Half of them land on the frozen replica before anything is known; they wait, the
    replica's silence gets it probed and ejected, and they are re-run on the other one."""
    async with routed(
        SPECS, time_scale=10, retries=FAST_RETRY, health=WATCHFUL, strategy="round-robin"
    ) as (server, emu):
        placements = Placements()
        server.core.listeners.append(placements)
        await emu.freeze("a")
        a = server.core.replica("a")
        async with httpx.AsyncClient(timeout=10) as client:

            async def one(i: int) -> tuple[int, str, str]:
                body = {"model": MODEL, "prompt": "p", "max_tokens": 5, "stream": i % 2 == 0}
                body |= {"gpurouter": hint(20, 5)["gpurouter"]}
                response = await client.post(server.front_url + "/v1/completions", json=body)
                return response.status_code, response.headers["x-gpurouter-replica"], response.text

            first = await asyncio.gather(*(one(i) for i in range(20)))
            assert a.state is ReplicaState.EJECTED
            later = await asyncio.gather(*(one(i) for i in range(20)))
        for status, replica, text in first + later:
            assert status == 200
            assert replica == "b"
            assert '"error"' not in text
        assert server.core.outcomes == {Outcome.COMPLETED: 40}
        assert server.health.ejections[a.index].cause == "silence"
        assert server.core.stats[a.index].retries >= 1  # some were re-run
        assert ("a", ReplicaState.ACTIVE) in placements.seen  # sent there before it was known
        assert ("a", ReplicaState.EJECTED) not in placements.seen  # and never after
        await emu.thaw("a")


async def test_a_frozen_replica_is_readmitted_once_it_generates_again() -> None:
    health = HealthConfig(
        check_interval_s=0.05,  # /health, answered 200 all along: it must not readmit
        check_timeout_s=0.3,
        eject_after_failures=3,
        eject_base_s=0.2,
        eject_max_s=10,
        stream_idle_max_s=1.0,
        engine_metrics_interval_s=0,
        models_interval_s=0,
    )
    async with routed(SPECS, time_scale=10, retries=FAST_RETRY, health=health) as (server, emu):
        async with httpx.AsyncClient(timeout=10) as client:
            replica, _ = await stream_events(client, server, on_first=emu.freeze)
            r = server.core.replica(replica)
            await until(lambda: r.state is ReplicaState.EJECTED, timeout=5)
            # A readmission probe at the end of the window failed: a longer window follows.
            await until(lambda: server.health.ejections[r.index].in_row == 2, timeout=5)
            assert r.state is ReplicaState.EJECTED
            await emu.thaw(replica)
            await until(lambda: r.state is ReplicaState.ACTIVE, timeout=5)
            _, events = await stream_events(client, server)
        assert events[-1] == "data: [DONE]"
        states = [e.message for e in server.control.audit if e.kind == "state"]
        ejected, readmitted = states
        assert re.fullmatch(
            rf"{replica}: active -> ejected \(silent for [\d.]+ s; generation probe failed: .+\)",
            ejected,
        )
        assert readmitted == f"{replica}: ejected -> active (a generation probe answered)"
