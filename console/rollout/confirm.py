"""The rollout's confirmation: the plan the router would run, then start or cancel.

It shows the waves (each replica with its share of the fleet's capacity, and what stays in
service while the wave is out), the settings in force and, where the simulator gave one, the
prediction (the ``#rollout-prediction`` line: hidden when there is none, never a stand-in
figure). A plan the router refuses (a floor it cannot keep, a bad setting) shows the
refusal and offers no start: ``y`` does nothing and the start button is gone.

Built once and kept by the app (console/app.py); :meth:`RolloutConfirm.show` makes it the
dialog for another plan. A full screen, not a modal, as the help is: nothing of the table
behind it is composited into its frames.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Button, Static

from console.rollout.model import RolloutPreview
from console.view.format import Tone
from console.view.rollout import Line, plan_lines, prediction_lines
from console.widgets.tones import Styles, to_text

__all__ = ["RolloutConfirm"]


class RolloutConfirm(Screen[bool]):
    """``y`` or the start button starts the rollout; ``n`` or Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n", "answer(False)", "No", show=False),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]

    def __init__(self, styles: Styles) -> None:
        super().__init__()
        self.tones = styles
        self.version = ""
        self.preview: RolloutPreview | None = None
        self.refusal: str | None = None
        self._ready = False
        """Mounted with every widget: the app builds the kept dialog ahead of its first use,
        and a show can come after compose, with its widgets still mounting."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="rollout-confirm"):
            yield Static("", classes="title", id="rollout-confirm-title")
            with VerticalScroll():  # a large fleet's waves scroll; the buttons stay
                yield Static("", id="rollout-plan")
            yield Static("", id="rollout-prediction")
            yield Static("", classes="hint", id="rollout-confirm-hint")
            with Horizontal():
                yield Button("Start (y)", variant="primary", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self._ready = True
        self._draw()  # what was asked since compose

    def on_resize(self, event: Resize) -> None:
        # Rows the plan may not take: border, title, prediction, hint and the buttons.
        self.query_one(VerticalScroll).styles.max_height = max(3, event.size.height - 12)

    def show(
        self, version: str, preview: RolloutPreview | None, refusal: str | None, styles: Styles
    ) -> None:
        """The plan for ``version``, or the router's ``refusal`` of it."""
        self.version, self.preview, self.refusal, self.tones = version, preview, refusal, styles
        if self._ready:
            self._draw()

    @property
    def startable(self) -> bool:
        return self.preview is not None and self.refusal is None

    def _draw(self) -> None:
        self.query_one("#rollout-confirm-title", Static).update(f"Roll out {self.version}?")
        if self.preview is not None and self.refusal is None:
            body = plan_lines(self.preview)
            hint = "Nothing has started. Each wave drains, updates, verifies and readmits."
        else:
            body = [(("refused: ", Tone.BAD), (self.refusal or "no plan", Tone.BAD))]
            hint = "The router refuses this rollout: change a setting and try again."
        self.query_one("#rollout-plan", Static).update(self._text(body))
        # The prediction's place: the simulator's figures when given, else why there are none.
        predicted = [] if self.preview is None else prediction_lines(self.preview)
        prediction = self.query_one("#rollout-prediction", Static)
        prediction.update(self._text(predicted))
        prediction.display = bool(predicted) and self.startable
        self.query_one("#rollout-confirm-hint", Static).update(hint)
        self.query_one("#yes", Button).display = self.startable
        self.set_focus(self.query_one("#no", Button))  # a stray Enter must not start it

    def _text(self, lines: list[Line]) -> Text:
        body = Text()
        for i, line in enumerate(lines):
            if i:
                body.append("\n")
            body.append_text(to_text(line, self.tones))
        return body

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes and self.startable)
