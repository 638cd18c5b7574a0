"""Per-GPU-model summary: a few fixed-width lines, redrawn when they change."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from console.view.format import Cell, Tone, fit
from console.view.models import HEADINGS, HELP, LEGEND
from console.widgets.steady_static import SteadyStatic
from console.widgets.tones import Styles, to_text

WIDTHS = (10, 3, 4, 7, 4, 9)


class ModelSummary(SteadyStatic):
    def __init__(self) -> None:
        super().__init__("", id="models")
        self.border_title = "GPU models"
        self.border_subtitle = LEGEND
        self.tooltip = HELP
        self._last: Sequence[tuple[Cell, ...]] | None = None
        self.plain: list[list[str]] = []
        """The rows shown, cell by cell, as plain text: for tests and export."""

    def show(self, rows: Sequence[tuple[Cell, ...]], styles: Styles, force: bool = False) -> None:
        if rows == self._last and not force:
            return
        self._last = rows
        self.plain = [[v for v, _ in row] for row in rows]
        head = tuple(
            (fit(h, w).ljust(w) + " ", Tone.DIM) for h, w in zip(HEADINGS, WIDTHS, strict=True)
        )
        text = to_text(head, styles)
        for row in rows:
            text.append("\n")
            text.append_text(_line(row, styles))
        self.put(text)


def _line(row: tuple[Cell, ...], styles: Styles) -> Text:
    cells = [(fit(v, w).ljust(w) + " ", t) for (v, t), w in zip(row, WIDTHS, strict=True)]
    return to_text(cells, styles)
