"""Scrollbars refreshed when the scrolling changes, not on every layout of the screen."""

from __future__ import annotations

from textual.geometry import Size
from textual.scroll_view import ScrollView


class SteadyScrollbars(ScrollView):
    """A ScrollView that updates its scrollbars only when its size, viewport, rows or
    scrollbar sizes changed.

    ScrollView (Textual 8) compares the compositor's virtual size, which for a Line API
    widget is its viewport, with the widget's own, which is its content. They never match,
    so every layout of the screen (a box opening, a footer key shown) refreshed the widget's
    scrollbars, and each refresh cost a frame of its own, painted 16-33 ms after the frame
    that showed the key's effect.
    """

    _laid_out: tuple[object, ...] | None = None
    """What the scrollbars were last updated for."""

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        styles = self.styles
        seen = (
            size,
            self.virtual_size,
            container_size,
            styles.scrollbar_size_vertical,
            styles.scrollbar_size_horizontal,
        )
        if seen == self._laid_out:
            return False  # what ScrollView returns when nothing changed
        self._laid_out = seen
        return super()._size_updated(size, virtual_size, container_size, layout)
