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
from textual.widgets.button import ButtonVariant

from console.view.format import Cell
from console.widgets.tones import Styles, to_text

Lines = Sequence[tuple[Cell, ...]]
Follow = tuple[Signal[Any], Callable[[], Lines]]
"""The app's refresh signal and what builds the body again."""


class ConfirmScreen(ModalScreen[bool]):
    """``y`` or Enter on the confirm button applies; ``n`` or Escape cancels.

    With ``follow`` (the app's refresh signal and what builds the body), the body is built
    again at each refresh: what it says when the operator answers is what happens.

    The app builds one and keeps it: :meth:`show` makes it the dialog a new one would be for
    another action, so an open costs no compose and no styling of new widgets."""

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
        follow: Follow | None = None,
    ) -> None:
        super().__init__()
        self.title_text = title
        self.lines = list(lines)
        self.follow = follow
        self.tones = styles
        self.confirm_label = confirm_label
        self.danger = danger
        self._followed: list[Signal[Any]] = []
        self._ready = False
        """Mounted with every widget: the app builds the kept dialog ahead of its first key,
        and a key can come after compose, with its widgets still mounting."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -danger" if self.danger else "dialog"):
            yield Static(self.title_text, classes="title", id="confirm-title")
            yield Static(self._body(), id="confirm-body")
            hint = Static("Live: redrawn at each refresh until you answer.", classes="hint")
            hint.display = self.follow is not None
            yield hint
            with Horizontal():
                yield Button(f"{self.confirm_label} (y)", variant=self._variant(), id="yes")
                yield Button("Cancel (n)", id="no")

    def _variant(self) -> ButtonVariant:
        return "error" if self.danger else "primary"

    def _body(self) -> Text:
        body = to_text((), self.tones)
        for i, line in enumerate(self.lines):
            if i:
                body.append("\n")
            body.append_text(to_text(line, self.tones))
        return body

    def on_mount(self) -> None:
        if not self.children:
            return  # composed while the app was closing: Textual mounted nothing
        self._ready = True
        self._fill()  # what a key asked since compose (seen in CI: an empty preempt dialog)

    def show(
        self,
        title: str,
        lines: Lines,
        styles: Styles,
        *,
        confirm_label: str,
        danger: bool,
        follow: Follow | None = None,
    ) -> None:
        """Ask about another action, as a dialog built for it would, Cancel focused."""
        self.title_text, self.lines, self.tones = title, list(lines), styles
        self.confirm_label, self.danger, self.follow = confirm_label, danger, follow
        if self._ready:
            self._fill()
        # Else on mount, from these.

    def _fill(self) -> None:
        self.query_one(Vertical).set_class(self.danger, "-danger")
        self.query_one("#confirm-title", Static).update(self.title_text)
        self.query_one("#confirm-body", Static).update(self._body())
        self.query_one(".hint", Static).display = self.follow is not None
        yes = self.query_one("#yes", Button)
        yes.label, yes.variant = f"{self.confirm_label} (y)", self._variant()
        # Cancel has the focus: a stray Enter must not drain a replica.
        self.set_focus(self.query_one("#no", Button))
        self._subscribe()

    def _subscribe(self) -> None:
        if self.follow is not None and self.follow[0] not in self._followed:
            self._followed.append(self.follow[0])
            self.follow[0].subscribe(self, lambda _: self._follow_now())

    def _follow_now(self) -> None:
        # Kept while closed: only an open dialog's body is built again.
        if self.follow is not None and self in self.app.screen_stack:
            self._rebuild(self.follow[1])

    def _rebuild(self, build: Callable[[], Lines]) -> None:
        lines = list(build())
        if lines != self.lines:
            self.lines = lines
            self.query_one("#confirm-body", Static).update(self._body())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
