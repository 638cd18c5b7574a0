"""Fault injection on emulated replicas, through the Python API and the control listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from router.emulator import EmulatedFleet
from router.errors import ControlError
from tests.test_emulator_support import (
    TIME_SCALE,
    Spec,
    any_ports,
    completion,
    fleet_config,
    json_chunks,
    sse_events,
    until,
)

SPECS = (Spec("a"), Spec("b"))


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    emulated = EmulatedFleet(fleet_config(*SPECS), time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with emulated:
        yield emulated


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as c:
        yield c


async def _health(url: str) -> int:
    """A fresh connection's answer to /health."""
    async with httpx.AsyncClient(timeout=1.0) as fresh:
        return (await fresh.get(url + "/health")).status_code


async def test_a_killed_replica_refuses_connections_until_revived(fleet: EmulatedFleet) -> None:
    url = fleet.url("a")
    await fleet.kill("a")
    with pytest.raises(httpx.ConnectError):
        await _health(url)
    assert await _health(fleet.url("b")) == 200
    await fleet.revive("a")
    assert fleet.url("a") == url
    assert await _health(url) == 200


async def test_kill_drops_an_open_stream_and_its_sequence(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    replica = fleet.replica("a")

    async def read_and_kill() -> None:
        body = completion(100, 100_000, max_tokens=100_000, stream=True)
        async with client.stream("POST", fleet.url("a") + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and not replica.faults.killed:
                    await fleet.kill("a")

    with pytest.raises(httpx.HTTPError):
        await read_and_kill()
    await asyncio.wait_for(replica.driver.wait_idle(), 2.0)
    assert replica.driver.in_flight == 0


async def test_a_hung_replica_reads_requests_but_never_answers_until_healed(
    fleet: EmulatedFleet,
) -> None:
    await fleet.hang("a")
    async with httpx.AsyncClient(timeout=0.1) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.get(fleet.url("a") + "/health")
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post(fleet.url("a") + "/v1/completions", json=completion(10, 2))
    await fleet.heal("a")
    assert await _health(fleet.url("a")) == 200


async def test_a_replica_hung_mid_stream_sends_no_more_tokens(fleet: EmulatedFleet) -> None:
    replica = fleet.replica("a")

    async def read_then_hang() -> None:
        body = completion(100, 100_000, max_tokens=100_000, stream=True)
        async with httpx.AsyncClient(timeout=0.2) as impatient:
            url = fleet.url("a") + "/v1/completions"
            async with impatient.stream("POST", url, json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and not replica.faults.hung:
                        await fleet.hang("a")

    with pytest.raises(httpx.ReadTimeout):
        await read_then_hang()
    await asyncio.wait_for(replica.driver.wait_idle(), 2.0)


async def test_a_frozen_replica_answers_health_but_generates_nothing_until_thawed(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    """As a vLLM whose engine core is stopped: /health, /v1/models and /metrics answer, a
    stream in flight gets no more tokens, a new request is accepted and waits; thawed, both
    finish whole."""
    replica = fleet.replica("a")
    url = fleet.url("a")
    texts: list[str] = []
    first = asyncio.Event()

    async def read_stream() -> None:
        body = completion(100, 400, max_tokens=400, stream=True)
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for text in r.aiter_text():
                texts.append(text)
                first.set()

    reader = asyncio.create_task(read_stream())
    await first.wait()
    await fleet.freeze("a")
    steps = replica.engine.step_no
    assert await _health(url) == 200
    assert (await client.get(url + "/v1/models")).status_code == 200
    assert (await client.get(url + "/metrics")).status_code == 200
    late = asyncio.create_task(client.post(url + "/v1/completions", json=completion(10, 2)))
    await until(lambda: replica.driver.in_flight == 2)
    await asyncio.sleep(0.2)  # hundreds of steps' time at this scale: none may run
    assert replica.engine.step_no <= steps + 1  # the step running at the freeze may end
    assert not late.done()
    assert not reader.done()
    assert fleet.faults()["a"]["frozen"] is True
    await fleet.thaw("a")
    assert (await late).status_code == 200
    await reader
    assert len(json_chunks(sse_events("".join(texts)))) == 400
    assert fleet.faults()["a"]["frozen"] is False


async def test_fail_fraction_with_a_seed_fails_the_same_requests_every_time(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    url = fleet.url("a") + "/v1/completions"
    runs = []
    for _ in range(2):
        await fleet.fail_fraction("a", 0.5, seed=7)
        runs.append([await client.post(url, json=completion(10, 1)) for _ in range(24)])
    statuses = [[r.status_code for r in run] for run in runs]
    assert statuses[0] == statuses[1]
    assert 4 <= statuses[0].count(500) <= 20
    assert set(statuses[0]) == {200, 500}
    failed = next(r for r in runs[0] if r.status_code == 500)
    assert failed.json()["error"]["type"] == "InternalServerError"
    await fleet.heal("a")
    healed = [(await client.post(url, json=completion(10, 1))).status_code for _ in range(8)]
    assert healed == [200] * 8


async def test_a_refusing_replica_finishes_its_open_stream_but_takes_no_new_connection(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body = completion(100, 1000, max_tokens=1000, stream=True)
    raw = ""
    async with client.stream("POST", fleet.url("a") + "/v1/completions", json=body) as r:
        async for text in r.aiter_text():
            if not raw:
                await fleet.refuse("a")
                with pytest.raises(httpx.ConnectError):
                    await _health(fleet.url("a"))
                assert fleet.replica("a").driver.in_flight == 1
            raw += text
    chunks = json_chunks(sse_events(raw))
    assert len(chunks) == 1000
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    await fleet.heal("a")
    assert await _health(fleet.url("a")) == 200


async def test_faults_name_replicas_the_fleet_emulates(fleet: EmulatedFleet) -> None:
    with pytest.raises(ControlError, match="no emulated replica 'zz'"):
        await fleet.kill("zz")
    with pytest.raises(ControlError):
        await fleet.slow("a", 0.0)
    with pytest.raises(ControlError):
        await fleet.fail_fraction("a", 1.5)


async def test_the_control_listener_sets_and_lists_faults(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    port = await fleet.start_control("127.0.0.1", 0)
    control = f"http://127.0.0.1:{port}"
    answer = await client.post(control + "/faults/a", json={"fault": "slow", "factor": 2.5})
    assert answer.status_code == 200
    assert answer.json()["faults"]["slow_factor"] == 2.5
    assert fleet.replica("a").engine.cost(100, 0, 0) > 0
    listed = (await client.get(control + "/faults")).json()
    assert set(listed) == {"a", "b"}
    assert listed["b"]["slow_factor"] == 1.0

    assert (await client.post(control + "/faults/a", json={"fault": "kill"})).status_code == 200
    with pytest.raises(httpx.ConnectError):
        await _health(fleet.url("a"))
    assert (await client.post(control + "/faults/a", json={"fault": "revive"})).status_code == 200
    assert await _health(fleet.url("a")) == 200
    assert (await client.get(control + "/faults")).json()["a"]["slow_factor"] == 1.0

    unknown = await client.post(control + "/faults/zz", json={"fault": "kill"})
    assert unknown.status_code == 404
    wrong = await client.post(control + "/faults/a", json={"fault": "explode"})
    assert wrong.status_code == 400
    assert "fault" in wrong.json()["error"]["message"]
    bad = await client.post(control + "/faults/a", json={"fault": "fail", "fraction": 2})
    assert bad.status_code == 400
    garbled = await client.post(control + "/faults/a", content=b"{")
    assert garbled.status_code == 400

    frozen = await client.post(control + "/faults/b", json={"fault": "freeze"})
    assert frozen.json()["faults"]["frozen"] is True
    assert fleet.replica("b").driver.frozen
    thawed = await client.post(control + "/faults/b", json={"fault": "thaw"})
    assert thawed.json()["faults"]["frozen"] is False
    assert not fleet.replica("b").driver.frozen
