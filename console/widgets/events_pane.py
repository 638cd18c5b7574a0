"""The events pane: audit trail and alerts, newest at the bottom, bounded.

An event longer than the pane wraps, its further lines indented, rather than being cut
before its action (the pane is 32 cells wide at 80 columns). The events are kept and wrapped
again when the pane's width changes.
"""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.events import Resize
from textual.widgets import RichLog

from console.view.format import Cell
from console.widgets.steady_scroll import SteadyScrollbars
from console.widgets.tones import Styles, to_text
from console.widgets.wrap import hang

MAX_LINES = 500
INDENT = 2


class EventsPane(RichLog, SteadyScrollbars):
    def __init__(self) -> None:
        super().__init__(id="events", max_lines=MAX_LINES, wrap=False, markup=False)
        self.border_title = "Events"
        self.lines_written: list[str] = []
        """Plain text of what was written, newest last (bounded): for tests and export."""
        self._events: deque[Text] = deque(maxlen=MAX_LINES)
        self._wrapped_at = 0

    def add(self, cells: tuple[Cell, ...], styles: Styles) -> None:
        text = to_text(cells, styles)
        self.lines_written.append(text.plain)
        del self.lines_written[:-MAX_LINES]
        self._events.append(text)
        self._write(text)

    def _width(self) -> int:
        # The vertical scrollbar's column is kept free: it comes and goes with the events.
        return self.content_region.width - self.styles.scrollbar_size_vertical

    def _write(self, text: Text) -> None:
        width = self._width()
        if width <= INDENT:
            return  # not laid out yet: written on the first resize
        for line in hang(text, width, INDENT):
            self.write(line, width=width)

    def on_resize(self, event: Resize) -> None:
        width = self._width()
        if width != self._wrapped_at:
            self._wrapped_at = width
            self.clear()
            for text in self._events:
                self._write(text)
