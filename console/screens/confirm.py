"""Confirmation before a destructive or doubtful action: names the replica and the impact."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.signal import Signal
from textual.widgets import Button, Static

from console.view.format import Cell
from console.widgets.tones import Styles, to_text

Lines = Sequence[tuple[Cell, ...]]


class ConfirmScreen(ModalScreen[bool]):
    """``y`` or Enter on the confirm button applies; ``n`` or Escape cancels.

    With ``follow`` (the app's refresh signal and what builds the body), the body is built
    again at each refresh: what it says when the operator answers is what happens."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n", "answer(False)", "No", show=False),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]

    def __init__(
        self,
        title: str,
        lines: Lines,
        styles: Styles,
        *,
        confirm_label: str,
        danger: bool,
        follow: tuple[Signal[Any], Callable[[], Lines]] | None = None,
    ) -> None:
        super().__init__()
        self.title_text = title
        self.lines = list(lines)
        self.follow = follow
        self.tones = styles
        self.confirm_label = confirm_label
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -danger" if self.danger else "dialog"):
            yield Static(self.title_text, classes="title", id="confirm-title")
            yield Static(self._body(), id="confirm-body")
            if self.follow is not None:
                yield Static("Live: redrawn at each refresh until you answer.", classes="hint")
            with Horizontal():
                yield Button(
                    f"{self.confirm_label} (y)",
                    variant="error" if self.danger else "primary",
                    id="yes",
                )
                yield Button("Cancel (n)", id="no")

    def _body(self) -> Text:
        body = to_text((), self.tones)
        for i, line in enumerate(self.lines):
            if i:
                body.append("\n")
            body.append_text(to_text(line, self.tones))
        return body

    def on_mount(self) -> None:
        # Cancel has the focus: a stray Enter must not drain a replica.
        self.query_one("#no", Button).focus()
        if self.follow is not None:
            signal, build = self.follow
            signal.subscribe(self, lambda _: self._rebuild(build))

    def _rebuild(self, build: Callable[[], Lines]) -> None:
        lines = list(build())
        if lines != self.lines:
            self.lines = lines
            self.query_one("#confirm-body", Static).update(self._body())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
