"""The load generator sends max_tokens as clients do and the answer's length as a hint.

``max_tokens`` is the workload's cap (by default the request's own output length); the real
output length goes in the emulator's ``gpurouter.output_tokens`` hint, which the emulator
takes as where the "model" stops, finishing with ``stop`` before the cap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from router.emulator import EmulatedFleet
from router.loadgen import LoadGenerator, RatePhase, Shot, schedule
from router.sim.workload import LognormalMix
from tests.test_emulator_support import MODEL, TIME_SCALE, Spec, any_ports, fleet_config

MIX = LognormalMix((100, 200), (50, 80))


def test_a_capped_schedule_sends_the_cap_and_keeps_each_requests_own_length() -> None:
    own = list(schedule([RatePhase(10, 50, MIX)], seed=2))
    capped = list(schedule([RatePhase(10, 50, MIX, max_tokens=1024)], seed=2))
    assert [(s.at_s, s.prompt_tokens) for s in capped] == [(s.at_s, s.prompt_tokens) for s in own]
    assert {s.max_tokens for s in capped} == {1024}
    assert [s.output_tokens for s in capped] == [min(s.max_tokens, 1024) for s in own]
    # By default a client sends its request's own output length, as vllm bench serve does.
    assert all(s.max_tokens == s.output_tokens for s in own)


@pytest.fixture
async def front_door() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A front door that notes every body it is sent and answers 200."""
    bodies: list[dict[str, Any]] = []

    async def complete(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started above
    yield f"http://127.0.0.1:{port}", bodies
    await runner.cleanup()


async def test_the_loadgen_sends_the_cap_as_max_tokens_and_the_length_as_the_hint(
    front_door: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = front_door
    shots = [Shot(0.0, 40, 1024, output_tokens=12), Shot(0.001, 40, 30)]
    report = await LoadGenerator(url, MODEL).run(
        shots, max_requests=10, max_duration_s=5, drain_s=2
    )
    assert report.counts["completed"] == 2
    by_cap = {b["max_tokens"]: b for b in bodies}
    assert by_cap[1024]["gpurouter"] == {"output_tokens": 12}
    assert "gpurouter" not in by_cap[30]  # no length to tell: the engine decides


async def test_the_emulator_stops_at_the_hint_with_stop_not_length(
    front_door: tuple[str, list[dict[str, Any]]],
) -> None:
    """What the loadgen sends, the emulator answers with the hinted length and ``stop``; an
    answer cut by max_tokens alone would say ``length``."""
    url, bodies = front_door
    await LoadGenerator(url, MODEL).run(
        [Shot(0.0, 40, 1024, output_tokens=12)], max_requests=1, max_duration_s=5, drain_s=2
    )
    (sent,) = bodies
    specs = (Spec("a100"),)
    emulated = EmulatedFleet(fleet_config(*specs), time_scale=TIME_SCALE, ports=any_ports(specs))
    async with emulated, httpx.AsyncClient(timeout=10.0) as client:
        answer = await client.post(emulated.url("a100") + "/v1/completions", json=sent)
    data = answer.json()
    assert data["usage"]["completion_tokens"] == 12
    assert data["choices"][0]["finish_reason"] == "stop"
