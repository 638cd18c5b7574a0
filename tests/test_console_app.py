"""The console driven by keys and by the command palette against a router with work in it.

Each control path must change the router (asserted on the core itself), leave an audit entry
with the console as actor, and show its result; a read-only console must refuse.
"""

from __future__ import annotations

import gc
import re
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static

from console.actions import BY_ID
from console.app import GC_THRESHOLDS, KEY_FIRST_MAX_S, KEY_FIRST_S, ConsoleApp
from console.messages import FilterClosed
from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen
from console.screens.replica_detail import ReplicaDetail
from console.screens.strategy_picker import StrategyPicker
from console.screens.value_input import ValueScreen
from console.view.format import pct, rate
from console.widgets.events_pane import EventsPane
from console.widgets.filter_input import FilterInput
from console.widgets.fleet_table import FleetTable
from router.replica import ReplicaState
from router.strategies import STRATEGIES, Explanation
from tests.console_helpers import (
    Rig,
    drawn_text,
    last_command,
    loaded_rig,
    telemetry_for,
    with_keys,
)
from tests.fleet_factory import make_fleet
from tests.tuner_changes import drive_a_tuner_change, tuning_fleet

SIZE = (100, 30)


def app_for(rig: Rig, **kwargs: object) -> ConsoleApp:
    return ConsoleApp(rig.backend, auto_refresh=False, **kwargs)  # type: ignore[arg-type]


def toasts(app: ConsoleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def confirm_text(app: ConsoleApp) -> str:
    screen = app.screen
    assert isinstance(screen, ConfirmScreen)
    body = "\n".join("".join(t for t, _ in line) for line in screen.lines)
    return f"{screen.title_text}\n{body}"


async def palette(pilot: Pilot[None], text: str) -> None:
    await pilot.press("ctrl+p")
    await pilot.pause()
    # Typed in one go: one search instead of one per character.
    pilot.app.screen.query_one(Input).value = text
    # The palette searches in a worker; wait for its hits before choosing the first.
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.1)
    await pilot.press("enter")
    await pilot.pause()


async def test_drain_by_key_confirms_with_the_impact_then_drains() -> None:
    rig = loaded_rig()
    in_flight = rig.core.replica("r0").in_flight
    assert in_flight > 0
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await pilot.pause()
        text = confirm_text(app)
        assert "Drain r0?" in text
        assert f"In flight: {in_flight} (" in text
        assert "goes to:" in text
        assert rig.core.replica("r0").state is ReplicaState.ACTIVE  # nothing before "yes"
        await pilot.press("y")
        await pilot.pause()
        assert rig.core.replica("r0").state is ReplicaState.DRAINING
        last, caused = rig.control.audit[-2], rig.control.audit[-1]
        assert (last.actor, last.kind, last.ok) == ("console", "drain", True)
        assert caused.message == "r0: active -> draining (by console)"
        assert any("r0: draining" in t for t in toasts(app))
        assert any("r0: draining" in line for line in app.query_one(EventsPane).lines_written)


async def test_a_real_tuner_change_appears_in_the_events_pane_as_it_happens() -> None:
    """At 80x24: the tuning round runs while the console is up, and its change is written to
    the events pane with the tuner as actor, the values and the signal."""
    rig = loaded_rig(tuning_fleet(make_fleet(batch_sizes=[4, 4, 2, 2])))
    app = app_for(rig)
    async with app.run_test(size=(80, 24)) as pilot:
        changes = drive_a_tuner_change(rig.core, rig.clock)
        await pilot.pause()
        written = app.query_one(EventsPane).lines_written
        for change in changes:
            assert any(line.endswith(f" ⇅ tuner: {change.message}") for line in written)
        assert [e.actor for e in rig.control.audit] == ["tuner"] * len(changes)


