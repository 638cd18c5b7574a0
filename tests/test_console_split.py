"""Canary and blue-green from the console (``g``), through both backends: the router in the
console's process, and the same router attached through its admin API (``/admin/split``).
A canary is asked in a form and confirmed before it starts, followed live (share, schedule,
the judge's figures for both versions, phase), its share moved, and rolled back or promoted,
each confirmed; a fleet file's blue-green set is switched, switched back and released, each
confirmed, its blue set shown empty; a read-only console refuses, saying why."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static

from console.app import ConsoleApp
from console.rollout.canary_form import CanaryForm, read_canary_form
from console.rollout.share_input import ShareScreen, parse_share
from console.rollout.split_model import CanaryState, split_from_json
from console.rollout.split_screen import SplitScreen
from console.screens.confirm import ConfirmScreen
from console.view.split import split_lines
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.rollout.canary import Canary
from tests.http_support import MODEL, routed_fleet
from tests.rollout_support import NEW, TOKEN, backend_for, refreshed, rolling
from tests.test_emulator_support import any_ports
from tests.test_split_admin import GREEN, SPECS, _blue_green

SIZE = (120, 40)
BACKENDS = ["local", "attached"]


def toasts(app: ConsoleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def confirm_text(app: ConsoleApp) -> str:
    assert isinstance(app.screen, ConfirmScreen)
    return str(app.screen.query_one("#confirm-body", Static).render())


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the router's tasks until ``condition`` holds (no clock involved)."""
    for _ in range(50_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met")


async def answer(app: ConsoleApp, pilot: Pilot[None], key: str) -> None:
    await pilot.press(key)
    await app.workers.wait_for_complete()
    await pilot.pause()


async def ask_canary(app: ConsoleApp, pilot: Pilot[None], **fields: str) -> None:
    """``g`` on a router with no split: the canary form, filled and submitted."""
    await pilot.press("g")
    await pilot.pause()
    form = app.screen
    assert isinstance(form, CanaryForm)
    for name, value in fields.items():
        form.query_one(f"#canary-{name}", Input).value = value
    await pilot.press("enter")
    await pilot.pause()


async def running_canary(server: RouterServer) -> Canary:
    """The canary the console started, once its replica runs the new version."""
    canary = server.rollouts.splits.canary
    assert canary is not None
    await until(lambda: canary.phase in ("running", "failed"))
    assert canary.phase == "running", canary.error
    return canary


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_canary_is_confirmed_followed_stepped_and_rolled_back(kind: str) -> None:
    async with rolling(token=TOKEN) as (server, emulated), backend_for(kind, server) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await ask_canary(app, pilot, version=NEW, replicas="v0", manual="yes")
            asked = confirm_text(app)
            assert "replicas    v0" in asked
            assert "moved by you (s), from 0%" in asked
            assert "the fleet file's rollout.updater" in asked
            assert server.rollouts.splits.canary is None  # nothing started before the answer
            await answer(app, pilot, "y")
            canary = await running_canary(server)
            expected = "console" if kind == "local" else "attached-console:test"
            assert canary.actor == expected
            await refreshed(app)
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, SplitScreen)
            shown = screen.plain
            assert f"{canary.id}: {NEW} on v0 beside {MODEL} running" in shown
            assert f"share now 0% of {MODEL} to the new version" in shown
            assert "steps: by the operator (s sets the share)" in shown
            assert "judged over its window" in shown
            assert f"new {NEW}" in shown
            assert f"old {MODEL}" in shown
            assert canary.rollout is not None
            assert f"its replicas moved by {canary.rollout.id}" in shown

            await pilot.press("s")  # the share: asked, then confirmed
            await pilot.pause()
            assert isinstance(app.screen, ShareScreen)
            app.screen.query_one(Input).value = "50"
            await pilot.press("enter")
            await pilot.pause()
            assert "gets 50% of the stable name's requests" in confirm_text(app)
            assert canary.share == 0.0
            await answer(app, pilot, "y")
            assert canary.share == 0.5
            await refreshed(app)
            await pilot.pause()
            assert "share now 50%" in screen.plain

            await pilot.press("b")  # roll back, as destructive, once confirmed
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            assert app.screen.danger
            await answer(app, pilot, "n")  # cancelled: nothing sent
            assert canary.phase == "running"
            await pilot.press("b")
            await pilot.pause()
            await answer(app, pilot, "y")
            assert canary.share == 0.0
            await canary.wait()
            await refreshed(app)
            await pilot.pause()
            assert canary.phase == "aborted"
            assert f"{NEW} on v0 beside {MODEL} aborted" in screen.plain
            assert emulated.versions()["v0"]["version"] == MODEL


