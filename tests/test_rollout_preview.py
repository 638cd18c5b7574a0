"""A rollout's preview (its plan and the simulator's prediction, nothing started) over the
admin API, the manager's own call and ``gpurouter ctl rollout start --dry-run``, against a
real router in front of emulated replicas; and a started rollout's prediction kept beside
what it measured."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from router.emulator import EmulatedFleet
from router.errors import RolloutError
from router.http.server import RouterServer
from router.replica import ReplicaState
from router.rollout.preview import RolloutPreview
from tests.http_support import MODEL, Spec, routed
from tests.rollout_support import NEW as ROLLED_TO
from tests.rollout_support import TOKEN, rolling
from tests.test_ctl import Ctl, _no_ctl_environment

AUTH = {"Authorization": f"Bearer {TOKEN}"}

__all__ = ["_no_ctl_environment"]  # the autouse fixture, applied here too

SPECS = (Spec("a0"), Spec("a1"), Spec("v0", gpu="V100-32GB"))
NEW = "Llama-3.1-8B-v2"


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RouterServer, EmulatedFleet, int]]:
    async with routed(SPECS) as (server, emulated):
        yield server, emulated, await emulated.start_control()


@pytest.fixture
def ctl(capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


def _settings(port: int, **more: Any) -> dict[str, Any]:
    body = f'{{"version": "{{version}}", "load_s": 0.2, "aliases": ["{MODEL}"]}}'
    http = {"url": f"http://127.0.0.1:{port}/versions/{{replica}}", "body": body}
    return {
        "floor": 0.5,
        "check_interval_s": 0.01,
        "load_estimate_s": 0.2,
        "updater": {"http": {**http, "expect_status": 202}},
        **more,
    }


async def _post(server: RouterServer, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=30.0) as admin:
        return await admin.post("/admin/rollout", json=body)


async def test_a_preview_answers_the_plan_and_the_prediction_and_changes_nothing(
    fleet: tuple[RouterServer, EmulatedFleet, int],
) -> None:
    server, emulated, port = fleet
    trail = len(server.control.audit)
    versions = emulated.versions()
    answer = await _post(server, {"action": "preview", "version": NEW, "settings": _settings(port)})
    assert answer.status_code == 200, answer.text
    preview = answer.json()["preview"]
    assert preview["version"] == NEW
    assert preview["plan"]["order"][0] == "v0"  # weakest first, as a start plans it
    assert sorted(r for w in preview["plan"]["waves"] for r in w["replicas"]) == ["a0", "a1", "v0"]
    prediction = preview["prediction"]
    assert prediction["capacity_lowest"] == pytest.approx(preview["plan"]["lowest"], abs=1e-4)
    assert prediction["duration_s"] > 0
    assert {"peak_queue", "ttft_p99_s", "arrival_rps"} <= set(prediction)
    assert "/versions/v0" in preview["updater"]  # the first replica to go
    # Nothing started, drained, switched or recorded.
    assert server.rollouts.current is None
    assert {r.state for r in server.core.pool} == {ReplicaState.ACTIVE}
    assert emulated.versions() == versions
    assert len(server.control.audit) == trail
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=5.0) as admin:
        assert (await admin.get("/admin/rollout")).json() == {"rollout": None}


async def test_the_managers_preview_is_typed_and_refuses_what_start_refuses(
    fleet: tuple[RouterServer, EmulatedFleet, int],
) -> None:
    server, _, port = fleet
    preview = await server.rollouts.preview(NEW, _settings(port))
    assert isinstance(preview, RolloutPreview)
    assert preview.plan.floor == 0.5
    assert preview.load_s == 0.2
    for version in ("has space", ""):
        with pytest.raises(RolloutError, match="is not a model name"):
            await server.rollouts.preview(version, _settings(port))
        with pytest.raises(RolloutError, match="is not a model name"):
            server.rollouts.start(version, _settings(port), "test")
    assert server.rollouts.current is None


@pytest.mark.parametrize(
    ("version", "settings", "status", "message"),
    [
        (NEW, {"floor": 0.9}, 409, "alone is"),
        ("has space", {}, 400, "`version` must be a model name"),
        (NEW, {"floor": 2}, 400, "rollout.floor"),
        (NEW, {"updater": None}, 409, "no updater"),
    ],
)
async def test_bad_input_is_refused_by_a_preview_as_by_a_start(
    fleet: tuple[RouterServer, EmulatedFleet, int],
    version: str,
    settings: dict[str, Any],
    status: int,
    message: str,
) -> None:
    server, _, port = fleet
    given = {k: v for k, v in {**_settings(port), **settings}.items() if v is not None}
    answers = [
        await _post(server, {"action": action, "version": version, "settings": given})
        for action in ("preview", "start")
    ]
    for answer in answers:
        assert answer.status_code == status, answer.text
        assert message in answer.json()["error"]["message"]
    assert answers[0].json()["error"]["message"] == answers[1].json()["error"]["message"]
    assert server.rollouts.current is None
    assert {r.state for r in server.core.pool} == {ReplicaState.ACTIVE}


async def test_ctl_dry_run_prints_the_plan_and_the_prediction_and_starts_nothing(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, _, port = fleet
    body = f'{{"version": "{{version}}", "load_s": 0.2, "aliases": ["{MODEL}"]}}'
    args = [
        "rollout", "start", NEW, "--floor", "0.5", "--load-estimate", "0.2",
        "--http-url", f"http://127.0.0.1:{port}/versions/{{replica}}",
        "--http-body", body, "--http-expect", "202", "--dry-run",
    ]  # fmt: skip
    shown = await ctl(*args, "--admin", server.admin_url)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0].startswith(f"preview: {NEW} in ")
    assert lines[0].endswith("(floor 50%), nothing started")
    assert any(line.startswith("wave 1: v0 (leaves ") for line in lines)
    predicted = next(line for line in lines if line.startswith("predicted at "))
    assert "each replica out 0.2 s" in predicted
    assert "capacity at lowest" in predicted
    assert "peak queue" in predicted
    assert "p99 TTFT during" in predicted
    as_json = await ctl(*args, "--json", "--admin", server.admin_url)
    assert json.loads(as_json.out)["prediction"]["load_s"] == 0.2
    assert server.rollouts.current is None
    status = await ctl("rollout", "status", "--admin", server.admin_url)
    assert status.out == "no rollout yet\n"
    refused = await ctl(*args[:-1], "--floor", "0.95", "--dry-run", "--admin", server.admin_url)
    assert refused.code == 1
    assert "alone is" in refused.err


async def test_a_started_rollout_keeps_its_prediction_beside_what_it_measured(
    fleet: tuple[RouterServer, EmulatedFleet, int], ctl: Ctl
) -> None:
    server, _, port = fleet
    started = await _post(server, {"action": "start", "version": NEW, "settings": _settings(port)})
    assert started.status_code == 200, started.text
    assert "measured" in started.json()["rollout"]
    rollout: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=5.0) as admin:
        for _ in range(3000):
            rollout = (await admin.get("/admin/rollout")).json()["rollout"]
            if rollout["phase"] == "done" and rollout["prediction"] is not None:
                break
            await asyncio.sleep(0.01)
    assert rollout["phase"] == "done", rollout
    predicted, measured = rollout["prediction"], rollout["measured"]
    assert predicted is not None, rollout.get("prediction_error")
    assert measured["capacity_lowest"] == pytest.approx(rollout["capacity_lowest"], abs=1e-4)
    assert predicted["capacity_lowest"] == pytest.approx(rollout["plan"]["lowest"], abs=1e-4)
    assert measured["duration_s"] > 0
    assert measured["peak_queue"] >= 0
    shown = await ctl("rollout", "status", "--admin", server.admin_url)
    lines = shown.out.splitlines()
    header = next(i for i, line in enumerate(lines) if "PREDICTED" in line)
    assert "MEASURED" in lines[header]
    rows = [line.split("  ")[0] for line in lines[header + 1 :]]
    assert rows == ["capacity at lowest", "peak queue", "p99 TTFT during", "duration"]


async def test_the_preview_is_the_plan_a_start_then_makes_with_shares_and_settings() -> None:
    async with rolling(token=TOKEN) as (server, _):
        preview = await server.rollouts.preview(ROLLED_TO, {"floor": 0.4, "drain_timeout_s": 30})
        shown = preview.to_dict()
        assert server.rollouts.current is None
        assert list(server.control.audit) == []
        assert shown["prediction"]["capacity_lowest"] >= 0.4
        assert sum(shown["shares"].values()) == pytest.approx(1.0)
        settings = shown["settings"]
        assert (settings["floor"], settings["drain_timeout_s"]) == (0.4, 30)
        assert (settings["order"], settings["on_drain_timeout"]) == ("weakest-first", "wait")
        assert settings["updater"].startswith("http: POST http://127.0.0.1:")
        rollout = server.rollouts.start(ROLLED_TO, {"floor": 0.4}, "test")
        assert rollout.plan.to_dict() == shown["plan"]
        await rollout.wait()


async def test_the_admin_api_answers_the_preview_or_the_refusal_a_start_would_get() -> None:
    async with rolling(token=TOKEN) as (server, _):
        assert server.admin_url is not None
        async with httpx.AsyncClient(base_url=server.admin_url, headers=AUTH) as http:
            body = {"action": "preview", "version": ROLLED_TO, "settings": {"floor": 0.4}}
            ok = await http.post("/admin/rollout", json=body)
            assert ok.status_code == 200
            assert [w["replicas"] for w in ok.json()["preview"]["plan"]["waves"]]
            body["settings"] = {"floor": 0.99}
            refused = await http.post("/admin/rollout", json=body)
            assert refused.status_code == 409
            assert "alone is" in refused.json()["error"]["message"]
            body["settings"] = {"floor": 2}
            bad = await http.post("/admin/rollout", json=body)
            assert bad.status_code == 400
            assert "rollout.floor" in bad.json()["error"]["message"]
            wrong = await http.post("/admin/rollout", json={"action": "plan"})
            assert wrong.status_code == 400
            assert "start, preview, pause" in wrong.json()["error"]["message"]
        assert server.rollouts.current is None
        assert not any(e.kind == "rollout" for e in server.control.audit)
