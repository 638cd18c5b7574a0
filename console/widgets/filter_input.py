"""The filter box: typed text narrows the fleet table live; Enter keeps it, Escape clears it."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import Input

from console.messages import FilterClosed


class FilterInput(Input):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "clear_and_close", "Clear filter", show=False)
    ]

    def __init__(self) -> None:
        super().__init__(placeholder="filter: replica, node, GPU model or state", id="filter")

    def action_clear_and_close(self) -> None:
        # The app empties the box: clearing, closing and the redraw are then one pass.
        self.post_message(FilterClosed(clear=True))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(FilterClosed(clear=False))
