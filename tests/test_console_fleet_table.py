"""The fleet table as drawn: after a sort, a filter or an update, the DataTable's own rows
(their order, node headings and cell text) are exactly the view's rows, and the cursor stays
on the GPU the operator chose.

The table keys rows by GPU and moves them with DataTable's ``sort`` instead of rewriting
slots, so these tests read what the DataTable holds, line by line, not the widget's list.
"""

from __future__ import annotations

from itertools import product
from typing import cast

import pytest
from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from textual.widgets import DataTable

from console.app import ConsoleApp
from console.backend import ConsoleBackend, GpuKey
from console.view.fleet import COLUMNS
from console.view.format import Tone
from console.widgets.fleet_table import CellText, FleetTable
from console.widgets.tones import styles_for, to_text
from router import ControlSurface, ManualClock, RouterCore
from router.config.schema import FleetConfig, GpuConfig, NodeConfig, ReplicaConfig
from router.telemetry.schema import GpuSample
from router.telemetry.status import BrokerState, NodeFeed, TelemetryStatus
from tests.console_helpers import WALL
from themes import THEMES

SIZE = (120, 30)
REPLICA, UTIL = (next(i for i, c in enumerate(COLUMNS) if c.id == n) for n in ("replica", "util"))
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


def drawn_keys(table: FleetTable) -> list[str]:
    """Row keys in the order the DataTable draws them."""
    return [str(row.key.value) for row in table.ordered_rows]


def drawn_text(table: FleetTable, key: str, column: int) -> str:
    return str(table.get_row(key)[column])


def assert_drawn_as_view(table: FleetTable) -> None:
    """Every line of the DataTable holds the view row of the same position, cell for cell."""
    assert drawn_keys(table) == [r.key for r in table.rows_shown]
    for row in table.rows_shown:
        assert [drawn_text(table, row.key, i) for i in range(len(COLUMNS))] == [
            text for text, _ in row.cells
        ]
    assert table.row_count == len(table.rows_shown)


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
        assert after != before
        heading = table.get_row("node:node-a")[REPLICA]
        assert isinstance(heading, CellText)
        assert heading.style == after


@pytest.mark.parametrize(
    "plain",
    [
        "",
        "a-tp",
        "0123456789",
        "01234567890",
        "node-b-very-long-name",
        "▾ 節点-b",
        "節点節点節点",
        "—",
    ],
)
@pytest.mark.parametrize("tone", [Tone.NORMAL, Tone.DIM, Tone.WARN])
def test_cell_draws_as_the_equivalent_rich_text(plain: str, tone: Tone) -> None:
    """A table cell draws the same segments as ``to_text`` does, cut with an ellipsis where
    it is wider than its column."""
    styles = styles_for(THEMES["dark"])
    console = Console(width=40, legacy_windows=False, color_system="truecolor")
    options = console.options.update(width=12, height=1, no_wrap=True)

    def drawn(renderable: object) -> list[list[Segment]]:
        """What the terminal shows: text and style, no style being the plain style."""
        padded = Padding(cast(RenderableType, renderable), (0, 1))
        return [
            list(Segment.simplify(Segment(s.text, s.style or Style()) for s in line if s.text))
            for line in console.render_lines(padded, options)
        ]

    assert drawn(CellText(plain, styles[tone])) == drawn(to_text([(plain, tone)], styles))


def _simplified(lines: list[list[Segment]]) -> list[list[tuple[str, Style | None]]]:
    return [[(s.text, s.style) for s in Segment.simplify(line) if s.text] for line in lines]


async def test_cells_draw_as_the_data_table_itself_draws_them() -> None:
    """The table's own cell drawing gives DataTable's segments, styles and mouse metadata
    included, under the cursor and the hover, in columns wide and narrow, in two themes."""
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        table.update_cell("node-b/0", "replica", CellText("節点-b-very-long-name", Style()))
        for theme in ("dark", "light"):
            app.set_theme(theme)
            await pilot.pause()
            base = table.get_component_styles("datatable--odd-row").rich_style
            cells = product(
                range(table.row_count),
                range(len(table.columns)),
                (1, 2, 3, 6, 14),
                ((False, False), (True, False), (False, True)),
            )
            for row, column, width, (cursor, hover) in cells:
                args = (row, column, base, width, cursor, hover)
                ours = table._render_cell(*args)
                table._cell_render_cache.clear()  # its key leaves out the width
                theirs = DataTable._render_cell(table, *args)
                assert _simplified(ours) == _simplified(theirs), args


async def test_a_click_on_a_row_selects_its_replica() -> None:
    app, _ = console()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        line = GROUPED.index("node-b/1")
        top = table.styles.gutter.top  # its border
        await pilot.click(FleetTable, offset=(3, top + table.header_height + line))
        await pilot.pause()
        assert table.selected_replica() == "b1"
