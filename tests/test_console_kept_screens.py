"""Screens the console builds once and keeps (help, strategy picker, replica detail,
confirmation): each open shows what a new screen would show now, never what the last open
showed, and opening and closing them leaves nothing behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Button, OptionList, Sparkline, Static

from console.app import ConsoleApp, partial_detail
from console.rollout.confirm import RolloutConfirm
from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen
from console.screens.replica_detail import THRU_LABEL, TTFT_LABEL, ReplicaDetail
from console.screens.strategy_picker import StrategyPicker
from router.strategies import STRATEGIES
from tests.console_helpers import loaded_rig

SIZE = (100, 30)


def option_heads(picker: StrategyPicker) -> list[str]:
    """Each option's first line as drawn: the cursor's mark, the name, ``(current)``."""
    options = picker.query_one(OptionList)
    heads = []
    for i in range(options.option_count):
        prompt = options.get_option_at_index(i).prompt
        assert isinstance(prompt, Group)
        head = prompt.renderables[0]
        assert isinstance(head, Text)
        heads.append(head.plain)
    return heads


def on_show(app: ConsoleApp, screen: Screen[Any]) -> bool:
    """``screen`` is the one on show (the same object: kept, not built again)."""
    return app.screen is screen


def static_text(screen: object, selector: str) -> str:
    assert isinstance(screen, (ReplicaDetail, ConfirmScreen))
    return str(screen.query_one(selector, Static).render())


async def test_the_picker_opened_again_marks_the_strategy_of_now_with_the_cursor_on_it() -> None:
    """A strategy switched while the picker was closed is the one it names and marks; the
    cursor moved before the last Escape is back on the current strategy."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    names = list(STRATEGIES)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        await pilot.pause()
        first = app.screen
        assert isinstance(first, StrategyPicker)
        await pilot.press("down", "down", "escape")
        await pilot.pause()
        other = next(n for n in names if n != rig.core.strategy.name)
        rig.core.set_strategy(other)
        await pilot.press("s")
        await pilot.pause()
        assert on_show(app, first)  # kept, not composed again
        current = names.index(other)
        title = str(first.query_one("#strategy-title", Static).render())
        assert title == f"Routing strategy (now {other})"
        assert first.query_one(OptionList).highlighted == current
        expected = [
            f"{'▶' if i == current else ' '} {name}{'  (current)' if name == other else ''}"
            for i, name in enumerate(names)
        ]
        assert option_heads(first) == expected
        await pilot.press("enter")  # Enter on the current strategy changes nothing
        await pilot.pause()
        assert rig.core.strategy.name == other
        assert not isinstance(app.screen, StrategyPicker)


async def test_the_kept_picker_still_switches_and_answers_its_own_open() -> None:
    """Each open's answer goes to that open: cancelled once, then a switch applied once."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    names = list(STRATEGIES)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "escape")
        await pilot.pause()
        target = names.index("round-robin")
        current = names.index(rig.core.strategy.name)
        step = "down" if target > current else "up"
        await pilot.press("s", *[step] * abs(target - current), "enter")
        await pilot.pause()
        assert rig.core.strategy.name == "round-robin"
        switches = [e for e in rig.control.audit if e.actor == "console"]
        assert [e.message for e in switches] == ["strategy is now round-robin"]


async def test_the_detail_opened_again_shows_the_replica_chosen_now_and_its_data_of_now() -> None:
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_data(tick=True)
        await pilot.press("i")
        await pilot.pause()
        first = app.screen
        assert isinstance(first, ReplicaDetail)
        assert static_text(first, "#facts").startswith("r0 ")
        await pilot.press("escape", "down", "i")
        await pilot.pause()
        assert on_show(app, first)  # kept, not composed again
        assert first.replica == "r1"
        facts = static_text(first, "#facts")
        assert facts.startswith("r1 ")
        in_flight = rig.core.replica("r1").in_flight
        assert f"batch {in_flight}/" in facts
        decisions = first.data().decisions
        assert decisions
        assert all(d.chosen == "r1" for d in decisions)
        assert decisions[0].request_id in static_text(first, "#decision-lines")
        # A change made while the screen was closed is what it shows.
        await pilot.press("escape")
        assert "draining" not in facts
        rig.core.drain("r1")
        app.refresh_data(tick=True)
        await pilot.press("i")
        await pilot.pause()
        assert "◐ draining" in static_text(first, "#facts").splitlines()[0]


async def test_the_detail_of_a_replica_without_history_shows_no_other_replicas_charts() -> None:
    """The charts of the replica opened before are not left on the kept screen."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_data(tick=True)
        app.refresh_data(tick=True)
        await pilot.press("i")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReplicaDetail)
        assert screen.query_one("#ttft", Sparkline).data
        await pilot.press("escape")
        await pilot.pause()
        app.history.replica.clear()  # as for a replica the console has no refresh of yet
        await pilot.press("down", "i")
        await pilot.pause()
        assert on_show(app, screen)
        assert screen.query_one("#ttft", Sparkline).data == []
        assert screen.query_one("#thru", Sparkline).data == []
        assert static_text(screen, "#ttft-label") == TTFT_LABEL
        assert static_text(screen, "#thru-label") == THRU_LABEL


