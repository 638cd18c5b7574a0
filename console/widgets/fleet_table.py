"""The fleet table: one line per GPU (and per node heading), each drawn once per change.

A Line API widget (a Textual ``ScrollView``) that owns its rows, rather than a DataTable.
Rows are keyed by their view row's key (``node/index`` for a GPU, ``node:name`` for a node
heading). Each row's line (its cells cut to their columns and styled) is built when the row
first shows or its cells change, and reused on every frame after: a frame draws only the
lines Textual marked dirty, from that cache. So:

- a refresh rewrites only the rows whose cells changed, and repaints only those lines when the
  order holds (``cell_updates`` counts what the difference saves);
- a sort, a filter and its clearing reorder keys and repaint the visible lines from the cache;
- moving the cursor repaints two lines, and moving focus restyles lines without redrawing a
  cell.

DataTable (Textual 8) keyed its line cache on a table-wide update count and on focus, so every
refresh, focus change or filter keystroke redrew every visible cell through rich; at 512 GPUs
that was most of the time from a key to the screen.

The cursor follows the selected GPU (not the line): a row moving under a live sort never
turns a keypress onto another replica. Enter, or a click on the cursor's row, posts
:class:`FleetTable.Chosen`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip

from console.view.fleet import COLUMNS, TableRow
from console.view.format import Cell
from console.widgets.steady_scroll import SteadyScrollbars
from console.widgets.tones import Styles

PAD = 1
"""Blank cells either side of each column's text."""
WIDTH = sum(c.width + 2 * PAD for c in COLUMNS)
FIXED = COLUMNS[0].width + 2 * PAD
"""The replica column stays put when the table scrolls right: a row is read by its replica."""
HEADER_HEIGHT = 1


def draw_cells(cells: Iterable[tuple[str, Style | None]]) -> Strip:
    """Cells in column order as one line: each padded, and cut with an ellipsis where wider
    than its column. The padding carries no style, so the cursor's or the row's shows there."""
    segments: list[Segment] = []
    gap = " " * PAD
    for (text, style), column in zip(cells, COLUMNS, strict=True):
        width = cell_len(text)
        if width > column.width:
            text = set_cell_size(text, column.width - 1) + "…"
            width = column.width
        if text:
            segments += (Segment(gap), Segment(text, style))
            segments.append(Segment(" " * (column.width - width) + gap))
        else:
            segments.append(Segment(" " * (column.width + 2 * PAD)))
    return Strip(segments, WIDTH)


def over(line: Strip, style: Style) -> Strip:
    """``line`` under a highlight: the highlight's background and text style where the text
    has none, and its colour over the text's own (as DataTable draws its cursor)."""
    top = Style.from_color(color=style.color)
    return Strip(
        [
            Segment(s.text, style + s.style + top if s.style else style)
            for s in line
            if not s.control
        ],
        line.cell_length,
    )


@dataclass(slots=True)
class _Row:
    cells: tuple[Cell, ...]
    line: Strip | None = None
    """The drawn cells, without the widget's base style; None until first drawn."""