async def test_cancelled_confirmation_changes_nothing() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        for key in ("d", "p", "e"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n" if key != "e" else "escape")
            await pilot.pause()
        assert rig.core.replica("r0").state is ReplicaState.ACTIVE
        assert not [e for e in rig.control.audit if e.actor == "console"]


async def test_cursor_chooses_the_replica_and_undrain_returns_it() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "d")
        await pilot.pause()
        assert "Drain r1?" in confirm_text(app)
        await pilot.press("y", "u")
        await pilot.pause()
        assert rig.core.replica("r1").state is ReplicaState.ACTIVE
        kinds = [e.kind for e in rig.control.audit if e.actor == "console"]
        assert kinds == ["drain", "undrain"]


async def test_preempt_by_key_frees_the_replica() -> None:
    rig = loaded_rig(completed=0)
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        assert "Preempt r0?" in confirm_text(app)
        await pilot.press("y")
        await pilot.pause()
        r0 = rig.core.replica("r0")
        assert r0.state is not ReplicaState.ACTIVE
        assert all(req.priority.name == "HIGH" for req in r0.running.values())
        assert last_command(rig.control).kind == "preempt"


def _counts(text: str) -> tuple[int, int]:
    """(re-queued, failed) as a preempt dialog or the router's result says them."""
    said = re.search(r"preempted \d+ \((\d+) re-queued, (\d+) failed\)", text)
    if said:
        return int(said[1]), int(said[2])
    requeued = re.search(r"(\d+) not answered yet: re-queued", text)
    streaming = re.search(r"(\d+) already streaming", text)
    return (int(requeued[1]) if requeued else 0, int(streaming[1]) if streaming else 0)


async def test_the_preempt_dialog_counts_what_preempt_then_does() -> None:
    """The dialog follows the router while it is open: work that finished and work that was
    sent meanwhile are counted as preempt will count them; it says which priorities stop and
    that the replica stays drained; what the router then reports is what it said."""
    rig = loaded_rig(completed=0)
    app = app_for(rig)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("p")
        await pilot.pause()
        before = confirm_text(app)
        for a in [a for a in rig.core.running.values() if a.replica.id == "r0"]:
            rig.core.complete(a)  # the queue sends r0 new work that has not answered yet
        app.refresh_data()
        await pilot.pause()
        shown = confirm_text(app)
        await pilot.press("y")
        await pilot.pause()
    result = last_command(rig.control).message
    assert _counts(before) == (0, 2)
    assert _counts(shown) == (1, 0) == _counts(result)
    assert "3 high-priority keep running until done" in shown
    assert "stays drained" in shown
    assert rig.core.replica("r0").state is ReplicaState.DRAINING
    assert "normal and low" in BY_ID["preempt"].description
    assert "stays drained" in BY_ID["preempt"].description


async def test_eject_and_readmit_by_key() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e")
        await pilot.pause()
        assert "Eject r0?" in confirm_text(app)
        await pilot.press("y")
        await pilot.pause()
        assert rig.core.replica("r0").state is ReplicaState.EJECTED
        await pilot.press("r")
        await pilot.pause()
        assert rig.core.replica("r0").state is ReplicaState.ACTIVE


async def test_weight_and_batch_dialogs_set_and_release() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("w")
        await pilot.pause()
        assert isinstance(app.screen, ValueScreen)
        await pilot.press(*"3.5", "enter")
        await pilot.pause()
        r0 = rig.core.replica("r0")
        assert (r0.weight, r0.weight_pinned) == (3.5, True)
        await pilot.press("w", "enter")  # empty: release
        await pilot.pause()
        assert (r0.weight, r0.weight_pinned) == (2.0, False)
        await pilot.press("b", "8", "enter")
        await pilot.pause()
        assert (r0.batch_size, r0.batch_pinned) == (8, True)
        await pilot.press("b", *"zero", "enter")
        await pilot.pause()
        assert isinstance(app.screen, ValueScreen)  # refused in the dialog, still open
        await pilot.press("escape")
        await pilot.pause()
        assert r0.batch_size == 8
        assert [e.kind for e in rig.control.audit if e.actor == "console"] == [
            "weight",
            "weight",
            "batch",
        ]