async def test_a_closed_detail_is_not_drawn_at_each_refresh() -> None:
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("i", "escape")
        await pilot.pause()
        screen = app.get_screen("replica-detail")
        assert isinstance(screen, ReplicaDetail)
        drawn = 0

        def data() -> object:
            nonlocal drawn
            drawn += 1
            return kept_data()

        kept_data = screen.data
        screen.data = data  # type: ignore[assignment]
        for _ in range(3):
            app.refresh_data(tick=True)
        await pilot.pause()
        assert drawn == 0


async def test_the_detail_follows_a_theme_change_made_while_it_is_open() -> None:
    """Kept across opens, it is redrawn in the new theme's tones at once."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("i")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReplicaDetail)
        app.set_theme("light")
        await pilot.pause()
        assert screen.tones is app.styles_now
        await pilot.press("escape", "i")
        await pilot.pause()
        assert on_show(app, screen)
        assert screen.tones is app.styles_now


async def test_detail_opened_from_the_detail_opens_another_as_before() -> None:
    """The table's keys still work on the detail: ``i`` there opens a detail over it (a new
    one, since the kept one is open), and Escape twice is back at the table."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("i")
        await pilot.pause()
        kept = app.screen
        await pilot.press("i")
        await pilot.pause()
        assert isinstance(app.screen, ReplicaDetail)
        assert app.screen is not kept
        assert static_text(app.screen, "#facts").startswith("r0 ")
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert len(app.screen_stack) == 1


async def test_the_confirmation_opened_again_asks_about_the_action_and_replica_of_now() -> None:
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await pilot.pause()
        first = app.screen
        assert isinstance(first, ConfirmScreen)
        assert static_text(first, "#confirm-title") == "Drain r0?"
        await pilot.press("n", "down", "p")
        await pilot.pause()
        assert on_show(app, first)  # kept, not composed again
        assert static_text(first, "#confirm-title") == "Preempt r1?"
        assert str(first.query_one("#yes", Button).label) == "Preempt (y)"
        assert first.query_one("#yes", Button).variant == "error"
        assert first.query_one(Vertical).has_class("-danger")
        assert first.focused is first.query_one("#no", Button)
        body = static_text(first, "#confirm-body")
        assert body == "\n".join("".join(t for t, _ in line) for line in first.lines)
        assert first.lines == app._impact_lines("preempt", "r1")
        assert "  r0  " in body  # r1's share goes to the others, r0 among them
        # It follows the router for this open's replica, not the last one's.
        for a in [a for a in rig.core.running.values() if a.replica.id == "r1"]:
            rig.core.complete(a)
        app.refresh_data()
        await pilot.pause()
        assert static_text(first, "#confirm-body") != body
        await pilot.press("escape")
        await pilot.pause()
        assert not [e for e in rig.control.audit if e.actor == "console"]