async def test_a_canary_is_promoted_once_confirmed_and_the_rest_rolled() -> None:
    async with rolling(token=TOKEN) as (server, emulated), backend_for("attached", server) as b:
        app = ConsoleApp(b, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await ask_canary(app, pilot, version=NEW, replicas="v0", manual="yes", floor="40%")
            assert "floor       40%" in confirm_text(app)
            await answer(app, pilot, "y")
            canary = await running_canary(server)
            await refreshed(app)
            await pilot.press("p")
            await pilot.pause()
            assert "the updater rolls the rest of the model to it" in confirm_text(app)
            await answer(app, pilot, "y")
            await canary.wait()
            await refreshed(app)
            await pilot.pause()
            assert canary.phase == "promoted", "\n".join(e.message for e in server.control.audit)
            assert isinstance(app.screen, SplitScreen)
            assert f"{NEW} on v0 beside {MODEL} promoted" in app.screen.plain
            assert {v["version"] for v in emulated.versions().values()} == {NEW}


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_blue_green_set_is_switched_back_switched_and_released(kind: str) -> None:
    config = _blue_green()
    async with EmulatedFleet(config, time_scale=100.0, ports=any_ports(SPECS)) as emulated:
        server = RouterServer(
            routed_fleet(config, emulated),
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            admin_token=TOKEN,
        )
        await server.start()
        try:
            async with backend_for(kind, server) as b:
                app = ConsoleApp(b, auto_refresh=False)
                async with app.run_test(size=SIZE) as pilot:
                    await refreshed(app)
                    await pilot.press("g")  # the set is there: its screen, no form
                    await pilot.pause()
                    screen = app.screen
                    assert isinstance(screen, SplitScreen)
                    assert "blue" in screen.plain
                    assert f"{GREEN} serves" not in screen.plain
                    assert "waits for w" in screen.plain

                    await pilot.press("s")  # a canary's key on a blue-green set
                    await pilot.pause()
                    assert any("no canary" in t for t in toasts(app))
                    assert isinstance(app.screen, SplitScreen)  # still open: nothing asked

                    await pilot.press("w")
                    await pilot.pause()
                    assert isinstance(app.screen, ConfirmScreen)
                    assert app.screen.danger
                    assert "Every request of the model goes to the green set" in confirm_text(app)
                    await answer(app, pilot, "y")
                    await refreshed(app)
                    await pilot.pause()
                    assert f"share {GREEN} 100%, {MODEL} 0%" in screen.plain
                    assert "blue set: empty: r releases it" in screen.plain
                    blues = [ln for ln in screen.plain.splitlines() if ln.startswith("blue   b")]
                    assert len(blues) == 2
                    assert all("drain" in line for line in blues)

                    await pilot.press("u")
                    await pilot.pause()
                    await answer(app, pilot, "y")
                    await refreshed(app)
                    await pilot.pause()
                    assert f"share {GREEN} 0%, {MODEL} 100%" in screen.plain

                    await pilot.press("w")
                    await pilot.pause()
                    await answer(app, pilot, "y")
                    await pilot.press("r")
                    await pilot.pause()
                    assert "stays drained for its owner" in confirm_text(app)
                    await answer(app, pilot, "y")
                    await refreshed(app)
                    await pilot.pause()
                    assert f"released: {GREEN} serves all of {MODEL}" in screen.plain
                    steps = [e.args.get("step") for e in server.control.audit]
                    assert steps.count("switch") == 2
                    assert "switch back" in steps
                    assert "blue empty" in steps
                    assert "release" in steps
        finally:
            await server.stop(grace_s=0)


async def test_attached_without_a_token_the_split_keys_say_why_and_send_nothing() -> None:
    async with rolling() as (server, _), backend_for("attached", server, None) as b:
        app = ConsoleApp(b, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("g")  # a watcher sees the split (none yet), not a form
            await pilot.pause()
            assert isinstance(app.screen, SplitScreen)
            assert "No canary and no blue-green set" in app.screen.plain
            await pilot.press("n")
            await pilot.press("p")
            await pilot.pause()
            said = toasts(app)
            assert any("canary refused" in t and "GPUROUTER_ADMIN_TOKEN" in t for t in said)
            assert any("promote refused" in t for t in said)
            assert server.rollouts.splits.canary is None


async def test_a_field_that_cannot_be_a_value_is_named_and_nothing_is_sent() -> None:
    async with rolling(token=TOKEN) as (server, _), backend_for("local", server) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            await ask_canary(app, pilot, version=NEW, steps="5,lots")
            assert isinstance(app.screen, CanaryForm)
            error = str(app.screen.query_one("#canary-form-error", Static).render())
            assert "steps: '5,lots' is not percentages" in error
            assert server.rollouts.splits.canary is None


def test_the_form_sends_only_what_was_given() -> None:
    assert read_canary_form({"version": "m-v2"}) == {"action": "canary", "version": "m-v2"}
    body = read_canary_form(
        {
            "version": "m-v2",
            "replicas": "a, b",
            "model": "m",
            "steps": "10,50%,100",
            "dwell": "30",
            "window": "20",
            "manual": "yes",
            "floor": "60%",
            "updater": "systemctl restart vllm@{replica}",
        }
    )
    assert body == {
        "action": "canary",
        "version": "m-v2",
        "replicas": ["a", "b"],
        "model": "m",
        "manual": True,
        "settings": {
            "floor": 0.6,
            "canary": {"steps": [10.0, 50.0, 100.0], "dwell_s": 30.0, "window_s": 20.0},
            "updater": {"command": {"run": "systemctl restart vllm@{replica}"}},
        },
    }
    assert read_canary_form({"version": "m v2"}) == (
        "version: give the new version's model name (no spaces)"
    )
    assert read_canary_form({"version": "v", "manual": "maybe"}) == (
        "manual: 'maybe' is not yes or no"
    )
    assert parse_share("25%") == 25.0
    assert parse_share("120") == "120 is not within 0 to 100"


def test_a_rolled_back_canary_shows_the_verdict_and_the_figures_it_was_taken_on() -> None:
    figures = {"requests": 40, "errors": 40, "error_rate": 1.0, "p99_ttft_s": 0.061}
    old = {"requests": 812, "errors": 0, "error_rate": 0.0, "p99_ttft_s": 0.048}
    status = {
        "id": "canary-1",
        "kind": "canary",
        "model": "llama",
        "old": "llama",
        "new": "llama-v2",
        "replicas": ["v0"],
        "phase": "rolled back",
        "share": 0.0,
        "auto": True,
        "steps": [0.05, 0.25, 0.5, 1.0],
        "step": 1,
        "figures": {"new": figures, "old": old},
        "verdict": "error rate worse by more than 5% points: ...",
        "judged": {"new": figures, "old": old},
        "rollout": "rollout-2",
        "error": "error rate worse by more than 5% points: ...",
    }
    state = split_from_json(status)
    assert isinstance(state, CanaryState)
    text = "\n".join("".join(t for t, _ in line) for line in split_lines(state))
    assert "canary-1: llama-v2 on v0 beside llama rolled back" in text
    assert "steps: 5% → 25% → 50% → 100%, then promoted" in text  # no step marked once ended
    assert "new llama-v2" in text
    assert "100.0%" in text
    assert "61 ms" in text
    assert "rolled back: error rate worse by more than 5% points" in text
    assert "its replicas moved by rollout-2 (v shows it)" in text
    with pytest.raises(ValueError, match="not a traffic split"):
        split_from_json({"kind": "canary"})