class FleetTable(SteadyScrollbars, can_focus=True):
    """The fleet: a header line, then the view's rows in the order given to :meth:`show`."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"fleet-table--header", "fleet-table--cursor"}

    DEFAULT_CSS = """
    FleetTable {
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .fleet-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .fleet-table--header {
                background-tint: $foreground 5%;
            }
        }
        & > .fleet-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .fleet-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "choose", "Details", show=False),
        Binding("up", "move(-1)", "Cursor up", show=False),
        Binding("down", "move(1)", "Cursor down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,ctrl+home", "move_to(0)", "First row", show=False),
        Binding("end,ctrl+end", "move_to(-1)", "Last row", show=False),
    ]

    header_height = HEADER_HEIGHT

    class Chosen(Message):
        """The operator chose the row under the cursor (Enter, or a click on it)."""

        def __init__(self, key: str, replica: str | None) -> None:
            super().__init__()
            self.key = key
            self.replica = replica

    def __init__(self) -> None:
        super().__init__(id="fleet")
        self._rows: dict[str, _Row] = {}
        """Every row shown so far, by key: a row back from a filter keeps its drawn line."""
        self._order: list[str] = []
        self._styles: Styles | None = None
        self._header_line: tuple[Style, Strip] | None = None
        self._cursor_line: tuple[Strip, Style, Strip] | None = None
        """(row line, cursor style, the two drawn together): the cursor's line, kept."""
        self.rows_shown: list[TableRow] = []
        self.cursor_row = 0
        self.selected_key: str | None = None
        self.cell_updates = 0
        """Cells written since start: what the difference saves is measured from this."""

    def on_mount(self) -> None:
        self.virtual_size = Size(WIDTH, HEADER_HEIGHT)

    # ---- data ------------------------------------------------------------------------------

    def show(self, rows: Sequence[TableRow], styles: Styles, force: bool = False) -> None:
        """Show ``rows`` in this order, redrawing only changed rows (all of them if ``force``)."""
        if force or styles is not self._styles:
            self._styles = styles
            for row in self._rows.values():
                row.line = None  # drawn with the old styles
        changed = [i for i, row in enumerate(rows) if self._store(row, force)]
        order = [row.key for row in rows]
        self.rows_shown = list(rows)
        if order != self._order:
            self._order = order
            self.virtual_size = Size(WIDTH, len(order) + HEADER_HEIGHT)
            self.refresh()
        elif force:
            self.refresh()
        else:
            top = round(self.scroll_y)
            bottom = top + self.scrollable_content_region.height
            for index in changed:
                if top <= index < bottom:
                    self.refresh_line(index + HEADER_HEIGHT)
        self._follow()

    def _store(self, row: TableRow, force: bool) -> bool:
        """Keep the row's cells; True when they differ from what was drawn."""
        held = self._rows.get(row.key)
        if held is None:
            self._rows[row.key] = _Row(row.cells)
            self.cell_updates += len(row.cells)
            return True
        if held.cells == row.cells and not force:
            return False
        self.cell_updates += sum(
            force or a != b for a, b in zip(held.cells, row.cells, strict=True)
        )
        held.cells, held.line = row.cells, None
        return True

    def _follow(self) -> None:
        """Keep the cursor on the selected row wherever it moved; start on the first GPU
        that runs a replica. A row filtered out keeps its selection for when it returns."""
        key = self.selected_key
        if key is None:
            key = next((r.key for r in self.rows_shown if r.replica is not None), None)
            if key is None:
                return
        try:
            index = self._order.index(key)
        except ValueError:
            self._place(min(self.cursor_row, max(0, len(self._order) - 1)))
            return
        self.selected_key = key
        self._place(index)

    # ---- cursor ----------------------------------------------------------------------------

    def select_row(self, index: int) -> None:
        """Put the cursor on row ``index`` (clamped) and select that row."""
        if not self._order:
            return
        index = max(0, min(index, len(self._order) - 1))
        self.selected_key = self._order[index]
        self._place(index)

    def _place(self, index: int) -> None:
        if index != self.cursor_row:
            self.refresh_line(self.cursor_row + HEADER_HEIGHT)
            self.refresh_line(index + HEADER_HEIGHT)
            self.cursor_row = index
        self._scroll_to_cursor()

    def _scroll_to_cursor(self) -> None:
        shown = self.scrollable_content_region.height - HEADER_HEIGHT
        if shown <= 0:
            return
        top = round(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + shown:
            self.scroll_to(y=self.cursor_row - shown + 1, animate=False)

    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - HEADER_HEIGHT - 1)

    def action_move(self, step: int) -> None:
        self.select_row(self.cursor_row + step)

    def action_page(self, direction: int) -> None:
        self.select_row(self.cursor_row + direction * self._page())

    def action_move_to(self, index: int) -> None:
        self.select_row(index if index >= 0 else len(self._order) - 1)

    def action_choose(self) -> None:
        if 0 <= self.cursor_row < len(self.rows_shown):
            row = self.rows_shown[self.cursor_row]
            self.post_message(self.Chosen(row.key, row.replica))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < HEADER_HEIGHT:
            return
        index = round(self.scroll_y) + offset.y - HEADER_HEIGHT
        if index >= len(self._order):
            return
        event.stop()
        if index == self.cursor_row:
            self.action_choose()  # as DataTable: a click on the cursor's row chooses it
        else:
            self.select_row(index)

    def selected_replica(self) -> str | None:
        """The replica of the row under the cursor (None on a node heading or a spare GPU)."""
        index = self.cursor_row
        if 0 <= index < len(self.rows_shown):
            return self.rows_shown[index].replica
        return None

    # ---- drawing ---------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width, base = self.size.width, self.rich_style
        # The header and the cursor's line run the whole width, past the last column.
        fill: Style | None = None
        if y < HEADER_HEIGHT:
            fill = self.get_component_rich_style("fleet-table--header")
            line = self._header(fill)
        else:
            index = scroll_y + y - HEADER_HEIGHT
            if index >= len(self._order):
                return Strip.blank(width, base)
            line = self._line(self._order[index])
            if index == self.cursor_row:
                fill = self.get_component_rich_style("fleet-table--cursor")
                line = self._under_cursor(line, fill)
        return _scrolled(line, scroll_x, width, fill).apply_style(base)

    def _header(self, style: Style) -> Strip:
        kept = self._header_line
        if kept is None or kept[0] != style:
            line = draw_cells((c.label, None) for c in COLUMNS).apply_style(style)
            kept = self._header_line = (style, line)
        return kept[1]

    def _line(self, key: str) -> Strip:
        row = self._rows[key]
        if row.line is None:
            styles = self._styles or {}
            row.line = draw_cells((text, styles.get(tone)) for text, tone in row.cells)
        return row.line

    def _under_cursor(self, line: Strip, style: Style) -> Strip:
        kept = self._cursor_line
        if kept is None or kept[0] is not line or kept[1] != style:
            kept = self._cursor_line = (line, style, over(line, style))
        return kept[2]


def _scrolled(line: Strip, scroll_x: int, width: int, fill: Style | None) -> Strip:
    """What shows of ``line`` scrolled ``scroll_x`` cells right in ``width`` cells: the fixed
    column, then the rest from ``scroll_x`` on."""
    end = scroll_x + width
    if end > line.cell_length:
        line = line.adjust_cell_length(end, fill)
    if not scroll_x or width <= FIXED:
        return line.crop(scroll_x, end)
    return Strip.join([line.crop(0, FIXED), line.crop(FIXED + scroll_x, end)])