async def test_the_kept_confirmation_applies_only_its_own_open_answer() -> None:
    """Cancelled for r0, then confirmed for r1: only r1 drains, once."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d", "n", "down", "d", "y")
        await pilot.pause()
        drains = [e for e in rig.control.audit if e.actor == "console"]
        assert [(e.kind, e.message.split(":")[0]) for e in drains] == [("drain", "r1")]


async def test_a_closed_confirmation_does_not_rebuild_its_body_at_each_refresh() -> None:
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d", "n")
        await pilot.pause()
        dialog = app.get_screen("confirm")
        assert isinstance(dialog, ConfirmScreen)
        assert dialog.follow is not None
        signal, build = dialog.follow
        built = 0

        def counted() -> list[object]:
            nonlocal built
            built += 1
            return list(build())

        dialog.follow = (signal, counted)  # type: ignore[assignment]
        for _ in range(3):
            app.refresh_data()
        await pilot.pause()
        assert built == 0


async def test_opening_and_closing_the_screens_again_and_again_leaves_nothing_behind() -> None:
    """After the first round, more rounds of every kept screen add no widget, no timer,
    no screen and no subscriber to the refresh signal."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)

    def census() -> tuple[int, int, int, int]:
        nodes = list(app._registry)
        timers = len(app._timers) + sum(len(n._timers) for n in nodes)
        subscribers = len(app.refreshed_signal._subscriptions)
        return len(nodes), timers, len(app._installed_screens), subscribers

    async with app.run_test(size=SIZE) as pilot:

        async def round_of_keys() -> None:
            for keys in (("s", "escape"), ("i", "escape"), ("question_mark", "escape")):
                await pilot.press(*keys)
                await pilot.pause()
            await pilot.press("d", "n", "p", "escape")
            await pilot.pause()
            app.refresh_data(tick=True)
            await pilot.pause()

        await round_of_keys()
        after_one = census()
        for _ in range(4):
            await round_of_keys()
        assert census() == after_one
        assert len(app.screen_stack) == 1
        kept = [app.get_screen(n) for n in ("help", "strategy-picker", "replica-detail", "confirm")]
        assert [type(s) for s in kept] == [HelpScreen, StrategyPicker, ReplicaDetail, ConfirmScreen]


async def test_quitting_while_the_refresh_runs_raises_nothing() -> None:
    """The app closes its screens (the kept ones too) before its refresh timer stops; a tick
    in between must not look for the dashboard's widgets, already gone."""
    for _ in range(3):
        rig = loaded_rig()
        app = ConsoleApp(rig.backend, refresh_s=0.01)
        async with app.run_test(size=SIZE) as pilot:
            for action in ("help", "strategy", "detail", "drain"):
                app.perform(action)
                await pilot.pause(0.05)
                await app.pop_screen()


KEPT = ("help", "strategy-picker", "replica-detail", "confirm")


async def test_the_kept_screens_are_built_before_their_first_key() -> None:
    """Once the dashboard is drawn, each kept screen is composed off screen, so even the
    first press of its key finds it built; the first ``i`` shows the selected replica."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.pause()
        built = [app.get_screen(name) for name in KEPT if app.is_screen_installed(name)]
        assert len(built) == len(KEPT)
        assert all(screen.is_running for screen in built)
        assert len(app.screen_stack) == 1  # built, not shown
        detail = app.get_screen("replica-detail")
        assert isinstance(detail, ReplicaDetail)
        await pilot.press("down", "i")
        await pilot.pause()
        assert on_show(app, detail)
        assert static_text(detail, "#facts").startswith("r1 ")


async def test_a_theme_change_leaves_no_screen_of_the_old_theme_running() -> None:
    """The kept screens drawn in the old theme's tones are taken down, not just forgotten,
    and built again: the app holds as many nodes after each change as before it."""
    rig = loaded_rig()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        for keys in (("s", "escape"), ("i", "escape"), ("d", "n")):
            await pilot.press(*keys)
            await pilot.pause()
        old = [app.get_screen(name) for name in KEPT]
        nodes = len(app._registry)
        counts = []
        for theme in ("light", "high-contrast", "light"):
            app.set_theme(theme)
            for _ in range(len(KEPT) + 2):
                await pilot.pause()
            counts.append(len(app._registry))
        # Fewer at most: screens shown before had scrollbars, made when first laid out.
        assert counts[0] <= nodes
        assert counts == [counts[0]] * 3
        assert not any(screen.is_running for screen in old)
        new = [app.get_screen(name) for name in KEPT]
        assert all(screen.is_running for screen in new)
        assert not set(map(id, new)) & set(map(id, old))


def test_a_kept_screen_mounted_as_the_app_closes_does_nothing() -> None:
    """A kept screen registered just before the app leaves (the demo's console quits at once
    when a child process dies) is composed while the app closes, and Textual then mounts none
    of its widgets: its mount must leave it be rather than fail the app's exit."""
    app = ConsoleApp(loaded_rig().backend)
    styles = app.styles_now
    screens: list[Screen[Any]] = [
        StrategyPicker("round-robin"),
        ReplicaDetail("r0", partial_detail(app, "r0"), styles),
        ConfirmScreen("", (), styles, confirm_label="", danger=False),
    ]
    for screen in screens:
        assert not screen.children  # nothing composed
        screen.on_mount()  # type: ignore[attr-defined]  # each of the three defines it


