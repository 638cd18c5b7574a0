"""The rollout's live progress: a full screen, redrawn at each of the console's refreshes.

It shows the phase, the wave, capacity in service now and at its lowest against the floor,
the requests moved and waited for, each replica's step and version, and the error that
stopped it. ``p`` pauses, ``r`` resumes, ``a`` aborts, ``b`` rolls back, ``n`` starts a new
one (its form): each through the app, which asks first and refuses (saying why) in a
read-only console.

A full screen, not a modal, like the help: nothing of the table behind it is redrawn. Built
once and kept (console/app.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.events import Resize
from textual.screen import Screen
from textual.signal import Signal
from textual.widgets import Static

from console.rollout.model import RolloutProgress
from console.view.format import Tone
from console.view.rollout import Line, progress_lines
from console.widgets.tones import Styles, to_text

__all__ = ["HINT", "RolloutScreen"]

HINT = "p pause · r resume · a abort · b roll back · n new · Esc closes"
NONE_YET = "No rollout yet: n starts one (the plan is shown before anything starts)."


class RolloutScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close", show=False),
        Binding("n", "new", "New", show=False),
        Binding("p", "steer('pause')", "Pause", show=False),
        Binding("r", "steer('resume')", "Resume", show=False),
        Binding("a", "steer('abort')", "Abort", show=False),
        Binding("b", "steer('rollback')", "Roll back", show=False),
    ]

    def __init__(
        self,
        read: Callable[[], RolloutProgress | None],
        steer: Callable[[str], None],
        new: Callable[[], None],
        refreshed: Signal[Any],
        styles: Styles,
    ) -> None:
        """``read``: the rollout now (the backend's); ``steer``: the app's way to pause,
        resume, abort or roll back; ``new``: its way to start another; ``refreshed``: the
        app's refresh signal."""
        super().__init__()
        self.read = read
        self.steer = steer
        self.new = new
        self.tones = styles
        self.refreshed = refreshed
        self.drawn: list[Line] = []

    def compose(self) -> ComposeResult:
        dialog = Vertical(classes="dialog", id="rollout-progress")
        dialog.border_title = f"Rollout · {HINT}"
        with dialog, VerticalScroll():  # a large fleet's replicas scroll
            yield Static("", id="rollout-status")

    def on_mount(self) -> None:
        self.refreshed.subscribe(self, lambda _: self._follow())

    def on_resize(self, event: Resize) -> None:
        self.query_one(VerticalScroll).styles.max_height = max(3, event.size.height - 2)

    def on_screen_resume(self) -> None:
        # Each open, and each return from a confirmation over it, shows the rollout of now.
        self.redraw()

    def restyle(self, styles: Styles) -> None:
        self.tones, self.drawn = styles, []
        self.redraw()

    def _follow(self) -> None:
        # Kept while closed: only an open screen reads the rollout again.
        if self in self.app.screen_stack:
            self.redraw()

    def redraw(self) -> None:
        progress = self.read()
        none: list[Line] = [((NONE_YET, Tone.DIM),)]
        lines = none if progress is None else progress_lines(progress)
        if lines == self.drawn:
            return
        self.drawn = lines
        text = Text()
        for i, line in enumerate(lines):
            if i:
                text.append("\n")
            text.append_text(to_text(line, self.tones))
        self.query_one("#rollout-status", Static).update(text)

    @property
    def plain(self) -> str:
        """What the screen says, as text (for tests and screenshots)."""
        return "\n".join("".join(text for text, _ in line) for line in self.drawn)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_new(self) -> None:
        self.new()

    def action_steer(self, action: str) -> None:
        self.steer(action)
