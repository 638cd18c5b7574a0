"""The filter box: typed text narrows the fleet table live; Enter keeps it, Escape clears it."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import Input

from console.messages import FilterClosed


class FilterInput(Input):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "clear_and_close", "Clear filter", show=False)
    ]

    def __init__(self, on_change: Callable[[str], None]) -> None:
        super().__init__(placeholder="filter: replica, node, GPU model or state", id="filter")
        self._on_change = on_change

    def watch_value(self, value: str) -> None:
        # Called as the text changes, in this widget's turn: the table is narrowed before the
        # typed character is painted, so both reach the screen in one frame. Input.Changed
        # reaches the app after that frame has started, and the rows took the next one.
        self._on_change(value)

    def action_clear_and_close(self) -> None:
        # The app empties the box: clearing, closing and the redraw are then one pass.
        self.post_message(FilterClosed(clear=True))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(FilterClosed(clear=False))