async def test_strategy_picker_switches_strategy() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    names = list(STRATEGIES)
    target = names.index("round-robin")
    current = names.index(rig.core.strategy.name)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, StrategyPicker)
        step = "down" if target > current else "up"
        await pilot.press(*[step] * abs(target - current), "enter")
        await pilot.pause()
        assert rig.core.strategy.name == "round-robin"
        assert rig.control.audit[-1].message == "strategy is now round-robin"


async def test_palette_drives_drain_weight_and_strategy() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await palette(pilot, "Drain r2")
        assert "Drain r2?" in confirm_text(app)
        await pilot.press("y")
        await pilot.pause()
        assert rig.core.replica("r2").state is not ReplicaState.ACTIVE
        await palette(pilot, "Weight r3")
        assert isinstance(app.screen, ValueScreen)
        await pilot.press(*"1.5", "enter")
        await pilot.pause()
        assert rig.core.replica("r3").weight == 1.5
        await palette(pilot, "Strategy least-connections")
        assert rig.core.strategy.name == "least-connections"
        await palette(pilot, "Eject r1")
        await pilot.press("y")
        await pilot.pause()
        assert rig.core.replica("r1").state is ReplicaState.EJECTED
        await palette(pilot, "Readmit r1")
        assert rig.core.replica("r1").state is ReplicaState.ACTIVE


