"""A rollout on loopback: emulated replicas restarted through their control API by the HTTP
updater, a real router in front of them under a light bounded load, the executor in the
router's loop. No request is lost, capacity never goes under the floor, every replica ends on
the new version, and every step is in the audit trail the admin API serves. A failing or
hanging update command stops the rollout with the fleet serving."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import httpx
import openai
import pytest

from router.config.schema import CommandUpdaterConfig, HttpUpdaterConfig
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.replica import ReplicaState
from router.rollout.executor import Phase, Rollout, RolloutSpec, Step
from router.rollout.probe import HttpServingProbe
from router.rollout.updaters import CommandUpdater, HttpUpdater, Updater
from tests.http_support import MODEL, Spec, hint, openai_client, routed

SPECS = (Spec("a0"), Spec("a1"), Spec("v0", gpu="V100-32GB"), Spec("v1", gpu="V100-32GB"))
NEW = "Llama-3.1-8B-v2"
FLOOR = 0.6
MAX_REQUESTS = 2000
"""The load's bound: it stops when the rollout ends, or at this many requests."""


@dataclass
class Load:
    """Requests sent through the router while a rollout runs, and how each ended."""

    ok: int = 0
    failed: list[str] = field(default_factory=list)


async def _client_loop(
    client: openai.AsyncOpenAI, load: Load, stop: asyncio.Event, n: int, max_tokens: int
) -> None:
    i = 0
    while not stop.is_set() and load.ok + len(load.failed) < MAX_REQUESTS:
        i += 1
        try:
            if (i + n) % 3 == 0:
                chunks = await client.completions.create(
                    model=MODEL,
                    prompt="p",
                    max_tokens=max_tokens,
                    stream=True,
                    extra_body=hint(20, max_tokens),
                )
                async for _ in chunks:
                    pass
            else:
                await client.completions.create(
                    model=MODEL, prompt="p", max_tokens=max_tokens, extra_body=hint(20, max_tokens)
                )
            load.ok += 1
        except openai.APIError as exc:
            load.failed.append(str(exc))


@contextlib.asynccontextmanager
async def under_load(
    server: RouterServer, clients: int = 3, max_tokens: int = 8
) -> AsyncIterator[Load]:
    """``clients`` closed-loop clients, each request ``max_tokens`` long, until the block ends
    (or MAX_REQUESTS)."""
    load = Load()
    stop = asyncio.Event()
    client = openai_client(server)
    tasks = [
        asyncio.create_task(_client_loop(client, load, stop, n, max_tokens)) for n in range(clients)
    ]
    try:
        yield load
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await client.close()


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RouterServer, EmulatedFleet]]:
    async with routed(SPECS, batch_size=4) as pair:
        yield pair


def _rollout(server: RouterServer, session: aiohttp.ClientSession, updater: Updater) -> Rollout:
    spec = RolloutSpec(
        NEW, updater, floor=FLOOR, drain_timeout_s=30.0, ready_timeout_s=30.0, check_interval_s=0.01
    )
    probe = HttpServingProbe(session, timeout_s=5.0)
    return Rollout(
        spec, server.core, server.control, probe, actor="test", learn=server.served_models.learn
    )


async def test_a_rolling_update_under_load_loses_nothing_and_keeps_the_floor(
    fleet: tuple[RouterServer, EmulatedFleet],
) -> None:
    server, emulated = fleet
    port = await emulated.start_control()
    updater = HttpUpdater(
        HttpUpdaterConfig(
            f"http://127.0.0.1:{port}/versions/{{replica}}",
            body=f'{{"version": "{{version}}", "load_s": 2, "aliases": ["{MODEL}"]}}',
            expect_status=202,
        )
    )
    async with aiohttp.ClientSession() as session:
        rollout = _rollout(server, session, updater)
        shares: list[float] = []
        server.control.subscribe(lambda _: shares.append(rollout.status().capacity_now))
        async with under_load(server) as load:
            rollout.start()
            status = await rollout.wait()
    assert status.phase is Phase.DONE, status.error
    assert load.failed == []
    assert load.ok > 0
    assert set(status.steps.values()) == {Step.UPDATED}
    assert min(shares) >= FLOOR
    assert status.capacity_lowest >= FLOOR
    assert {rid: v["version"] for rid, v in emulated.versions().items()} == dict.fromkeys(
        ("a0", "a1", "v0", "v1"), NEW
    )
    assert {r.state for r in server.core.pool} == {ReplicaState.ACTIVE}
    assert all(r.served_models == (NEW, MODEL) for r in server.core.pool)
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=5.0) as admin:
        events = (await admin.get("/admin/events")).json()["events"]
    steps = [e["args"]["step"] for e in events if e["kind"] == "rollout"]
    assert steps[0] == "start"
    assert steps[-1] == "done"
    assert steps.count("serving") == len(SPECS)
    drained = {e["args"]["replica"] for e in events if e["kind"] == "drain" and e["ok"]}
    assert drained == {"a0", "a1", "v0", "v1"}


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (CommandUpdaterConfig("false"), "the update failed: exit 1"),
        (
            CommandUpdaterConfig("sleep 60", timeout_s=0.5),
            "the update failed: timed out after 0.5 s",
        ),
    ],
)
async def test_a_failing_or_hanging_update_command_stops_the_rollout_with_the_fleet_serving(
    fleet: tuple[RouterServer, EmulatedFleet], command: CommandUpdaterConfig, error: str
) -> None:
    server, emulated = fleet
    async with aiohttp.ClientSession() as session:
        rollout = _rollout(server, session, CommandUpdater(command))
        async with under_load(server) as load:
            rollout.start()
            status = await rollout.wait()
    assert status.phase is Phase.FAILED
    assert status.error is not None
    assert error in status.error
    first = status.plan.order[0]
    assert status.steps[first] is Step.KEPT
    assert {s for r, s in status.steps.items() if r != first} <= {Step.PENDING, Step.KEPT}
    assert load.failed == []
    assert {r.state for r in server.core.pool} == {ReplicaState.ACTIVE}
    assert {v["version"] for v in emulated.versions().values()} == {MODEL}
    client = openai_client(server)
    answer = await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
    await client.close()
    assert answer.choices
