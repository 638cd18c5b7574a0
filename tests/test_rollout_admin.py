"""``/admin/rollout`` on a real router in front of emulated replicas: start a rollout with its
own settings, follow it to the end, and every refusal with its status and reason."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.replica import ReplicaState
from router.rollout.executor import Phase
from tests.http_support import MODEL, Spec, routed

SPECS = (Spec("a0"), Spec("a1"), Spec("v0", gpu="V100-32GB"))
NEW = "Llama-3.1-8B-v2"


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RouterServer, EmulatedFleet, int]]:
    async with routed(SPECS) as (server, emulated):
        port = await emulated.start_control()
        yield server, emulated, port


def _settings(port: int, load_s: float = 1.0, **more: Any) -> dict[str, Any]:
    body = f'{{"version": "{{version}}", "load_s": {load_s}, "aliases": ["{MODEL}"]}}'
    http = {"url": f"http://127.0.0.1:{port}/versions/{{replica}}", "body": body}
    return {
        "floor": 0.5,
        "check_interval_s": 0.01,
        "updater": {"http": {**http, "expect_status": 202}},
        **more,
    }


async def _post(server: RouterServer, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=10.0) as admin:
        return await admin.post("/admin/rollout", json=body, headers={"X-Actor": "dana"})


async def _ended(server: RouterServer) -> dict[str, Any]:
    """The rollout's state once it is no longer going (bounded)."""
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=10.0) as admin:
        for _ in range(2000):
            rollout: dict[str, Any] = (await admin.get("/admin/rollout")).json()["rollout"]
            if rollout["phase"] not in ("running", "paused", "rolling back"):
                return rollout
            await asyncio.sleep(0.01)
    raise AssertionError("the rollout did not end")


async def test_a_rollout_started_over_the_admin_api_runs_to_the_end(
    fleet: tuple[RouterServer, EmulatedFleet, int],
) -> None:
    server, emulated, port = fleet
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=5.0) as admin:
        assert (await admin.get("/admin/rollout")).json() == {"rollout": None}
    started = await _post(server, {"action": "start", "version": NEW, "settings": _settings(port)})
    assert started.status_code == 200
    plan = started.json()["rollout"]["plan"]
    assert sorted(plan["order"]) == ["a0", "a1", "v0"]
    assert plan["order"][0] == "v0"  # weakest first
    rollout = await _ended(server)
    assert rollout["phase"] == "done", rollout["error"]
    assert set(rollout["steps"].values()) == {"updated"}
    assert {v["version"] for v in emulated.versions().values()} == {NEW}
    assert {r.state for r in server.core.pool} == {ReplicaState.ACTIVE}
    start = next(e for e in server.control.audit if e.kind == "rollout")
    assert (start.actor, start.args["step"]) == ("dana", "start")
    again = await _post(server, {"action": "pause"})
    assert again.status_code == 409
    assert "only a running rollout pauses" in again.json()["error"]["message"]


async def test_an_explicit_order_is_followed(
    fleet: tuple[RouterServer, EmulatedFleet, int],
) -> None:
    server, _, port = fleet
    settings = _settings(port, order=["a1", "v0", "a0"])
    started = await _post(server, {"action": "start", "version": NEW, "settings": settings})
    assert started.json()["rollout"]["plan"]["order"] == ["a1", "v0", "a0"]
    assert (await _ended(server))["phase"] == "done"


async def test_one_rollout_at_a_time_and_a_replica_that_never_comes_back_is_flagged(
    fleet: tuple[RouterServer, EmulatedFleet, int],
) -> None:
    server, _, port = fleet
    settings = _settings(port, load_s=1e9, ready_timeout_s=0.3)
    first = await _post(server, {"action": "start", "version": NEW, "settings": settings})
    assert first.status_code == 200
    second = await _post(server, {"action": "start", "version": NEW, "settings": settings})
    assert second.status_code == 409
    assert "one rollout at a time" in second.json()["error"]["message"]
    rollout = await _ended(server)
    assert rollout["phase"] == "failed"
    assert rollout["steps"]["v0"] == "flagged"
    assert f"v0: does not serve {NEW} after 0.3 s" in rollout["error"]
    states = {r.id: r.state for r in server.core.pool}
    assert states == {
        "a0": ReplicaState.ACTIVE,
        "a1": ReplicaState.ACTIVE,
        "v0": ReplicaState.DRAINED,
    }


async def test_a_floor_that_cannot_be_kept_is_refused_naming_the_replica(
    fleet: tuple[RouterServer, EmulatedFleet, int],
) -> None:
    server, _, port = fleet
    answer = await _post(
        server, {"action": "start", "version": NEW, "settings": _settings(port, floor=0.9)}
    )
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "rollout_refused"
    assert "alone is" in answer.json()["error"]["message"]
    assert {r.state for r in server.core.pool} == {ReplicaState.ACTIVE}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"action": "start", "version": NEW, "settings": {"floor": 2}}, 400, "rollout.floor"),
        ({"action": "start", "version": NEW, "settings": {"flor": 0.5}}, 400, "did you mean"),
        ({"action": "start", "version": "has space"}, 400, "`version` must be a model name"),
        ({"action": "start", "version": NEW}, 409, "no updater"),
        ({"action": "jump"}, 400, "`action` must be one of"),
        ({"action": "abort", "now": True}, 400, "takes no other key"),
        ({"action": "resume"}, 409, "there is no rollout"),
    ],
)
async def test_a_bad_rollout_command_is_refused_with_what_is_wrong(
    fleet: tuple[RouterServer, EmulatedFleet, int],
    body: dict[str, Any],
    status: int,
    message: str,
) -> None:
    server, _, _ = fleet
    answer = await _post(server, body)
    assert answer.status_code == status
    assert message in answer.json()["error"]["message"]


async def test_a_router_that_stops_cancels_the_rollout_going() -> None:
    """A rollout waiting on a replica that loads for ever does not hold the router's stop."""
    async with routed(SPECS) as (server, emulated):
        port = await emulated.start_control()
        settings = _settings(port, load_s=1e9, ready_timeout_s=3600)
        started = await _post(server, {"action": "start", "version": NEW, "settings": settings})
        assert started.status_code == 200
        rollout = server.rollouts.current
        assert rollout is not None
        await server.stop(grace_s=0)
        assert rollout.status().phase is Phase.RUNNING  # cut short, not ended on its own
