"""A Static whose refresh asks for a layout of the screen only when its size can change."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static


class SteadyStatic(Static):
    """A Static of unwrapped lines, updated in place while its shape stays the same.

    ``Static.update`` asks for a layout each time, and the screen does it after the frame
    that showed the change: at each refresh, and after a screen opens and fills its parts, a
    second layout and a second frame (10-40 ms at the demo's default load) came after the
    frame that showed the key's effect. A text whose lines are not wrapped has the height of
    its line count and, where the width is set by the content, the width of its longest
    line: while those stay the same, a repaint is all it needs. Its lines are cut with an
    ellipsis at the edge, as the console's texts ask (``to_text``), never wrapped: a wrapped
    line's height would follow the width and the words.
    """

    DEFAULT_CSS = """
    SteadyStatic {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    _shape: tuple[int, int] | None = None
    """Lines and (where the width follows the content) longest line last shown."""

    def put(self, text: Text) -> None:
        """Show ``text`` (its lines unwrapped): laid out again only when its shape changed."""
        lines = text.plain.split("\n")
        width = self.styles.width  # unset: the container's width, as a block takes it
        auto = width is not None and width.is_auto
        shape = (len(lines), max(map(cell_len, lines)) if auto else 0)
        self.update(text, layout=shape != self._shape)
        self._shape = shape
