"""The fleet table: a DataTable of positional slots, written cell by cell by difference.

Rows are slots ``0..n-1``; each refresh writes the i-th row of the view into slot i, and only
cells whose (text, tone) changed are sent to ``update_cell``. Sorting and filtering thus
reorder nothing: they change what goes into the slots. The cursor follows the selected GPU
(not the slot), so a row moving under a live sort never turns a keypress onto another
replica.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.widgets import DataTable

from console.view.fleet import COLUMNS, TableRow
from console.view.format import Cell
from console.widgets.tones import Styles, to_text


class FleetTable(DataTable[object]):
    def __init__(self) -> None:
        super().__init__(id="fleet", cursor_type="row", zebra_stripes=False)
        self._rendered: list[tuple[Cell, ...]] = []
        self.rows_shown: list[TableRow] = []
        self.selected_key: str | None = None
        self.cell_updates = 0
        """Cells written since start: what the difference saves is measured from this."""

    def on_mount(self) -> None:
        for c in COLUMNS:
            self.add_column(c.label, width=c.width, key=c.id)

    def show(self, rows: Sequence[TableRow], styles: Styles, force: bool = False) -> None:
        """Put ``rows`` into the slots, writing only changed cells (all of them if ``force``)."""
        keep = self.selected_key
        for slot, row in enumerate(rows):
            if slot >= len(self._rendered):
                self.add_row(*(to_text([c], styles) for c in row.cells), key=str(slot))
                self._rendered.append(row.cells)
                self.cell_updates += len(row.cells)
                continue
            old = self._rendered[slot]
            if old == row.cells and not force:
                continue
            for cid, (before, after) in enumerate(zip(old, row.cells, strict=True)):
                if before != after or force:
                    self.update_cell(str(slot), COLUMNS[cid].id, to_text([after], styles))
                    self.cell_updates += 1
            self._rendered[slot] = row.cells
        while len(self._rendered) > len(rows):
            self._rendered.pop()
            self.remove_row(str(len(self._rendered)))
        self.rows_shown = list(rows)
        self._follow(keep)

    def _follow(self, key: str | None) -> None:
        if key is None:
            # Nothing chosen yet: start on the first GPU that runs a replica.
            key = next((r.key for r in self.rows_shown if r.replica is not None), None)
            if key is None:
                return
        for slot, row in enumerate(self.rows_shown):
            if row.key == key:
                if slot != self.cursor_row:
                    self.move_cursor(row=slot, animate=False)
                self.selected_key = key
                return

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