async def test_read_only_refuses_keys_palette_and_direct_calls() -> None:
    rig = loaded_rig()
    app = app_for(rig, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d", "p", "e", "w", "b", "s")
        await pilot.pause()
        assert app.screen is app.screen_stack[0]  # no dialog opened
        app.perform("drain", "r0")
        app.switch_strategy("round-robin")
        await pilot.pause()
        assert any("read-only console: drain refused" in t for t in toasts(app))
        assert rig.core.replica("r0").state is ReplicaState.ACTIVE
        assert rig.core.strategy.name == "weighted-least-connections"
        assert not [e for e in rig.control.audit if e.actor == "console"]
        # Greyed in the footer (check_action None), and absent from the palette.
        assert app.check_action("run_registered", ("drain",)) is None
        assert app.check_action("run_registered", ("help",)) is True
        await palette(pilot, "Drain r0")
        assert not isinstance(app.screen, ConfirmScreen)
        assert rig.core.replica("r0").state is ReplicaState.ACTIVE
        await pilot.press("escape")
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert app.screen.read_only


async def test_the_help_screen_is_built_once_and_again_after_a_theme_change() -> None:
    rig = loaded_rig()
    app = app_for(rig, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        first = app.screen
        assert isinstance(first, HelpScreen)
        first_tones = first.tones
        await pilot.press("escape", "question_mark")
        await pilot.pause()
        assert app.screen is first  # kept, not composed again
        await pilot.press("escape")
        app.set_theme("light")
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        again = app.screen
        assert isinstance(again, HelpScreen)
        assert again is not first
        # Drawn with the new theme's tones (refused actions are in its dim tone).
        assert again.tones is app.styles_now
        assert first_tones is not app.styles_now


async def test_acting_on_stale_data_warns_first() -> None:
    rig = loaded_rig()
    rig.backend.telemetry = lambda: telemetry_for(rig, stale=frozenset({"node-0"}))
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("w", *"4", "enter")
        await pilot.pause()
        text = confirm_text(app)
        assert "r0's data is stale" in text
        assert "anyway?" in text
        assert rig.core.replica("r0").weight == 2.0
        await pilot.press("y")
        await pilot.pause()
        assert rig.core.replica("r0").weight == 4.0


async def test_keys_are_rebindable_from_the_fleet_file() -> None:
    fleet = with_keys(make_fleet(batch_sizes=[4, 4, 2, 2]), {"drain": "x", "help": "f1"})
    rig = loaded_rig(fleet)
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("x")
        await pilot.pause()
        assert "Drain r0?" in confirm_text(app)
        await pilot.press("n", "f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


async def test_filter_sort_theme_and_refresh_controls() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        await pilot.press("slash", *"v100")
        await pilot.pause()
        assert [r.replica for r in table.rows_shown if not r.heading] == ["r2", "r3"]
        await pilot.press("escape")
        await pilot.pause()
        assert len([r for r in table.rows_shown if not r.heading]) == 4
        assert app.focused is table
        await pilot.press("o")
        assert app.sort_mode == "util"
        assert not any(r.heading for r in table.rows_shown)
        await pilot.press("t")
        assert app.theme == "light"
        await pilot.press("t")
        assert app.theme == "high-contrast"
        assert app.has_class("-high-contrast")
        await pilot.press("minus")
        assert app.refresh_s == 2.0
        await pilot.press("plus", "plus")
        assert app.refresh_s == 0.5
        paused = app.paused
        await pilot.press("space")
        assert app.paused is not paused


async def test_enter_keeps_the_filter_and_escape_clears_it_in_one_pass() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        table, box = app.query_one(FleetTable), app.query_one(FilterInput)
        await pilot.press("slash", *"v100", "enter")
        await pilot.pause()
        assert app.filter_text == "v100"
        assert app.focused is table
        assert not box.has_class("-shown")
        assert [r.replica for r in table.rows_shown if not r.heading] == ["r2", "r3"]

        await pilot.press("slash")
        await pilot.pause()
        # Escape's message is handled in one pass (no await here): cleared, closed, redrawn
        # and focus moved, nothing left for a later message, so nothing for a later frame.
        app.on_filter_closed(FilterClosed(clear=True))
        assert box.value == ""
        assert app.filter_text == ""
        assert app.focused is table
        assert not box.has_class("-shown")
        assert len([r for r in table.rows_shown if not r.heading]) == 4


async def test_refresh_redraws_only_changed_cells() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=(160, 30)) as pilot:  # wide enough for every column
        table = app.query_one(FleetTable)
        before = table.cell_updates
        app.refresh_data()
        await pilot.pause()
        assert table.cell_updates == before  # nothing changed, nothing written
        rig.core.set_batch_size("r3", 9)
        app.refresh_data()
        await pilot.pause()
        # r3's run/batch cell, its utilization (the router's estimate: in flight / batch) and
        # its load (the queued work the larger batch let the router send it).
        assert table.cell_updates - before == 3
        assert drawn_text(table, "node-0/3", "run") == f"{rig.core.replica('r3').in_flight}/9*"


async def test_detail_view_shows_decisions_and_history() -> None:
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_data(tick=True)
        await pilot.press("i")
        await pilot.pause()
        assert isinstance(app.screen, ReplicaDetail)
        assert app.screen.replica == "r0"
        data = app.screen.data()
        assert data.decisions
        assert all(d.chosen == "r0" for d in data.decisions)
        assert data.history is not None
        assert len(data.history.ttft_p50) == 2
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ReplicaDetail)


async def test_decisions_still_being_fetched_show_as_soon_as_they_come_not_at_the_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An attached console's backend answers None until its poll brings the decisions: the
    detail says it is fetching them, then shows them when they come, with no refresh."""
    rig = loaded_rig()
    app = app_for(rig)
    backend = type(rig.backend)
    fetched = backend.decisions
    arrived = False

    def decisions(self: Any, replica: str, limit: int = 20) -> list[Explanation] | None:
        return fetched(self, replica, limit) if arrived else None

    monkeypatch.setattr(backend, "decisions", decisions)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("i")
        await pilot.pause()
        lines = app.screen.query_one("#decision-lines", Static)
        assert str(lines.render()).startswith("Fetching the recent decisions")
        arrived = True
        for _ in range(50):  # bounded: the detail looks again every FETCH_CHECK_S
            await pilot.pause(0.1)
            if "Fetching" not in str(lines.render()):
                break
        shown = str(lines.render())
        assert "Fetching" not in shown
        assert "No recent decision" not in shown  # the decisions that chose r0


async def test_detail_view_shows_the_replicas_learned_capacity_block() -> None:
    """Learned req/s with its source, age and the load on it; the prior against the
    measurement; the KV cache with its source and age; the engine's preemptions."""
    rig = loaded_rig()
    app = app_for(rig)
    async with app.run_test(size=(100, 30)) as pilot:
        app.refresh_data(tick=True)
        await pilot.press("i")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReplicaDetail)
        block = screen.query_one("#capacity", Static)
        assert block.border_title == "Capacity"
        r0 = next(r for r in app.backend.snapshot().replicas if r.id == "r0")
        learned, versus, kv = str(block.render()).splitlines()
        assert learned.startswith(f"learned {rate(r0.capacity_rps)} req/s  from prior  refined ")
        assert learned.endswith(f"load {pct(r0.load)} of it")
        assert versus.startswith(f"prior {rate(r0.capacity_prior_rps)} req/s   measured ")
        assert kv == "KV cache unknown   engine preemptions —"  # no engine reading yet
        assert block.region.height == 5  # three lines in a border, all on screen


