"""Confirmation before a destructive or doubtful action: names the replica and the impact."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from console.view.format import Cell
from console.widgets.tones import Styles, to_text


class ConfirmScreen(ModalScreen[bool]):
    """``y`` or Enter on the confirm button applies; ``n`` or Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n", "answer(False)", "No", show=False),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]

    def __init__(
        self,
        title: str,
        lines: Sequence[tuple[Cell, ...]],
        styles: Styles,
        *,
        confirm_label: str,
        danger: bool,
    ) -> None:
        super().__init__()
        self.title_text = title
        self.lines = list(lines)
        self.tones = styles
        self.confirm_label = confirm_label
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -danger" if self.danger else "dialog"):
            yield Static(self.title_text, classes="title", id="confirm-title")
            body = to_text((), self.tones)
            for i, line in enumerate(self.lines):
                if i:
                    body.append("\n")
                body.append_text(to_text(line, self.tones))
            yield Static(body, id="confirm-body")
            with Horizontal():
                yield Button(
                    f"{self.confirm_label} (y)",
                    variant="error" if self.danger else "primary",
                    id="yes",
                )
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        # Cancel has the focus: a stray Enter must not drain a replica.
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
