"""The help screen (``?``): every action from the registry, its key and what it does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from console.actions import ACTIONS
from console.view.format import Tone
from console.widgets.tones import Styles

LEGEND = (
    "States: ● active  ◐ draining  ○ drained  ✖ ejected  ⚠ stale  ✖ offline\n"
    "Util: ~ marks the router's estimate (no fresh GPU reading); * a pinned weight or batch size."
)


def key_label(key: str) -> str:
    names = {"question_mark": "?", "colon": ":", "slash": "/", "plus": "+", "minus": "-"}
    return names.get(key, key)


class HelpScreen(Screen[None]):
    """A full screen, not a modal: nothing of the 500-row table behind it is redrawn."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_help", "Close", show=False),
        Binding("question_mark", "dismiss_help", "Close", show=False),
        Binding("q", "dismiss_help", "Close", show=False),
    ]

    def __init__(self, keys: Mapping[str, str], styles: Styles, *, read_only: bool) -> None:
        super().__init__()
        self.keys = keys
        self.tones = styles
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        # Plain padded text, not a rich Table: the screen must open in well under 100 ms.
        body = Text(no_wrap=False)
        for a in ACTIONS:
            refused = self.read_only and a.mutates
            style = self.tones[Tone.DIM] + Style(strike=True) if refused else Style()
            desc = a.description + ("  (read-only: refused)" if refused else "")
            body.append(f"{key_label(self.keys[a.id]):<7}{a.title:<10}{desc}\n", style)
        title = "Keys" + (
            "  ·  READ-ONLY console: mutating actions refused" if self.read_only else ""
        )
        with Vertical(classes="dialog"):
            yield Static(title, classes="title")
            with VerticalScroll():
                yield Static(body, id="help-table")
            yield Static(LEGEND, classes="hint")
            yield Static("Esc or ? closes. Ctrl+P or : opens the command palette.", classes="hint")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