def test_no_color_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_COLOR turns Textual's colour filter on; states stay readable by word and symbol."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = app_for(loaded_rig())
    assert app.no_color
    assert any(type(f).__name__ in ("NoColor", "Monochrome") for f in app._filters)


def test_unknown_theme_is_a_config_error() -> None:
    from router.errors import ConfigError

    with pytest.raises(ConfigError, match=r"console.theme: no theme 'neon'"):
        app_for(loaded_rig(), theme="neon")


async def test_the_console_collects_garbage_young_and_puts_the_thresholds_back() -> None:
    before = gc.get_threshold()
    app = app_for(loaded_rig())
    async with app.run_test(size=SIZE):
        assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_threshold() == before


async def test_what_the_console_built_is_frozen_once_its_screens_are_ready_and_thawed_on_exit() -> (
    None
):
    frozen_before = gc.get_freeze_count()
    app = app_for(loaded_rig())
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(50):
            if app.is_screen_installed("replica-detail") and gc.get_freeze_count() > frozen_before:
                break
            await pilot.pause()
        assert gc.get_freeze_count() > frozen_before
    assert gc.get_freeze_count() == frozen_before


async def test_a_refresh_due_just_after_a_key_waits_for_the_keys_within_a_bound() -> None:
    now = [100.0]
    app = ConsoleApp(loaded_rig().backend, auto_refresh=False, clock=lambda: now[0])
    async with app.run_test(size=SIZE) as pilot:
        refreshed: list[float] = []
        original = app.refresh_data

        def counted(*, tick: bool = False) -> None:
            refreshed.append(now[0])
            original(tick=tick)

        app.refresh_data = counted  # type: ignore[method-assign]

        async def another_key(advance: float) -> None:
            """The clock ``advance`` on, a key, then the deferred refresh's timer."""
            now[0] += advance
            await pilot.press("down")
            await pilot.pause(KEY_FIRST_S * 1.5)

        app._tick()
        assert refreshed == [100.0]  # no key yet: at once
        await pilot.press("down")
        now[0] += KEY_FIRST_S / 3
        app._tick()
        assert refreshed == [100.0]  # the key's frames first
        assert [t.name for t in app._timers].count("console-deferred") == 1
        now[0] += KEY_FIRST_S
        await pilot.pause(KEY_FIRST_S * 1.5)
        assert refreshed == [100.0, 100.0 + KEY_FIRST_S * 4 / 3]  # then it came
        now[0] += KEY_FIRST_S
        app._tick()
        assert len(refreshed) == 3  # the key is long past: at once again
        due = now[0]
        await pilot.press("down")
        app._tick()
        for _ in range(3):
            await another_key(0.1)  # keys keep coming: it waits again
            assert len(refreshed) == 3
        await another_key(0.1)  # but not past the bound
        assert len(refreshed) == 4
        assert refreshed[3] - due <= KEY_FIRST_MAX_S
