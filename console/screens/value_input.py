"""Ask for a replica's weight or batch size; empty input releases the operator's pin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from router.operator_values import batch_size_problem, weight_problem


@dataclass(frozen=True, slots=True)
class Answer:
    value: float | int | None
    """The new value, or None to release to the static (or adaptive) one."""


def parse_value(text: str, integer: bool) -> Answer | str:
    """The answer, or why the text is not one."""
    text = text.strip()
    if not text or text.lower() == "release":
        return Answer(None)
    try:
        value: float | int = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        return f"{text!r} is not {kind}"
    if (integer and value < 1) or (not integer and not 0 < value < float("inf")):
        return "must be at least 1" if integer else "must be a positive number"
    problem = batch_size_problem(value) if integer else weight_problem(value)
    return Answer(value) if problem is None else problem


class ValueScreen(ModalScreen[Answer | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, title: str, current: str, *, integer: bool, released: str) -> None:
        super().__init__()
        self.title_text = title
        self.current = current
        self.integer = integer
        self.released = released

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.title_text, classes="title")
            yield Static(f"Now {self.current}.", id="value-now")
            yield Input(
                placeholder=f"new value, or empty to release to {self.released}", id="value"
            )
            yield Static("", id="value-error")
            yield Static("Enter applies; Esc cancels.", classes="hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        answer = parse_value(event.value, self.integer)
        if isinstance(answer, str):
            self.query_one("#value-error", Static).update(f"✖ {answer}")
            return
        self.dismiss(answer)

    def action_cancel(self) -> None:
        self.dismiss(None)
