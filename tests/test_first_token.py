"""Only a streamed answer's first byte is a time to first token. A non-streamed answer's first
byte is the whole answer: seconds of generation that say nothing of how long the engine took
to start it. Taken for one, it cut the batch size of a calm engine on a real H200 lab run
(64 to 34 in 80 s on "TTFT p90" of 4-5 s, the answers' whole time, with no request waiting in
the engine), and it put every non-streamed request's whole time in the TTFT figures."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest

from router.adaptive import TunerChange
from router.clock import ManualClock
from router.config.schema import AdaptiveConfig
from router.core import RouterCore
from router.http.server import RouterServer
from router.replica import EngineLoad
from router.request import Request
from tests.fleet_factory import make_fleet
from tests.http_support import MODEL, Spec, openai_client, routed
from tests.test_emulator_support import metric

ADAPTIVE = AdaptiveConfig(batch_sizes=True, hysteresis=2, ttft_target_s=2.0)


@pytest.fixture
async def server() -> AsyncIterator[RouterServer]:
    async with routed((Spec("a"), Spec("b"))) as (router, _):
        yield router


def _rounds(first_token: bool) -> tuple[RouterCore, list[TunerChange]]:
    """Three tuner rounds of a full replica whose engine queues nothing, each round's eight
    requests answered 5 s after they were sent."""
    fleet = make_fleet([1.0], [8])
    fleet = replace(fleet, router=replace(fleet.router, adaptive=ADAPTIVE))
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(0))
    r = core.replica("r0")
    changes: list[TunerChange] = []
    for n in range(3):
        for i in range(8):
            core.submit(Request(f"q{n}-{i}", 10, 10, arrival=clock()))
        attempts = list(core.running.values())
        clock.advance(5.0)
        for a in attempts:
            core.first_byte(a, first_token=first_token)
            core.complete(a)
        r.engine = EngineLoad("vllm", received_at=clock(), waiting=0, running=8)
        changes += core.tune()
    return core, changes


def test_a_whole_answer_at_once_is_no_first_token_for_the_tuner_or_the_figures() -> None:
    core, changes = _rounds(first_token=False)
    assert [c for c in changes if c.setting == "batch_size"] == []
    assert core.replica("r0").batch_size == 8
    stats = core.stats[0]
    assert stats.ttft.values() == []
    assert len(stats.e2e.values()) == 24


def test_a_streamed_first_token_that_slow_is_overload() -> None:
    """The same timings, streamed: the tuner's signal is real and it cuts."""
    core, changes = _rounds(first_token=True)
    (cut, *_) = [c for c in changes if c.setting == "batch_size"]
    assert cut.message == "r0: batch_size 8 -> 7 (TTFT p90 5.00 s over 2 s for 2 intervals)"
    stats = core.stats[0]
    assert stats.ttft.values()
    assert len(stats.ttft.values()) == len(stats.e2e.values())


@pytest.mark.parametrize("stream", [False, True])
async def test_through_the_front_door_only_a_stream_counts_in_the_ttft_figures(
    server: RouterServer, stream: bool
) -> None:
    client = openai_client(server)
    if stream:
        answer = await client.completions.create(
            model=MODEL, prompt="hi", max_tokens=4, stream=True
        )
        async for _ in answer:
            pass
    else:
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    await client.close()
    async with httpx.AsyncClient(base_url=server.front_url) as http:
        text = (await http.get("/metrics")).text
    counted = sum(
        metric(text, f'gpurouter_ttft_seconds_count{{replica="{r.id}"}}') for r in server.core.pool
    )
    assert counted == (1 if stream else 0)
    replicas = [s for s in server.core.snapshot().replicas if s.completed]
    assert [s.ttft_p99_s is not None for s in replicas] == [stream]
    assert [s.e2e_p99_s is not None for s in replicas] == [True]
