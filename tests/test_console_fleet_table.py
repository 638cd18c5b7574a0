"""The fleet table as drawn: after a sort, a filter or an update, the lines the table draws
(their order, node headings and cell text) are exactly the view's rows, and the cursor stays
on the GPU the operator chose.

The table keeps each row's drawn line and reuses it until the row changes, so these tests
read the lines it draws (``render_line``), not its list of rows.
"""

from __future__ import annotations

from typing import cast

import pytest
from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style

from console.app import ConsoleApp
from console.backend import ConsoleBackend, GpuKey
from console.screens.replica_detail import ReplicaDetail
from console.view.fleet import COLUMNS
from console.view.format import Tone
from console.widgets import fleet_table
from console.widgets.fleet_table import FleetTable, draw_cells
from console.widgets.tones import styles_for, to_text
from router import ControlSurface, ManualClock, RouterCore
from router.config.schema import FleetConfig, GpuConfig, NodeConfig, ReplicaConfig
from router.telemetry.schema import GpuSample
from router.telemetry.status import BrokerState, NodeFeed, TelemetryStatus
from tests.console_helpers import WALL, column_span, drawn_cell, drawn_keys, drawn_lines, drawn_text
from themes import THEMES

SIZE = (160, 30)
"""Wide enough for every column: the tests read the node column."""
REPLICA, UTIL = "replica", "util"
GROUPED = [
    "node:node-a",
    "node-a/0",
    "node-a/1",
    "node-a/2",
    "node:node-b",
    "node-b/0",
    "node-b/1",
    "node:node-c",
    "node-c/0",
]


def small_fleet() -> FleetConfig:
    """node-a: a tensor-parallel replica on GPUs 0-1 and a spare GPU 2; node-b: two
    replicas; node-c: one."""

    def rep(rid: str, node: str, gpus: tuple[int, ...], port: int) -> ReplicaConfig:
        return ReplicaConfig(rid, node, f"http://127.0.0.1:{port}", "m", gpus, "L4")

    def gpus(n: int) -> tuple[GpuConfig, ...]:
        return tuple(GpuConfig(i, "L4", 24.0) for i in range(n))

    return FleetConfig(
        nodes=(
            NodeConfig("node-a", gpus(3), (rep("a-tp", "node-a", (0, 1), 18000),)),
            NodeConfig(
                "node-b",
                gpus(2),
                (rep("b0", "node-b", (0,), 18001), rep("b1", "node-b", (1,), 18002)),
            ),
            NodeConfig("node-c", gpus(1), (rep("c0", "node-c", (0,), 18003),)),
        )
    )


class Feed:
    """Fresh readings of every GPU; ``util`` is what a test changes between refreshes."""

    def __init__(self, fleet: FleetConfig) -> None:
        self.fleet = fleet
        self.util: dict[GpuKey, float] = {
            ("node-a", 0): 10,
            ("node-a", 1): 90,
            ("node-a", 2): 50,
            ("node-b", 0): 70,
            ("node-b", 1): 30,
            ("node-c", 0): 60,
        }

    def status(self) -> TelemetryStatus:
        feeds = tuple(NodeFeed(n.name, True, 0.4, False, 1, 0, 10, 0, 0) for n in self.fleet.nodes)
        return TelemetryStatus(BrokerState.CONNECTED, "mqtt://127.0.0.1:1883", feeds)

    def samples(self) -> dict[GpuKey, GpuSample]:
        return {key: GpuSample(index=key[1], gpu_util_pct=u) for key, u in self.util.items()}


def console() -> tuple[ConsoleApp, Feed]:
    fleet = small_fleet()
    core = RouterCore(fleet, clock=ManualClock(1000.0))
    feed = Feed(fleet)
    backend = ConsoleBackend(
        core,
        ControlSurface(core, wall_clock=lambda: WALL),
        telemetry=feed.status,
        gpu_samples=feed.samples,
    )
    return ConsoleApp(backend, auto_refresh=False), feed


def assert_drawn_as_view(table: FleetTable) -> None:
    """Every line the table draws holds the view row of the same position, cell for cell."""
    assert drawn_keys(table) == [r.key for r in table.rows_shown]
    for line, row in zip(drawn_lines(table), table.rows_shown, strict=True):
        assert [drawn_cell(line, c.id) for c in COLUMNS] == [text.rstrip() for text, _ in row.cells]


