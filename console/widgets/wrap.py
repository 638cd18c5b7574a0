"""Word wrapping with a hanging indent: a line's continuation starts under its text, never
at column 0, so the help's descriptions and the events read as blocks."""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text


def hang(text: Text, width: int, indent: int) -> list[Text]:
    """``text`` in lines of at most ``width`` cells, broken at spaces (mid-word only for a
    word longer than a line); lines after the first start with ``indent`` spaces."""
    plain = text.plain
    lines: list[Text] = []
    start = 0
    while start < len(plain) or not lines:
        room = max(1, width - (indent if lines else 0))
        end = _line_end(plain, start, room)
        line = text[start:end]
        line.rstrip()
        lines.append(Text(" " * indent).append_text(line) if lines else line)
        start = end
        while start < len(plain) and plain[start] == " ":
            start += 1
    return lines


def _line_end(plain: str, start: int, room: int) -> int:
    """Where the line from ``start`` ends: at the last space that fits in ``room`` cells."""
    if cell_len(plain[start:]) <= room:
        return len(plain)
    end, cells = start, 0
    while end < len(plain) and cells + cell_len(plain[end]) <= room:
        cells += cell_len(plain[end])
        end += 1
    space = plain.rfind(" ", start + 1, end + 1)
    return space if space > start else max(end, start + 1)


class Hanging:
    """Lines wrapped at the width they are drawn in, each with its hanging indent: a rich
    renderable, so a Static re-wraps it when its width changes."""

    def __init__(self, lines: Iterable[tuple[Text, int]]) -> None:
        self.lines = list(lines)
        """(line, indent of its continuations)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for text, indent in self.lines:
            yield from hang(text, options.max_width, indent)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max((cell_len(t.plain) for t, _ in self.lines), default=0)
        return Measurement(1, min(widest, options.max_width))
