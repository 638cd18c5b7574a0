"""The console in an 80x24 terminal (a tmux pane over SSH): what must stay readable there.

These read the screen as drawn (every line the compositor puts on the terminal), so what is
asserted is what an operator sees, not what a widget was given.
"""

from __future__ import annotations

import io
from typing import cast

from rich.cells import cell_len
from rich.console import Console
from textual.widgets import OptionList
from textual.widgets._toast import Toast

from console.app import ConsoleApp
from console.screens.help import HelpScreen
from console.screens.strategy_picker import StrategyPicker
from console.view.events import BAND_HOLD_S, Watch, alerts, settle
from console.view.fleet import COLUMNS
from console.widgets.events_pane import EventsPane
from console.widgets.filter_input import FilterInput
from console.widgets.fleet_table import PAD, FleetTable
from router.control import SetWeight
from router.strategies import STRATEGIES
from tests.console_helpers import loaded_rig, telemetry_for

SMALL = (80, 24)
FRONT, ADMIN = "http://127.0.0.1:8000", "http://127.0.0.1:8001"


def small_app() -> ConsoleApp:
    rig = loaded_rig()
    status = telemetry_for(rig)
    rig.backend.telemetry = lambda: status
    rig.backend.front_url, rig.backend.admin_url = FRONT, ADMIN
    return ConsoleApp(rig.backend, auto_refresh=False)


