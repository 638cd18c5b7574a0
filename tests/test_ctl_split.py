"""`gpurouter ctl rollout canary ...`, `switch` and `split` against a real router in front of
emulated replicas: a canary moved there by the updater, stepped by the operator and aborted
(its replica back on the old version), and the refusals with ctl's exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from tests.http_support import MODEL, Spec, routed
from tests.test_ctl import Ctl, _no_ctl_environment, one_error_line

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


def _start(port: int, *more: str) -> list[str]:
    body = f'{{"version": "{{version}}", "load_s": 1, "aliases": ["{MODEL}"]}}'
    return [
        "rollout",
        "canary",
        "start",
        NEW,
        "--replicas",
        "v0",
        "--manual",
        "--http-url",
        f"http://127.0.0.1:{port}/versions/{{replica}}",
        "--http-body",
        body,
        "--http-expect",
        "202",
        *more,
    ]


async def _until_phase(ctl: Ctl, admin: str, phase: str) -> dict[str, object]:
    for _ in range(2000):
        result = await ctl("rollout", "split", "--json", "--admin", admin)
        split: dict[str, object] = json.loads(result.out)
        if split["phase"] == phase:
            return split
        await asyncio.sleep(0.01)
    raise AssertionError(f"the canary never reached {phase}")


async def test_a_canary_is_started_stepped_and_aborted_from_ctl(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, emulated, port = fleet
    admin = server.admin_url
    before = await ctl("rollout", "split", "--admin", admin)
    assert (before.code, before.out) == (0, "no traffic split\n")
    started = await ctl(*_start(port), "--admin", admin, "--actor", "erin")
    assert started.code == 0, started.err
    assert f"{NEW} 0%" in started.out
    await _until_phase(ctl, admin, "running")
    stepped = await ctl("rollout", "canary", "step", "30", "--admin", admin)
    assert stepped.code == 0, stepped.err
    assert f"{NEW} 30%, {MODEL} 70%" in stepped.out
    assert "canary replicas: v0" in stepped.out
    status = await ctl("status", "--admin", admin)
    assert f"split {MODEL}: {NEW} 30%" in status.out
    header = next(line for line in status.out.splitlines() if line.startswith("replica"))
    assert "version" in header  # two versions run: the column shows
    state = json.loads((await ctl("status", "--json", "--admin", admin)).out)
    assert {r["id"]: r["version"] for r in state["replicas"]} == {
        "a0": MODEL,
        "v0": NEW,
        "v1": MODEL,
    }
    aborted = await ctl("rollout", "canary", "abort", "--admin", admin)
    assert aborted.code == 0, aborted.err
    assert f"{NEW} 0%" in aborted.out
    await _until_phase(ctl, admin, "aborted")
    assert {v["version"] for v in emulated.versions().values()} == {MODEL}
    shares = [e.args["share"] for e in server.control.audit if e.args.get("step") == "share"]
    assert shares == [0.3, 0.0]
    start = next(e for e in server.control.audit if e.args.get("step") == "canary")
    assert start.actor == "erin"


async def test_refusals_exit_1_and_bad_values_exit_2(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, _, port = fleet
    admin = server.admin_url
    step = await ctl("rollout", "canary", "step", "10", "--admin", admin)
    assert step.code == 1
    assert "there is no canary" in one_error_line(step)
    switch = await ctl("rollout", "switch", "--admin", admin)
    assert switch.code == 1
    assert "declares no blue-green set" in one_error_line(switch)
    steps = await ctl(*_start(port, "--steps", "5,x"), "--admin", admin)
    assert steps.code == 2
    assert "--steps" in one_error_line(steps)
    rising = await ctl(*_start(port, "--steps", "50,10"), "--admin", admin)
    assert rising.code == 2
    assert "rollout.canary.steps: each step must be above the one before" in one_error_line(rising)
    unknown = await ctl(*_start(port), "--replicas", "x9", "--admin", admin)
    assert unknown.code == 1
    assert "no replica 'x9'" in one_error_line(unknown)
