"""The dashboard header: three lines of fleet state, redrawn only when they change."""

from __future__ import annotations

from console.view.format import Cell
from console.widgets.steady_static import SteadyStatic
from console.widgets.tones import Styles, to_text


class DashboardHeader(SteadyStatic):
    def __init__(self) -> None:
        super().__init__("", id="header")
        self._last: tuple[tuple[Cell, ...], ...] | None = None
        self.plain = ""
        """What is shown, as plain text: for tests and export."""

    def show(
        self, lines: tuple[tuple[Cell, ...], ...], styles: Styles, force: bool = False
    ) -> None:
        if lines == self._last and not force:
            return
        self._last = lines
        self.plain = "\n".join("".join(t for t, _ in line) for line in lines)
        text = to_text((), styles)
        for i, line in enumerate(lines):
            if i:
                text.append("\n")
            text.append_text(to_text(line, styles))
        self.put(text)
