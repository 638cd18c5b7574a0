"""The traffic split's live screen: a canary's share, schedule and the judge's figures, or a
blue-green set's replicas and what the blue set still holds; redrawn at each refresh.

For a canary ``s`` sets the share, ``p`` promotes, ``b`` rolls it back; for a blue-green set
``w`` switches to green, ``u`` switches back, ``r`` releases the emptied blue set; ``n``
starts a new canary (its form). Each goes through the app, which asks first and refuses
(saying why) in a read-only console. A full screen, not a modal, like the rollout's progress.
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

from console.rollout.split_model import CanaryState, SplitState
from console.view.format import Tone
from console.view.split import Line, split_lines
from console.widgets.tones import Styles, to_text

__all__ = ["BLUE_GREEN_HINT", "CANARY_HINT", "SplitScreen"]

CANARY_HINT = "s share · p promote · b roll back · n new · Esc closes"
BLUE_GREEN_HINT = "w switch · u switch back · r release · Esc closes"
NONE_YET = "No canary and no blue-green set: n starts a canary (confirmed before it starts)."


class SplitScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close", show=False),
        Binding("n", "new", "New", show=False),
        Binding("s", "steer('step')", "Share", show=False),
        Binding("p", "steer('promote')", "Promote", show=False),
        Binding("b", "steer('abort')", "Roll back", show=False),
        Binding("w", "steer('switch')", "Switch", show=False),
        Binding("u", "steer('switch back')", "Switch back", show=False),
        Binding("r", "steer('release')", "Release", show=False),
    ]

    def __init__(
        self,
        read: Callable[[], SplitState | None],
        steer: Callable[[str], None],
        new: Callable[[], None],
        refreshed: Signal[Any],
        styles: Styles,
    ) -> None:
        """``read``: the split now (the backend's); ``steer``: the app's way to step,
        promote, roll back, switch, switch back or release; ``new``: its way to start a
        canary; ``refreshed``: the app's refresh signal."""
        super().__init__()
        self.read = read
        self.steer = steer
        self.new = new
        self.tones = styles
        self.refreshed = refreshed
        self.drawn: list[Line] = []

    def compose(self) -> ComposeResult:
        dialog = Vertical(classes="dialog", id="split-progress")
        dialog.border_title = f"Split · {CANARY_HINT}"
        with dialog, VerticalScroll():
            yield Static("", id="split-status")

    def on_mount(self) -> None:
        self.refreshed.subscribe(self, lambda _: self._follow())

    def on_resize(self, event: Resize) -> None:
        self.query_one(VerticalScroll).styles.max_height = max(3, event.size.height - 2)

    def on_screen_resume(self) -> None:
        self.redraw()

    def _follow(self) -> None:
        if self in self.app.screen_stack:
            self.redraw()

    def redraw(self) -> None:
        state = self.read()
        hint = (
            BLUE_GREEN_HINT
            if state is not None and not isinstance(state, CanaryState)
            else CANARY_HINT
        )
        self.query_one("#split-progress", Vertical).border_title = f"Split · {hint}"
        lines: list[Line] = [((NONE_YET, Tone.DIM),)] if state is None else split_lines(state)
        if lines == self.drawn:
            return
        self.drawn = lines
        text = Text()
        for i, line in enumerate(lines):
            if i:
                text.append("\n")
            text.append_text(to_text(line, self.tones))
        self.query_one("#split-status", Static).update(text)

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