async def built_but_not_mounted(app: ConsoleApp, name: str) -> Screen[Any]:
    """The kept screen ``name`` as the app leaves it between two idle moments of building
    it: composed, its widgets not yet mounted. A key can land there (seen in CI under load:
    a preempt dialog with an empty title and body)."""
    screen = app._builders()[name]()
    app.install_screen(screen, name)
    app._register(app, screen)
    for _ in range(100):
        if screen.children:
            break
        await asyncio.sleep(0)
    assert screen.children  # composed ...
    assert not screen.is_mounted  # ... not yet mounted: the window this is about
    return screen  # no await after this: the caller acts in the window


class BuildsNothingAhead(ConsoleApp):
    """The test builds the kept screens itself, at the moment it chooses."""

    def _prepare_kept(self, names: list[str]) -> None:
        pass


async def test_a_key_while_its_dialog_is_being_built_shows_what_that_key_asks() -> None:
    rig = loaded_rig()
    app = BuildsNothingAhead(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await built_but_not_mounted(app, "confirm")
        app.perform("preempt")  # the key's action, in the window
        await pilot.pause()
        assert on_show(app, dialog)
        assert static_text(dialog, "#confirm-title") == "Preempt r0?"
        assert "then it stays drained" in static_text(dialog, "#confirm-body")
        assert str(dialog.query_one("#yes", Button).label) == "Preempt (y)"
        assert dialog.query_one(".hint", Static).display  # live: redrawn at each refresh
        assert dialog.focused is dialog.query_one("#no", Button)


async def test_the_picker_asked_for_while_being_built_names_the_strategy_of_now() -> None:
    rig = loaded_rig()
    app = BuildsNothingAhead(rig.backend, auto_refresh=False)
    names = list(STRATEGIES)
    async with app.run_test(size=SIZE) as pilot:
        picker = await built_but_not_mounted(app, "strategy-picker")
        assert isinstance(picker, StrategyPicker)
        other = next(n for n in names if n != rig.core.strategy.name)
        rig.core.set_strategy(other)
        app.perform("strategy")
        await pilot.pause()
        assert on_show(app, picker)
        title = str(picker.query_one("#strategy-title", Static).render())
        assert title == f"Routing strategy (now {other})"
        marked = [h for h in option_heads(picker) if h.startswith("▶") or "(current)" in h]
        assert marked == [f"▶ {other}  (current)"]


async def test_the_rollout_plan_shown_while_its_dialog_is_being_built_is_drawn() -> None:
    """Drawn once its widgets are mounted, not before: a draw at ``show`` in the window
    found no plan widget to draw into (NoMatches), and none at all left it blank."""
    rig = loaded_rig()
    app = BuildsNothingAhead(rig.backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await built_but_not_mounted(app, "rollout-confirm")
        assert isinstance(dialog, RolloutConfirm)
        dialog.show("v2", None, "no updater named", app.styles_now)
        await pilot.pause()
        title = str(dialog.query_one("#rollout-confirm-title", Static).render())
        assert title == "Roll out v2?"
        assert "no updater named" in str(dialog.query_one("#rollout-plan", Static).render())