async def test_sort_moves_rows_drops_headings_and_updates_keep_order() -> None:
    """Sorted by utilization: GPUs busiest first, no node headings, a tensor-parallel
    replica named on each of its GPUs; an update re-sorts with the new readings; back to the
    node order, the headings return above their GPUs. The cursor stays on its GPU throughout."""
    app, feed = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        assert drawn_keys(table) == GROUPED
        assert drawn_text(table, "node-a/1", REPLICA) == "  ┆"
        assert app.select_replica("b0")
        await pilot.press("o")
        await pilot.pause()
        assert app.sort_mode == "util"
        assert drawn_keys(table) == [
            "node-a/1",
            "node-b/0",
            "node-c/0",
            "node-a/2",
            "node-b/1",
            "node-a/0",
        ]
        assert drawn_text(table, "node-a/1", REPLICA).strip() == "a-tp"
        assert_drawn_as_view(table)
        assert (table.cursor_row, table.selected_replica()) == (1, "b0")

        feed.util[("node-b", 1)] = 95
        feed.util[("node-a", 1)] = 20
        app.refresh_data()
        await pilot.pause()
        assert drawn_keys(table) == [
            "node-b/1",
            "node-b/0",
            "node-c/0",
            "node-a/2",
            "node-a/1",
            "node-a/0",
        ]
        assert "95%" in drawn_text(table, "node-b/1", UTIL)
        assert "20%" in drawn_text(table, "node-a/1", UTIL)
        assert_drawn_as_view(table)
        assert (table.cursor_row, table.selected_replica()) == (1, "b0")

        while app.sort_mode != "node":
            await pilot.press("o")
        await pilot.pause()
        assert drawn_keys(table) == GROUPED
        assert drawn_text(table, "node:node-b", REPLICA).strip() == "▾ node-b"
        assert drawn_text(table, "node-a/1", REPLICA) == "  ┆"
        assert_drawn_as_view(table)
        assert (table.cursor_row, table.selected_replica()) == (GROUPED.index("node-b/0"), "b0")


async def test_filter_removes_and_returns_rows_with_current_values() -> None:
    """A filter leaves only its rows (and a table as short as they are); a reading that
    changed while a row was filtered out is shown when the filter is cleared."""
    app, feed = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        assert app.select_replica("b1")
        await pilot.press("slash", *"node-b")
        await pilot.pause()
        assert drawn_keys(table) == ["node:node-b", "node-b/0", "node-b/1"]
        assert_drawn_as_view(table)
        assert table.virtual_size.height == table.header_height + 3
        assert table.selected_replica() == "b1"

        feed.util[("node-a", 1)] = 40
        feed.util[("node-b", 0)] = 80
        app.refresh_data()
        await pilot.pause()
        assert "80%" in drawn_text(table, "node-b/0", UTIL)
        await pilot.press("escape")
        await pilot.pause()
        assert drawn_keys(table) == GROUPED
        assert "40%" in drawn_text(table, "node-a/1", UTIL)
        assert_drawn_as_view(table)
        assert table.virtual_size.height == table.header_height + len(GROUPED)
        assert table.selected_replica() == "b1"
        await pilot.press("down")
        assert table.selected_key == "node:node-c"


async def test_rows_back_from_a_filter_take_the_new_theme() -> None:
    """Rows taken out before a theme change come back in the new theme's colours."""
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        await pilot.press("slash", *"node-b")
        await pilot.pause()
        assert "node:node-a" not in drawn_keys(table)
        before = app.styles_now[Tone.ACCENT]
        app.set_theme("light")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        after = app.styles_now[Tone.ACCENT]
        assert after.color != before.color
        line = table.render_line(table.header_height + drawn_keys(table).index("node:node-a"))
        heading = next(s for s in line if s.text.startswith("▾ node-a"))
        assert heading.style is not None
        assert heading.style.color == after.color


@pytest.mark.parametrize(
    "plain",
    [
        "",
        "a-tp",
        "0123456789",
        "01234567890",
        "0123456789012",
        "node-b-very-long-name",
        "▾ 節点-b",
        "節点節点節点",
        "—",
    ],
)
@pytest.mark.parametrize("tone", [Tone.NORMAL, Tone.DIM, Tone.WARN])
def test_a_line_draws_as_rich_draws_the_same_cells(plain: str, tone: Tone) -> None:
    """Each cell of a line draws the same segments as rich draws ``to_text`` padded to its
    column (7 to 15 cells wide here), cut with an ellipsis where it is wider."""
    styles = styles_for(THEMES["dark"])
    console = Console(width=200, legacy_windows=False, color_system="truecolor")

    def simplified(segments: list[Segment]) -> list[tuple[str, Style]]:
        """What the terminal shows: text and style, no style being the plain style."""
        return [
            (s.text, s.style or Style())
            for s in Segment.simplify(Segment(s.text, s.style or Style()) for s in segments)
            if s.text
        ]

    expected: list[Segment] = []
    for column in COLUMNS:
        options = console.options.update(width=column.width + 2, height=1, no_wrap=True)
        padded = Padding(cast(RenderableType, to_text([(plain, tone)], styles)), (0, 1))
        expected += console.render_lines(padded, options)[0]
    line = draw_cells((plain, styles[tone]) for _ in COLUMNS)
    assert simplified(list(line)) == simplified(expected)
    assert line.cell_length == sum(c.width + 2 for c in COLUMNS)


