"""Model rollouts from the console, through both backends: the router in the console's
process, and the same router attached through its admin API. A key opens the form, the plan
is shown before anything starts, confirming starts it, and the progress screen follows it
to the end; a plan the floor cannot keep is refused with no start offered; a read-only
console refuses, saying why; pause and abort go through a confirmation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Input, Static

from console.app import ConsoleApp
from console.attach.admin_http import AsyncAdmin
from console.attach.backend import NO_TOKEN, RemoteBackend, fetch_state
from console.attach.state import fleet_from_json
from console.rollout.confirm import RolloutConfirm
from console.rollout.form import RolloutForm
from console.rollout.progress import RolloutScreen
from console.router_host import LocalRouter
from console.screens.confirm import ConfirmScreen
from console.widgets.events_pane import EventsPane
from router.control import Event
from router.http.server import RouterServer
from tests.fleet_factory import make_fleet
from tests.http_support import MODEL
from tests.rollout_support import NEW, TOKEN, backend_for, refreshed, rolling

SIZE = (120, 40)
BACKENDS = ["local", "attached"]


def toasts(app: ConsoleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def static_text(app: ConsoleApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


async def ask(app: ConsoleApp, pilot: Pilot[None], version: str, floor: str) -> None:
    """Fill the rollout form and submit it; the confirmation is up once the plan came."""
    form = app.screen
    assert isinstance(form, RolloutForm)
    form.query_one("#rollout-version", Input).value = version
    form.query_one("#rollout-floor", Input).value = floor
    await pilot.press("enter")
    await app.workers.wait_for_complete()
    await pilot.pause()


def step_seen(server: RouterServer, step: str) -> asyncio.Event:
    """Set once the rollout's audit trail records ``step``."""
    seen = asyncio.Event()

    def listener(event: Event) -> None:
        if event.kind == "rollout" and event.args.get("step") == step:
            seen.set()

    server.control.subscribe(listener)
    return seen


@pytest.mark.parametrize("kind", BACKENDS)
async def test_the_plan_is_shown_then_confirmed_followed_to_done_and_rolled_back(
    kind: str,
) -> None:
    async with rolling(token=TOKEN) as (server, emulated), backend_for(kind, server) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("v")
            await pilot.pause()
            await ask(app, pilot, NEW, "0.4")
            assert isinstance(app.screen, RolloutConfirm)
            plan = static_text(app, "#rollout-plan")
            assert "wave 1" in plan
            assert "in service" in plan
            assert "(floor 40%)" in plan
            for replica in ("a0", "v0", "v1"):
                assert f"{replica} " in plan  # each with its share of capacity
            assert "updater http: POST http://127.0.0.1:" in plan
            # The simulator's prediction under the plan, from the router's preview.
            assert app.screen.query_one("#rollout-prediction", Static).display
            predicted = static_text(app, "#rollout-prediction")
            assert predicted.startswith("predicted: capacity at lowest ")
            assert "p99 TTFT" in predicted
            assert server.rollouts.current is None  # nothing started before the answer
            await pilot.press("y")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert isinstance(app.screen, RolloutScreen)
            assert server.rollouts.current is not None
            await server.rollouts.current.wait()
            await refreshed(app)
            await pilot.pause()
            shown = app.screen.plain
            assert f"{NEW} done" in shown
            assert "capacity in service 100% now" in shown
            assert "(floor 40%)" in shown
            assert "requests moved" in shown
            for replica in ("a0", "v0", "v1"):
                line = next(ln for ln in shown.splitlines() if ln.startswith(replica))
                assert "updated" in line
                assert NEW in line
            assert {v["version"] for v in emulated.versions().values()} == {NEW}
            start = next(e for e in server.control.audit if e.kind == "rollout")
            expected = "console" if kind == "local" else "attached-console:test"
            assert start.actor == expected

            await pilot.press("b")  # roll back, once confirmed as destructive
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            assert app.screen.danger
            await pilot.press("y")
            await app.workers.wait_for_complete()
            status = await server.rollouts.current.wait()
            await refreshed(app)
            await pilot.pause()
            assert status.phase == "rolled back"
            assert f"{NEW} rolled back" in app.screen.plain
            assert {v["version"] for v in emulated.versions().values()} == {MODEL}


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_plan_the_floor_cannot_keep_shows_the_refusal_and_offers_no_start(
    kind: str,
) -> None:
    async with rolling(token=TOKEN) as (server, _), backend_for(kind, server) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("v")
            await pilot.pause()
            await ask(app, pilot, NEW, "99%")
            assert isinstance(app.screen, RolloutConfirm)
            refused = static_text(app, "#rollout-plan")
            assert "refused" in refused
            assert "alone is" in refused
            assert "floor of 99%" in refused
            assert not app.screen.query_one("#yes", Button).display
            await pilot.press("y")
            await pilot.pause()
            await app.workers.wait_for_complete()
            assert server.rollouts.current is None
            assert not any(e.kind == "rollout" for e in server.control.audit)


