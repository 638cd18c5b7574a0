"""The fleet table: a DataTable keyed by GPU (and node heading), written by difference.

Each row's key is its view row's key (``node/index`` for a GPU, ``node:name`` for a node
heading), so a row keeps its cells wherever it is shown. A refresh writes only the cells
whose (text, tone) changed; rows that leave the view (filtered out, or the node headings when
the sort stops grouping by node) are removed and rows that come back are added. When the
order differs from the one shown, DataTable's own ``sort`` moves the rows without rewriting a
cell: re-sorting 512 GPUs is one sort, not thousands of cell writes. The cursor follows the
selected GPU (not the line), so a row moving under a live sort never turns a keypress onto
another replica. Cells are :class:`CellText`, one line of one style, and the table draws
them straight into segments, as DataTable would through rich (``Styled(Padding(Text))``) at
a fraction of the cost: a repaint of the visible rows is most of what a sort costs. A refresh
writes changed cells into the table's data and invalidates its caches once, where
``update_cell`` would for each cell. Both lean on DataTable internals of Textual 8 (pinned
to that major in pyproject.toml); the snapshot tests catch a drawing that differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, Row, RowKey

from console.view.fleet import COLUMNS, TableRow
from console.view.format import Cell
from console.widgets.tones import Styles

_FIRST = COLUMNS[0].id
_COLUMN_KEYS = tuple(ColumnKey(c.id) for c in COLUMNS)


class CellText:
    """One cell's text in one style: drawn as ``Text(no_wrap=True, overflow="ellipsis")``
    draws it, without Text's wrapping and justifying, which most of a repaint went on."""

    __slots__ = ("plain", "style")

    def __init__(self, plain: str, style: Style) -> None:
        self.plain = plain
        self.style = style

    def __str__(self) -> str:
        return self.plain

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text, width = self.plain, options.max_width
        if cell_len(text) > width:
            text = set_cell_size(text, width - 1) + "…"
        if text:
            yield Segment(text, self.style)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        width = cell_len(self.plain)
        return Measurement(width, width)


def _cell(cell: Cell, styles: Styles) -> CellText:
    return CellText(cell[0], styles[cell[1]])


@dataclass(slots=True)
class _Drawn:
    """A row as the table holds it: its cells and the cell objects drawn from them."""

    cells: tuple[Cell, ...]
    texts: list[CellText]


