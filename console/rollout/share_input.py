"""Ask for a canary's share: the percent of the stable name's requests to the new version."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

__all__ = ["ShareScreen", "parse_share"]


def parse_share(text: str) -> float | str:
    """The percent (0 to 100), or why the text is not one."""
    text = text.strip().rstrip("%").strip()
    try:
        percent = float(text)
    except ValueError:
        return f"{text!r} is not a percentage" if text else "give a percentage from 0 to 100"
    if not 0 <= percent <= 100:
        return f"{percent:g} is not within 0 to 100"
    return percent


class ShareScreen(ModalScreen[float | None]):
    """Enter sets it (a confirmation follows); Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, title: str, current: str) -> None:
        super().__init__()
        self.title_text = title
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.title_text, classes="title")
            yield Static(f"Now {self.current}.", id="share-now")
            yield Input(placeholder="percent of the requests, 0 to 100", id="share")
            yield Static("", id="share-error", classes="form-error")
            yield Static("Enter asks to confirm; Esc cancels.", classes="hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        answer = parse_share(event.value)
        if isinstance(answer, str):
            self.query_one("#share-error", Static).update(f"✖ {answer}")
            return
        self.dismiss(answer)

    def action_cancel(self) -> None:
        self.dismiss(None)
