"""Tones to styles for the current theme: the one place where meaning turns into colour."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.style import Style
from rich.text import Text
from textual.theme import Theme

from console.view.format import Cell, Tone

Styles = Mapping[Tone, Style]


def styles_for(theme: Theme) -> dict[Tone, Style]:
    def color(value: str | None, fallback: str) -> Style:
        return Style(color=value or fallback)

    return {
        Tone.NORMAL: Style(),
        Tone.DIM: Style(dim=True),
        Tone.OK: color(theme.success, "green"),
        Tone.WARN: color(theme.warning, "yellow") + Style(bold=True),
        Tone.BAD: color(theme.error, "red") + Style(bold=True),
        Tone.ACCENT: color(theme.accent or theme.primary, "cyan"),
    }


def to_text(cells: Iterable[Cell], styles: Styles, *, end: str = "") -> Text:
    text = Text(end=end, no_wrap=True, overflow="ellipsis")
    for value, tone in cells:
        text.append(value, styles[tone])
    return text
