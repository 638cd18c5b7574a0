"""The load generator: deterministic schedules, and every shot counted by how it ended."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from router.emulator.tokens import estimate_tokens
from router.loadgen import LoadGenerator, RatePhase, Shot, prompt_text, schedule
from router.request import Priority
from router.sim.workload import LognormalMix

MIX = LognormalMix((100, 200), (50, 80))


def test_a_schedule_follows_its_phases_and_the_same_seed_repeats_it() -> None:
    phases = [
        RatePhase(10, 20, MIX),
        RatePhase(5, 100, MIX, burstiness=0.5, priorities={Priority.HIGH: 1, Priority.LOW: 3}),
    ]
    shots = list(schedule(phases, seed=3))
    assert shots == list(schedule(phases, seed=3))
    assert shots != list(schedule(phases, seed=4))
    times = [s.at_s for s in shots]
    assert times == sorted(times)
    first = [s for s in shots if s.at_s < 10]
    second = [s for s in shots if s.at_s >= 10]
    assert 150 < len(first) < 250
    assert 350 < len(second) < 650
    assert {s.priority for s in first} == {Priority.NORMAL}
    shares = Counter(s.priority for s in second)
    assert set(shares) == {Priority.HIGH, Priority.LOW}
    assert 0.15 < shares[Priority.HIGH] / len(second) < 0.35


def test_the_prompt_text_counts_as_the_tokens_asked_for() -> None:
    for n in (1, 7, 1000):
        assert estimate_tokens(prompt_text(n)) == n


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    """A front door that answers by max_tokens: 1 ok, 2 busy, 3 expired, 4 error, 5 never."""
    never = asyncio.Event()

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        assert request.headers["X-Priority"] in ("high", "normal", "low")
        kind = body["max_tokens"]
        if kind == 5:
            await never.wait()
        status = {1: 200, 2: 429, 3: 504, 4: 500}[kind]
        return web.json_response({"ok": kind}, status=status)

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started above
    yield f"http://127.0.0.1:{port}"
    never.set()
    await runner.cleanup()


async def test_every_shot_is_counted_by_how_it_ended(upstream: str) -> None:
    shots = [Shot(i * 0.001, 10, kind) for i, kind in enumerate((1, 1, 2, 3, 4, 5))]
    drained: list[bool] = []
    report = await LoadGenerator(upstream, "m").run(
        shots,
        max_requests=100,
        max_duration_s=5,
        drain_s=0.5,
        on_drained=lambda: drained.append(True),
    )
    assert report.counts == Counter(
        {"completed": 2, "rejected": 1, "expired": 1, "failed": 1, "cut_off": 1}
    )
    assert drained == [True]
    assert report.sent == 6


async def test_the_generator_is_bounded_by_count_and_by_in_flight(upstream: str) -> None:
    shots = [Shot(0.0, 10, 5)] * 3 + [Shot(0.0, 10, 1)] * 10
    report = await LoadGenerator(upstream, "m", max_in_flight=2).run(
        shots, max_requests=5, max_duration_s=5, drain_s=0.2
    )
    # Two hang and hold the cap; the rest of the five find it full and are not sent.
    assert report.counts == Counter({"cut_off": 2, "not_sent": 3})


async def test_a_front_door_that_is_not_there_is_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report = await LoadGenerator(f"http://127.0.0.1:{port}", "m").run(
        [Shot(0.0, 10, 1)], max_requests=1, max_duration_s=5, drain_s=1
    )
    assert report.counts == Counter({"error": 1})
    # What it died of is kept, to tell a refused connection from a reset or a timeout.
    (result,) = report.results
    assert result.error is not None
    assert result.error.startswith("ClientConnectorError: ")