async def test_the_cursor_line_is_highlighted_across_the_table_and_dims_without_focus() -> None:
    """The cursor's line takes the cursor's background over its whole width, the text's own
    colour giving way to the cursor's; off focus (the filter box open) the cursor dims."""
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        assert app.select_replica("b1")
        await pilot.pause()
        y = table.header_height + drawn_keys(table).index("node-b/1")
        focused = table.get_component_rich_style("fleet-table--cursor")
        line = table.render_line(y)
        assert line.cell_length == table.size.width
        assert {s.style.bgcolor for s in line if s.style} == {focused.bgcolor}
        state = next(s for s in line if "●" in s.text)  # drawn green off the cursor
        assert state.style is not None
        assert state.style.color == focused.color
        other = table.render_line(y + 1)
        assert focused.bgcolor not in {s.style.bgcolor for s in other if s.style}

        await pilot.press("slash")
        await pilot.pause()
        blurred = table.get_component_rich_style("fleet-table--cursor")
        assert blurred.bgcolor != focused.bgcolor
        assert {s.style.bgcolor for s in table.render_line(y) if s.style} == {blurred.bgcolor}


async def test_focus_and_cursor_moves_redraw_no_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moving focus or the cursor restyles drawn lines: no row's cells are drawn again (the
    header's may be, as focus tints it)."""
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        drawn: list[str] = []
        draw = fleet_table.draw_cells

        def counted(cells: object) -> object:
            line = draw(cells)  # type: ignore[arg-type]
            drawn.append(line.text)
            return line

        monkeypatch.setattr(fleet_table, "draw_cells", counted)
        await pilot.press("down", "down", "slash")
        await pilot.pause()
        await pilot.press("escape", "up")
        await pilot.pause()
        header = column_span("replica")
        assert all(text[header[0] : header[1]].rstrip() == "Replica" for text in drawn)


async def test_a_click_on_a_row_selects_its_replica() -> None:
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        line = GROUPED.index("node-b/1")
        top = table.styles.gutter.top  # its border
        await pilot.click(FleetTable, offset=(3, top + table.header_height + line))
        await pilot.pause()
        assert table.selected_replica() == "b1"


async def test_keys_move_the_cursor_and_scroll_the_columns() -> None:
    """End and Home reach the last and first rows, PgDn and PgUp a page, → scrolls the
    columns that do not fit at 80 columns; the selection follows the cursor."""
    app, _ = console()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(FleetTable)
        await pilot.press("end")
        assert (table.cursor_row, table.selected_key) == (len(GROUPED) - 1, GROUPED[-1])
        await pilot.press("home")
        assert (table.cursor_row, table.selected_key) == (0, GROUPED[0])
        await pilot.press("pagedown")
        assert table.cursor_row > 1
        await pilot.press("pageup")
        assert table.cursor_row == 0
        await pilot.press("right")
        await pilot.pause()
        assert table.scroll_offset.x > 0


async def test_a_second_click_on_the_cursor_row_opens_its_detail() -> None:
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        line = GROUPED.index("node-c/0")
        offset = (3, table.styles.gutter.top + table.header_height + line)
        await pilot.click(FleetTable, offset=offset)
        await pilot.pause()
        assert table.selected_replica() == "c0"
        assert not isinstance(app.screen, ReplicaDetail)
        await pilot.click(FleetTable, offset=offset)
        await pilot.pause()
        assert isinstance(app.screen, ReplicaDetail)


async def test_scrollbars_follow_the_rows_through_a_filter() -> None:
    """Scrollbars are updated only when the scrolling changes (not on every layout), so
    they must still follow the rows: in a short terminal the 9 rows overflow and the
    scrollbar shows them all; filtered to 3 it goes; cleared, it comes back."""
    app, _ = console()
    async with app.run_test(size=(160, 20)) as pilot:  # 7 lines: a header and 6 rows
        table = app.query_one(FleetTable)
        await pilot.pause()
        assert table.show_vertical_scrollbar
        assert table.vertical_scrollbar.window_virtual_size == len(GROUPED) + 1
        await pilot.press("slash", *"node-b")
        await pilot.pause()
        assert not table.show_vertical_scrollbar
        await pilot.press("escape")
        await pilot.pause()
        assert table.show_vertical_scrollbar
        assert table.vertical_scrollbar.window_virtual_size == len(GROUPED) + 1