def screen_lines(app: ConsoleApp) -> list[str]:
    """The terminal's lines as drawn now."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def screen_text(app: ConsoleApp) -> str:
    return "\n".join(screen_lines(app))


def plain(renderable: object) -> str:
    """A rich renderable as the text it prints, without colour."""
    console = Console(width=76, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return cast(io.StringIO, console.file).getvalue()


# ---- where to send requests ------------------------------------------------------------------


async def test_where_to_send_requests_stays_on_screen_and_is_in_the_help() -> None:
    """The front door and the admin API are on the dashboard itself, not only in the
    events pane (where they scroll away), and the help screen names them too."""
    app = small_app()
    async with app.run_test(size=SMALL) as pilot:
        for n in range(12):  # enough events to scroll the pane's first lines away
            app.backend.apply(SetWeight("r0", 1.0 + n))
        await pilot.pause()
        dashboard = screen_text(app)
        await pilot.press("question_mark")
        await pilot.pause()
        helped = screen_text(app)
    assert f"{FRONT}/v1" in dashboard
    assert ADMIN in dashboard
    assert f"{FRONT}/v1" in helped
    assert ADMIN in helped


# ---- events ----------------------------------------------------------------------------------


async def test_an_event_longer_than_the_pane_wraps_instead_of_being_cut() -> None:
    """Every word of an event reaches the screen; its further lines are indented."""
    app = small_app()
    async with app.run_test(size=SMALL) as pilot:
        app.backend.apply(SetWeight("r1", 2.5))
        await pilot.pause()
        pane = app.query_one(EventsPane)
        drawn = [line.text.rstrip() for line in pane.lines]
        width = pane.scrollable_content_region.width
    last = pane.lines_written[-1]
    assert last.endswith("console: r1: weight set to 2.5")
    start = next(i for i, line in enumerate(drawn) if line.startswith(last[:9]))
    tail = drawn[start + 1 :]
    assert " ".join([drawn[start], *(t.strip() for t in tail)]) == last
    assert tail
    assert all(t.startswith("  ") for t in tail)
    assert all(cell_len(line) <= width for line in drawn)


def test_imbalance_band_changes_are_debounced() -> None:
    """A band that flickers (excellent, good, excellent) raises no alert; one whose verdict
    changes (to action) raises one alert once it has held for BAND_HOLD_S, not before."""
    seen: list[tuple[float, str]] = []
    before = None
    bands = ["excellent", "good", "excellent", "good", "action", "good"]
    bands += ["action"] * int(BAND_HOLD_S + 3)
    for t, band in enumerate(bands):
        now = settle(before, Watch("connected", frozenset(), frozenset(), band, False, at=t))
        seen += [(t, text) for text, _ in alerts(before, now)]
        before = now
    assert seen == [(6 + BAND_HOLD_S, "imbalance excellent → action")]


# ---- help ------------------------------------------------------------------------------------


async def test_help_fits_80x24_with_every_key_and_how_to_close_it() -> None:
    """Every action's key, the legend and how to close it are on screen at once (faster and
    slower on one line, ``+/-``, as the docs' table has them); a wrapped description
    continues under the description, not at column 0."""
    app = small_app()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        lines = screen_lines(app)
    text = "\n".join(lines)
    for title in ("Quit", "Refresh", "Pause", "Theme", "Sort", "Roll", "Split"):
        assert any(title in line for line in lines), title
    assert any(line.strip(" █▌▐").startswith("q ") for line in lines)
    assert any(line.strip(" █▌▐").startswith("+/- ") for line in lines)
    assert any(line.strip(" █▌▐").startswith("g ") for line in lines)
    assert "Esc or ? closes" in text
    assert "States:" in text


async def test_read_only_help_fits_80x24_too() -> None:
    app = small_app()
    app.read_only = True
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        text = screen_text(app)
    assert "Quit" in text
    assert "Esc or ? closes" in text
    assert "States:" in text


# ---- header ----------------------------------------------------------------------------------


async def test_pause_and_refresh_changes_show_in_the_header_at_80_columns() -> None:
    app = small_app()
    async with app.run_test(size=SMALL) as pilot:
        header = "\n".join(screen_lines(app)[:3])
        await pilot.press("space")
        await pilot.pause()
        paused = "\n".join(screen_lines(app)[:3])
        await pilot.press("space", "plus")
        await pilot.pause()
        faster = "\n".join(screen_lines(app)[:3])
    assert "↻ 1s" in header
    assert "‖ paused" in paused
    assert "↻ 0.5s" in faster


# ---- fleet table -----------------------------------------------------------------------------


async def test_the_replica_column_stays_when_the_table_scrolls_right() -> None:
    app = small_app()
    async with app.run_test(size=SMALL) as pilot:
        table = app.query_one(FleetTable)
        first = table.render_line(table.header_height + 1).text
        await pilot.press("right", "right", "right", "right")
        await pilot.pause()
        assert table.scroll_offset.x > 0
        header = table.render_line(0).text
        scrolled = table.render_line(table.header_height + 1).text
    width = COLUMNS[0].width + 2 * PAD
    assert scrolled[:width] == first[:width]
    assert "r0" in scrolled[:width]
    assert header.startswith(" Replica")
    assert scrolled[width:] != first[width:]


# ---- toasts ----------------------------------------------------------------------------------


async def test_toasts_do_not_cover_the_open_filter_box() -> None:
    app = small_app()
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        app.notify("something happened", title="done")
        await pilot.press("slash")
        await pilot.pause()
        box = app.query_one(FilterInput).region
        toasts = [t.region for t in app.screen.query(Toast)]
    assert toasts
    assert all(not t.overlaps(box) for t in toasts)


# ---- strategy picker -------------------------------------------------------------------------


async def test_the_strategy_picker_marks_cursor_and_current_in_text() -> None:
    """Without colour: the cursor's option starts with ▶ and the current strategy says so;
    moving the cursor moves the mark."""
    app = small_app()
    current = app.backend.snapshot().strategy
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, StrategyPicker)
        picker = app.screen.query_one(OptionList)
        prompts = [plain(picker.get_option_at_index(i).prompt) for i in range(len(STRATEGIES))]
        await pilot.press("up")
        await pilot.pause()
        moved = [plain(picker.get_option_at_index(i).prompt) for i in range(len(STRATEGIES))]
    names = list(STRATEGIES)
    at = names.index(current)
    assert prompts[at].startswith(f"▶ {current}")
    assert "(current)" in prompts[at]
    assert sum(p.startswith("▶") for p in prompts) == 1
    assert sum("(current)" in p for p in prompts) == 1
    assert moved[at - 1].startswith(f"▶ {names[at - 1]}")
    assert moved[at].startswith(f"  {current}")
    assert "(current)" in moved[at]