class FleetTable(DataTable[object]):
    def __init__(self) -> None:
        super().__init__(id="fleet", cursor_type="row", zebra_stripes=False)
        self._drawn: dict[str, _Drawn] = {}
        """Row key -> what the table holds for it, in the order shown."""
        self._parked: dict[str, _Drawn] = {}
        """Rows taken out (filtered, or headings while not grouped), kept to come back cheaply."""
        self.rows_shown: list[TableRow] = []
        self.selected_key: str | None = None
        self.cell_updates = 0
        """Cells written since start: what the difference saves is measured from this."""

    def on_mount(self) -> None:
        for c in COLUMNS:
            self.add_column(c.label, width=c.width, key=c.id)

    def show(self, rows: Sequence[TableRow], styles: Styles, force: bool = False) -> None:
        """Show ``rows`` in this order, writing only changed cells (all of them if ``force``)."""
        keep = self.selected_key
        if force:
            self._parked.clear()  # drawn with the old styles
        wanted = {row.key for row in rows}
        gone = [key for key in self._drawn if key not in wanted]
        if gone:
            self._remove_rows(gone)
        new: list[TableRow] = []
        written = False
        for row in rows:
            drawn = self._drawn.get(row.key)
            if drawn is None:
                new.append(row)
            elif drawn.cells != row.cells or force:
                written = self._update(row, drawn, styles, force) or written
        if new:
            self._add_rows(new, styles)
        if written:
            # One invalidation for the whole refresh: update_cell does one per cell (a cache
            # generation and a dirty region each), which was most of a refresh at 512 GPUs.
            self._update_count += 1
            self.refresh()
        # Removals kept the order of the rest and additions went to the bottom: the dict's
        # order is the order on screen.
        order = [row.key for row in rows]
        if list(self._drawn) != order:
            self._reorder(order)
        self.rows_shown = list(rows)
        self._follow(keep)

    def _add_rows(self, rows: list[TableRow], styles: Styles) -> None:
        """Add many rows at the bottom at once.

        What ``add_row`` does (Textual 8) for each row, except that the cursor is clamped,
        the caches invalidated and the idle work asked for once, not once per row; and the
        new rows are not queued for measuring: every column has a fixed width and every row
        one line, so DataTable's measuring of new cells when idle would change nothing (at
        512 rows it cost more than the rest of a refresh).
        """
        was_empty = self.row_count == 0
        for row in rows:
            texts = self._texts(row, styles)
            key = RowKey(row.key)
            self._row_locations[key] = self.row_count
            self._data[key] = dict(zip(_COLUMN_KEYS, texts, strict=True))
            self.rows[key] = Row(key, 1)
            self._drawn[row.key] = _Drawn(row.cells, texts)
            self.cell_updates += len(texts)
        self._require_update_dimensions = True
        self.cursor_coordinate = self.cursor_coordinate
        if was_empty and self.show_cursor and self.cursor_type != "none":
            self._highlight_cursor()
        self._update_count += 1
        self.check_idle()

    def _texts(self, row: TableRow, styles: Styles) -> list[CellText]:
        parked = self._parked.pop(row.key, None)
        if parked is None:
            return [_cell(c, styles) for c in row.cells]
        # Back from a filter or a sort: only its changed cells are drawn anew.
        return [
            text if before == after else _cell(after, styles)
            for before, after, text in zip(parked.cells, row.cells, parked.texts, strict=True)
        ]

    def _update(self, row: TableRow, drawn: _Drawn, styles: Styles, force: bool) -> bool:
        """Write the row's changed cells where ``update_cell`` would (Textual 8's ``_data``),
        without its per-cell invalidation: ``show`` invalidates once when all are written.
        True when a cell was written."""
        data = self._data[RowKey(row.key)]
        written = False
        for cid, (before, after) in enumerate(zip(drawn.cells, row.cells, strict=True)):
            if before != after or force:
                text = _cell(after, styles)
                data[_COLUMN_KEYS[cid]] = text
                drawn.texts[cid] = text
                self.cell_updates += 1
                written = True
        drawn.cells = row.cells
        return written

    def _remove_rows(self, keys: list[str]) -> None:
        """Remove many rows at once: O(rows), where ``remove_row`` is O(rows) for each row.

        What ``remove_row`` does (Textual 8), except that the rows' locations are rebuilt
        once, by ``sort``, instead of once per removed row.
        """
        for key in keys:
            self._parked[key] = self._drawn.pop(key)
            del self.rows[RowKey(key)]
            del self._data[RowKey(key)]
        self._reorder(list(self._drawn))
        self._require_update_dimensions = True  # shorter: a new virtual size when idle
        self.cursor_coordinate = self.cursor_coordinate  # clamped into the table
        self.hover_coordinate = self.hover_coordinate
        self.refresh(layout=True)
        self.check_idle()

    def _reorder(self, order: list[str]) -> None:
        """Move the rows into ``order`` with DataTable's sort: no cell is rewritten."""
        # The sort is handed cell values only; each row's first-column cell is its own object.
        rank = {id(self._drawn[key].texts[0]): i for i, key in enumerate(order)}
        self.sort(_FIRST, key=lambda first: rank[id(first)])
        self._drawn = {key: self._drawn[key] for key in order}

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        """A body cell's one line, as DataTable (Textual 8) draws it through rich's
        ``Styled(Padding(cell))``, built directly: that pipeline was most of a repaint."""
        pad = self.cell_padding
        if row_index < 0 or column_index < 0 or width <= 2 * pad:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        cell = None
        if row_key is not None and column_key is not None and self.rows[row_key].height == 1:
            cell = self._data[row_key].get(column_key)
        if not isinstance(cell, CellText):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        component, post = self._get_styles_to_render_cell(
            False,
            False,
            row_index < self.fixed_rows or column_index < self.fixed_columns,
            hover,
            cursor,
            self.show_cursor,
            self._show_hover_cursor,
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        pre = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component
        blank = pre + post
        inner = width - 2 * pad
        text = cell.plain
        if cell_len(text) > inner:
            text = set_cell_size(text, inner - 1) + "…"
        line = [Segment(" " * pad, blank)]
        if text:
            line.append(Segment(text, pre + cell.style + post))
        if (fill := inner - cell_len(text)) > 0:
            line.append(Segment(" " * fill, blank))
        line.append(Segment(" " * pad, blank))
        return [line]

    def _follow(self, key: str | None) -> None:
        if key is None:
            # Nothing chosen yet: start on the first GPU that runs a replica.
            key = next((r.key for r in self.rows_shown if r.replica is not None), None)
            if key is None:
                return
        if key not in self._drawn:
            return  # filtered out: the cursor finds it again when the filter lets it back
        index = self.get_row_index(key)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False)
        self.selected_key = key

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        index = event.cursor_row
        if 0 <= index < len(self.rows_shown):
            self.selected_key = self.rows_shown[index].key

    def selected_replica(self) -> str | None:
        """The replica of the row under the cursor (None on a node heading or a spare GPU)."""
        index = self.cursor_row
        if 0 <= index < len(self.rows_shown):
            return self.rows_shown[index].replica
        return None
