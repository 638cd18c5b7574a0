"""A rollout's preview (``POST /admin/rollout`` with ``"action": "plan"``, the manager's
``preview``): the plan a start would make now, with each replica's capacity share and the
settings in force, and the same refusals as a start; nothing starts, nothing is recorded."""

from __future__ import annotations

import httpx
import pytest

from router.errors import RolloutError
from tests.rollout_support import NEW, TOKEN, rolling

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_preview_is_the_plan_a_start_then_makes_and_starts_nothing() -> None:
    async with rolling(token=TOKEN) as (server, _):
        preview = server.rollouts.preview(NEW, {"floor": 0.4, "drain_timeout_s": 30})
        assert server.rollouts.current is None
        assert list(server.control.audit) == []
        assert preview["prediction"] is None
        assert sum(preview["shares"].values()) == pytest.approx(1.0)
        settings = preview["settings"]
        assert (settings["floor"], settings["drain_timeout_s"]) == (0.4, 30)
        assert (settings["order"], settings["on_drain_timeout"]) == ("weakest-first", "wait")
        assert settings["updater"].startswith("http: POST http://127.0.0.1:")
        rollout = server.rollouts.start(NEW, {"floor": 0.4}, "test")
        assert rollout.plan.to_dict() == preview["plan"]
        with pytest.raises(RolloutError, match="one rollout at a time"):
            server.rollouts.preview(NEW, {"floor": 0.4})
        await rollout.wait()


async def test_the_admin_api_answers_the_preview_or_the_refusal_a_start_would_get() -> None:
    async with rolling(token=TOKEN) as (server, _):
        assert server.admin_url is not None
        async with httpx.AsyncClient(base_url=server.admin_url, headers=AUTH) as http:
            body = {"action": "plan", "version": NEW, "settings": {"floor": 0.4}}
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
            wrong = await http.post("/admin/rollout", json={"action": "preview"})
            assert wrong.status_code == 400
            assert "plan, start, pause" in wrong.json()["error"]["message"]
        assert server.rollouts.current is None
        assert not any(e.kind == "rollout" for e in server.control.audit)
