"""Replicas failing under the router: retries before the first byte, explicit errors after it,
client disconnects, passive ejection and probe readmission."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import openai

from router.config.schema import HealthConfig, RetryConfig, TimeoutConfig
from router.core import Outcome
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.http_support import MODEL, Spec, hint, openai_client, routed
from tests.test_emulator_support import until

SPECS = (Spec("a"), Spec("b"), Spec("c"))
FAST_RETRY = RetryConfig(attempts=3, backoff_s=0.001, backoff_max_s=0.01)


@dataclasses.dataclass
class Seen:
    """What one client saw of one request."""

    stream: bool
    ok: bool = False
    chunks: int = 0
    replica: str | None = None
    error: str = ""


async def one_request(client: openai.AsyncOpenAI, stream: bool, tokens: int) -> Seen:
    seen = Seen(stream)
    try:
        if stream:
            chunks = await client.completions.create(
                model=MODEL, prompt="p", max_tokens=tokens, stream=True, extra_body=hint(20, tokens)
            )
            async for _ in chunks:
                seen.chunks += 1
        else:
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt="p", max_tokens=tokens, extra_body=hint(20, tokens)
            )
            seen.replica = raw.headers["x-gpurouter-replica"]
            assert raw.parse().usage.completion_tokens == tokens  # type: ignore[union-attr]
        seen.ok = True
    except openai.APIError as exc:
        seen.error = str(exc)
    return seen


async def load(
    server: RouterServer, n: int, concurrency: int, tokens: int, *, streams_every: int = 3
) -> list[Seen]:
    """``n`` requests, at most ``concurrency`` at once; every third one streamed."""
    client = openai_client(server)
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int) -> Seen:
        async with gate:
            return await one_request(client, i % streams_every == 0, tokens)

    try:
        return await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(n))), 30)
    finally:
        await client.close()


def assert_counts_add_up(server: RouterServer, seen: list[Seen], n: int) -> None:
    """Every request ended once, and the core's outcomes are the client's view."""
    assert len(seen) == n
    ok = sum(s.ok for s in seen)
    assert server.core.outcomes[Outcome.COMPLETED] == ok
    assert server.core.outcomes[Outcome.FAILED] == n - ok
    assert sum(server.core.outcomes.values()) == n
    assert not server.core.running
    assert not len(server.core.queue)


async def test_killing_a_replica_under_load_loses_nothing() -> None:
    """Every request that had not started streaming succeeds on another replica; a stream
    already under way on the killed replica ends with an explicit error."""
    n = 60
    health = HealthConfig(check_interval_s=0, eject_after_failures=3, eject_base_s=30)
    async with routed(SPECS, time_scale=25, retries=FAST_RETRY, health=health) as (server, emu):
        traffic = asyncio.create_task(load(server, n, concurrency=12, tokens=120))
        a = server.core.replica("a")
        done = server.core.outcomes
        # Mid-load: some requests done, more to come, some running on the victim.
        await until(lambda: done[Outcome.COMPLETED] >= 6 and a.in_flight >= 2, timeout=10)
        await emu.kill("a")
        seen = await traffic
        assert_counts_add_up(server, seen, n)
        for s in seen:
            if not s.ok:  # only streams that had begun may fail, and they say why
                assert s.stream
                assert s.chunks > 0
                assert "a:" in s.error
        assert server.core.stats[a.index].retries >= 1  # some attempt was re-run elsewhere
        assert a.state is ReplicaState.EJECTED  # new attempts on it failed to connect
        assert server.health.ejections[a.index].cause == "failures"


async def test_a_stream_cut_after_its_first_byte_ends_with_an_error_event() -> None:
    async with routed(SPECS[:2], time_scale=10, retries=FAST_RETRY) as (server, emu):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3000, "stream": True}
        events: list[str] = []
        async with (
            httpx.AsyncClient(timeout=10) as client,
            client.stream("POST", server.front_url + "/v1/completions", json=body) as response,
        ):
            replica = response.headers["x-gpurouter-replica"]
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 1:
                        await emu.kill(replica)
        assert '"error"' in events[-1]
        assert "cut short" in events[-1]
        assert server.core.outcomes == {Outcome.FAILED: 1}
        assert server.core.stats[server.core.replica(replica).index].retries == 0


async def test_5xx_and_hangs_before_the_first_byte_are_retried_elsewhere() -> None:
    timeouts = TimeoutConfig(connect_s=1, first_byte_s=0.3, total_s=10)
    async with routed(SPECS[:2], retries=FAST_RETRY, timeouts=timeouts) as (server, emu):
        await emu.fail_fraction("a", 1.0)
        client = openai_client(server)
        for _ in range(4):
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt="p", max_tokens=3
            )
            assert raw.headers["x-gpurouter-replica"] == "b"
        await emu.heal("a")
        await emu.hang("b")
        replicas = set()
        for _ in range(3):
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt="p", max_tokens=3
            )
            replicas.add(raw.headers["x-gpurouter-replica"])
        await client.close()
        await emu.heal("b")
        assert replicas == {"a"}
        assert server.core.outcomes == {Outcome.COMPLETED: 7}
        assert server.core.stats[0].retries >= 1
        assert server.core.stats[1].retries >= 1


async def test_when_every_attempt_fails_the_client_gets_a_502() -> None:
    async with routed(SPECS[:2], retries=FAST_RETRY) as (server, emu):
        await emu.fail_fraction("a", 1.0)
        await emu.fail_fraction("b", 1.0)
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                server.front_url + "/v1/completions",
                json={"model": MODEL, "prompt": "p", "max_tokens": 2},
            )
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_error"
        assert "answered 500" in response.json()["error"]["message"]
        assert server.core.outcomes == {Outcome.FAILED: 1}


async def test_a_client_that_disconnects_cancels_its_upstream_request() -> None:
    async with routed(SPECS[:1], time_scale=10) as (server, emu):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 5000, "stream": True}
        async with (
            httpx.AsyncClient(timeout=10) as client,
            client.stream("POST", server.front_url + "/v1/completions", json=body) as response,
        ):
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break
        driver = emu.replica("a").driver
        await until(lambda: not server.core.running and driver.in_flight == 0, timeout=5)
        assert server.core.outcomes == {Outcome.FAILED: 1}


async def test_a_client_that_leaves_before_its_watcher_starts_is_noticed_when_it_does() -> None:
    """A request gets a disconnect watcher only once it has run ``watch_after_s``; a client
    that left sooner is noticed then, and its upstream request (hung here) is closed."""
    async with routed(SPECS[:1], time_scale=10) as (server, emu):
        server.proxy.watch_after_s = 0.3
        await emu.hang("a")
        async with httpx.AsyncClient(timeout=10) as client:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 5}
            sent = asyncio.create_task(client.post(server.front_url + "/v1/completions", json=body))
            await until(lambda: len(server.core.running) == 1)
            sent.cancel()
            await asyncio.gather(sent, return_exceptions=True)
        await until(lambda: not server.core.running and not server.proxy.active)
        await emu.heal("a")
        assert server.core.outcomes == {Outcome.FAILED: 1}


async def test_a_client_that_leaves_while_queued_is_taken_out_of_the_queue() -> None:
    async with routed(SPECS[:1], batch_size=1, time_scale=10) as (server, emu):
        await emu.hang("a")
        async with httpx.AsyncClient(timeout=10) as client:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 5}
            url = server.front_url + "/v1/completions"
            first = asyncio.create_task(client.post(url, json=body))
            second = asyncio.create_task(client.post(url, json=body))
            await until(lambda: len(server.core.queue) == 1)
            second.cancel()
            await asyncio.gather(second, return_exceptions=True)
            await until(lambda: len(server.core.queue) == 0)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
        await until(lambda: not server.core.running)
        await emu.heal("a")
        assert server.core.outcomes == {Outcome.FAILED: 2}


async def test_an_ejected_replica_is_readmitted_by_a_probe_after_a_growing_window() -> None:
    health = HealthConfig(
        check_interval_s=0, eject_after_failures=2, eject_base_s=0.1, eject_max_s=10
    )
    async with routed(SPECS[:2], retries=FAST_RETRY, health=health) as (server, emu):
        a = server.core.replica("a")
        await emu.kill("a")
        client = openai_client(server)
        while a.state is ReplicaState.ACTIVE:
            await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
        first = server.health.ejections[a.index]
        assert first.in_row == 1
        reason = first.reason
        assert "failed requests in a row" in reason
        # The probe at the end of the window fails: a longer window follows.
        await until(lambda: server.health.ejections[a.index].in_row == 2, timeout=5)
        await emu.revive("a")
        await until(lambda: a.state is ReplicaState.ACTIVE, timeout=5)
        await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
        await client.close()
        text = server.metrics.render().decode()
        assert 'gpurouter_ejections_total{cause="failures",replica="a"} 1.0' in text
        states = [e.message for e in server.control.audit if e.kind == "state"]
        assert states == [
            f"a: active -> ejected ({reason})",
            "a: ejected -> active (a generation probe answered)",
        ]


async def test_active_health_checks_eject_a_hung_replica() -> None:
    health = HealthConfig(
        check_interval_s=0.02, check_timeout_s=0.05, eject_after_failures=2, eject_base_s=60
    )
    async with routed(SPECS[:2], health=health) as (server, emu):
        await emu.hang("b")
        b = server.core.replica("b")
        await until(lambda: b.state is ReplicaState.EJECTED, timeout=5)
        assert server.health.ejections[b.index].cause == "health_check"
        await emu.heal("b")
