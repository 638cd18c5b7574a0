"""``/admin/split`` on a real router in front of emulated replicas: a fleet file's blue-green
set switched over HTTP (green takes every request, blue drained and reported empty, then
released), and the requests it refuses with their status."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from router.config.schema import FleetConfig
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.http_support import MODEL, Spec, openai_client, routed, routed_fleet
from tests.test_emulator_support import any_ports, fleet_config

SPECS = (Spec("b0"), Spec("b1"), Spec("g0"), Spec("g1"))
GREEN = "Llama-3.1-8B-v2"


def _blue_green() -> FleetConfig:
    """b0, b1 on the model; g0, g1 on GREEN (served under the model too), held out."""
    config = fleet_config(*SPECS)
    node = config.nodes[0]
    replicas = tuple(
        dataclasses.replace(r, version=GREEN) if r.id.startswith("g") else r for r in node.replicas
    )
    nodes = (dataclasses.replace(node, replicas=replicas),)
    rollout = dataclasses.replace(config.rollout, green=GREEN)
    return dataclasses.replace(config, nodes=nodes, rollout=rollout)


@pytest.fixture
async def blue_green() -> AsyncIterator[RouterServer]:
    config = _blue_green()
    async with EmulatedFleet(config, time_scale=100.0, ports=any_ports(SPECS)) as emulated:
        server = RouterServer(
            routed_fleet(config, emulated), listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
        )
        await server.start()
        try:
            yield server
        finally:
            await server.stop(grace_s=0)


async def _send(server: RouterServer, n: int) -> set[str]:
    """``n`` requests for the model through the front door; the replicas that served them."""
    client = openai_client(server)
    before = {r.id: r.completed for r in server.core.pool}
    for _ in range(n):
        await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
    await client.close()
    return {r.id for r in server.core.pool if r.completed > before[r.id]}


async def _act(server: RouterServer, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=10.0) as admin:
        return await admin.post("/admin/split", json=body, headers={"X-Actor": "dana"})


async def test_a_blue_green_switch_over_http_moves_everything_to_green(
    blue_green: RouterServer,
) -> None:
    server = blue_green
    assert await _send(server, 12) == {"b0", "b1"}
    switched = await _act(server, action="switch")
    assert switched.status_code == 200, switched.text
    split = switched.json()["split"]
    assert (split["phase"], split["share"], split["emptied"]) == ("switched", 1.0, True)
    assert {rid: r["state"] for rid, r in split["blue"].items()} == dict.fromkeys(
        ("b0", "b1"), "drained"
    )
    assert await _send(server, 12) == {"g0", "g1"}
    back = (await _act(server, action="switch back")).json()["split"]
    assert (back["phase"], back["share"]) == ("blue", 0.0)
    assert await _send(server, 12) == {"b0", "b1"}
    await _act(server, action="switch")
    released = await _act(server, action="release")
    assert released.json()["split"]["phase"] == "released"
    assert server.core.split is None
    assert await _send(server, 12) == {"g0", "g1"}
    assert {server.core.replica(r).state for r in ("b0", "b1")} == {ReplicaState.DRAINED}
    steps = [e.args["step"] for e in server.control.audit if e.kind == "rollout"]
    assert steps == ["switch", "blue empty", "switch back", "switch", "blue empty", "release"]


@pytest.fixture
async def plain() -> AsyncIterator[RouterServer]:
    async with routed((Spec("a0"), Spec("a1"))) as (server, _):
        yield server


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"action": "jump"}, 400, "`action` must be one of"),
        ({"action": "step", "percent": 5, "extra": 1}, 400, "takes no key `extra`"),
        ({"action": "promote", "version": "x"}, 400, "takes no key `version`"),
        ({"action": "step", "percent": 5}, 409, "there is no canary"),
        ({"action": "switch"}, 409, "declares no blue-green set"),
        ({"action": "canary"}, 409, "needs `version`"),
        ({"action": "canary", "version": "v9"}, 409, "no replica runs v9"),
        (
            {"action": "canary", "version": "v9", "replicas": ["a0"]},
            409,
            "a0 does not run v9: give an updater",
        ),
        (
            {"action": "canary", "version": "v9", "replicas": ["a0"], "settings": {"floor": 3}},
            400,
            "rollout.floor",
        ),
    ],
)
async def test_refusals_and_unreadable_requests(
    plain: RouterServer, body: dict[str, Any], status: int, words: str
) -> None:
    answer = await _act(plain, **body)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"]


async def test_without_a_split_the_state_says_none(plain: RouterServer) -> None:
    async with httpx.AsyncClient(base_url=plain.admin_url, timeout=10.0) as admin:
        assert (await admin.get("/admin/split")).json() == {"split": None}
        state = (await admin.get("/admin/state")).json()
    assert state["split"] is None
    assert {r["version"] for r in state["replicas"]} == {MODEL}