async def test_a_bad_field_is_named_in_the_form_and_nothing_is_asked() -> None:
    async with rolling(token=TOKEN) as (server, _), backend_for("local", server) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("v")
            await pilot.pause()
            await ask(app, pilot, NEW, "most")
            assert isinstance(app.screen, RolloutForm)
            assert "floor: 'most' is not a share" in static_text(app, "#rollout-form-error")


async def test_attached_without_a_token_the_rollout_keys_say_why_and_send_nothing() -> None:
    async with rolling() as (server, _), backend_for("attached", server, token=None) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("v")  # a watcher gets the progress screen, not the form
            await pilot.pause()
            assert isinstance(app.screen, RolloutScreen)
            assert "No rollout yet" in app.screen.plain
            for key in ("n", "p", "r", "a", "b"):
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, RolloutScreen)
            refused = {t.removeprefix(NO_TOKEN + ": ") for t in toasts(app) if NO_TOKEN in t}
            assert refused == {
                "rollout refused",
                "pause refused",
                "resume refused",
                "abort refused",
                "roll back refused",
            }
        assert server.rollouts.current is None
        assert list(server.control.audit) == []


@pytest.mark.parametrize("kind", BACKENDS)
async def test_pause_and_abort_each_ask_first_and_the_rollout_stops_after_its_wave(
    kind: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    async with (
        rolling(token=TOKEN, gate=gate) as (server, emulated),
        backend_for(kind, server) as backend,
    ):
        updating = step_seen(server, "update")
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("v")
            await pilot.pause()
            await ask(app, pilot, NEW, "0.4")
            await pilot.press("y")
            await app.workers.wait_for_complete()
            await asyncio.wait_for(updating.wait(), timeout=30)  # held in its first update
            await refreshed(app)
            await pilot.pause()
            assert isinstance(app.screen, RolloutScreen)
            assert "running, wave 1 of" in app.screen.plain

            await pilot.press("p")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await app.workers.wait_for_complete()
            await refreshed(app)
            await pilot.pause()
            assert isinstance(app.screen, RolloutScreen)
            assert f"{NEW} paused" in app.screen.plain

            await pilot.press("a")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")  # cancelled: nothing sent
            await pilot.pause()
            assert not any(e.args.get("step") == "abort" for e in server.control.audit)
            await pilot.press("a")
            await pilot.pause()
            await pilot.press("y")
            await app.workers.wait_for_complete()
            assert any(e.args.get("step") == "abort" for e in server.control.audit)

            gate.touch()  # the update under way is seen through; no later wave starts
            current = server.rollouts.current
            assert current is not None
            status = await current.wait()
            await refreshed(app)
            await pilot.pause()
            assert status.phase == "aborted"
            assert f"{NEW} aborted" in app.screen.plain
            first = set(status.plan.waves[0].replicas)
            versions = {rid: v["version"] for rid, v in emulated.versions().items()}
            assert {rid for rid, v in versions.items() if v == NEW} == first
            written = "\n".join(app.query_one(EventsPane).lines_written)
            assert "⟳" in written
            assert "pauses after the current wave" in written


class NoRollouts(httpx.AsyncBaseTransport):
    """The real admin API, but for ``/admin/rollout``, which answers 404 as a service of
    several workers does; counts the asks."""

    def __init__(self) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.asked = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/admin/rollout":
            self.asked += 1
            return httpx.Response(404, json={"error": {"message": "not served here"}})
        return await self.real.handle_async_request(request)

    async def aclose(self) -> None:
        await self.real.aclose()


async def test_an_attached_router_without_rollouts_is_asked_once_and_stays_attached() -> None:
    async with rolling(token=TOKEN) as (server, _):
        assert server.admin_url is not None
        transport = NoRollouts()
        admin = AsyncAdmin(server.admin_url, token=TOKEN, actor="t", transport=transport)
        fleet = fleet_from_json(await admin.get("/admin/fleet"))
        backend = RemoteBackend(admin, fleet, await fetch_state(admin), [], read_only=False)
        try:
            for _ in range(3):
                await backend.poll()
            assert backend.link.up
            assert backend.rollout() is None
            assert transport.asked == 1
        finally:
            await admin.aclose()


def test_the_console_router_hands_its_rollouts_to_the_console() -> None:
    """``gpurouter console``'s own router: the console steers the rollouts it runs."""
    host = LocalRouter(make_fleet(), telemetry=False)
    assert host.backend().rollouts is host.server.rollouts
