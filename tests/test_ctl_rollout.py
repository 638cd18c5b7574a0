"""`gpurouter ctl rollout` against a real router in front of emulated replicas: start one with
its own updater, follow it to the end, and its refusals with ctl's exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from tests.http_support import MODEL, Spec, routed
from tests.test_ctl import Ctl, Result, _no_ctl_environment, one_error_line

__all__ = ["_no_ctl_environment"]  # the autouse fixture, applied here too

SPECS = (Spec("a0"), Spec("v0", gpu="V100-32GB"), Spec("v1", gpu="V100-32GB"))
NEW = "Llama-3.1-8B-v2"


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RouterServer, EmulatedFleet, int]]:
    async with routed(SPECS) as (server, emulated):
        yield server, emulated, await emulated.start_control()


@pytest.fixture
def ctl(capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


async def _until_ended(ctl: Ctl, admin: str) -> dict[str, object]:
    for _ in range(2000):
        result = await ctl("rollout", "status", "--json", "--admin", admin)
        rollout: dict[str, object] = json.loads(result.out)
        if rollout["phase"] not in ("running", "paused", "rolling back"):
            return rollout
        await asyncio.sleep(0.01)
    raise AssertionError("the rollout did not end")


def _start(port: int, *more: str) -> list[str]:
    body = f'{{"version": "{{version}}", "load_s": 1, "aliases": ["{MODEL}"]}}'
    return [
        "rollout",
        "start",
        NEW,
        "--floor",
        "0.4",
        "--check-interval",
        "0.01",
        "--http-url",
        f"http://127.0.0.1:{port}/versions/{{replica}}",
        "--http-body",
        body,
        "--http-expect",
        "202",
        *more,
    ]


async def test_start_prints_the_plan_and_status_follows_it_to_the_end(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, emulated, port = fleet
    admin = server.admin_url
    before = await ctl("rollout", "status", "--admin", admin)
    assert (before.code, before.out) == (0, "no rollout yet\n")
    started = await ctl(*_start(port), "--admin", admin, "--actor", "erin")
    assert started.code == 0, started.err
    assert f": {NEW} running" in started.out
    assert "REPLICA  WAVE  STEP" in started.out
    rollout = await _until_ended(ctl, admin)
    assert rollout["phase"] == "done"
    status = await ctl("rollout", "status", "--admin", admin)
    assert "done" in status.out.splitlines()[0]
    assert "capacity in service 100% now" in status.out
    for replica in ("a0", "v0", "v1"):
        assert any(
            line.startswith(replica) and "updated" in line for line in status.out.splitlines()
        )
    assert {v["version"] for v in emulated.versions().values()} == {NEW}
    start = next(e for e in server.control.audit if e.kind == "rollout")
    assert start.actor == "erin"


async def test_an_explicit_order_is_sent_as_a_list(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, _, port = fleet
    started = await ctl(*_start(port, "--order", "v1,a0,v0", "--json"), "--admin", server.admin_url)
    assert json.loads(started.out)["plan"]["order"] == ["v1", "a0", "v0"]
    await _until_ended(ctl, server.admin_url)


async def test_a_refused_step_exits_1_and_a_bad_setting_exits_2(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, _, port = fleet
    admin = server.admin_url
    refused: Result = await ctl("rollout", "pause", "--admin", admin)
    assert refused.code == 1
    assert "there is no rollout" in one_error_line(refused)
    floor = await ctl(*_start(port), "--floor", "0.99", "--admin", admin)
    assert floor.code == 1
    assert "alone is" in one_error_line(floor)
    bad = await ctl(*_start(port), "--floor", "1.5", "--admin", admin)
    assert bad.code == 2
    assert "rollout.floor: must be > 0 and < 1" in one_error_line(bad)
    both = await ctl(*_start(port), "--command", "true", "--admin", admin)
    assert both.code == 2
    assert "give --command or --http-url, not both" in one_error_line(both)
