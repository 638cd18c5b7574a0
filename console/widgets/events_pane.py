"""The events pane: audit trail and alerts, newest at the bottom, bounded."""

from __future__ import annotations

from textual.widgets import RichLog

from console.view.format import Cell
from console.widgets.steady_scroll import SteadyScrollbars
from console.widgets.tones import Styles, to_text

MAX_LINES = 500


class EventsPane(RichLog, SteadyScrollbars):
    def __init__(self) -> None:
        super().__init__(id="events", max_lines=MAX_LINES, wrap=False, markup=False)
        self.border_title = "Events"
        self.lines_written: list[str] = []
        """Plain text of what was written, newest last (bounded): for tests and export."""

    def add(self, cells: tuple[Cell, ...], styles: Styles) -> None:
        text = to_text(cells, styles)
        self.lines_written.append(text.plain)
        del self.lines_written[:-MAX_LINES]
        self.write(text)
