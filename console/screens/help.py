"""The help screen (``?``): where to send requests, every action from the registry with its
key and what it does, and the legend; all of it on one 80x24 screen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Static

from console.actions import offered
from console.view.format import Tone
from console.widgets.tones import Styles
from console.widgets.wrap import Hanging

LEGEND = (
    "States: ● active ◐ draining ○ drained ✖ ejected/failing/offline ⚠ stale",
    "~ utilization is the router's estimate  * weight or batch size pinned",
)
REFUSED = "✖"
"""Marks an action a read-only console refuses, beside its key: struck-through text alone
is lost on terminals that cannot draw it."""
CLOSE = "Esc or ? closes · : or Ctrl+P palette"


def key_label(key: str) -> str:
    names = {"question_mark": "?", "colon": ":", "slash": "/", "plus": "+", "minus": "-"}
    return names.get(key, key)


def where(front_url: str | None, admin_url: str | None) -> str:
    """Where clients and ``gpurouter ctl`` reach this router ('' when it serves neither)."""
    parts = []
    if front_url:
        parts.append(f"requests {front_url}/v1")
    if admin_url:
        parts.append(f"admin {admin_url}")
    return " · ".join(parts)


class HelpScreen(Screen[None]):
    """A full screen, not a modal: nothing of the 500-row table behind it is redrawn."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_help", "Close", show=False),
        Binding("question_mark", "dismiss_help", "Close", show=False),
        Binding("q", "dismiss_help", "Close", show=False),
    ]

    def __init__(
        self,
        keys: Mapping[str, str],
        styles: Styles,
        *,
        read_only: bool,
        front_url: str | None = None,
        admin_url: str | None = None,
        broker: bool = False,
    ) -> None:
        super().__init__()
        self.actions = offered(broker)
        self.keys = keys
        self.tones = styles
        self.read_only = read_only
        self.where = where(front_url, admin_url)

    def compose(self) -> ComposeResult:
        # Plain padded text, not a rich Table: the screen must open in well under 100 ms.
        dialog = Vertical(classes="dialog", id="help")
        mode = f"READ-ONLY: {REFUSED} refused · " if self.read_only else ""
        dialog.border_title = f"Keys · {mode}{CLOSE}"
        with dialog:
            if self.where:
                yield Static(self.where, id="help-where")
            with VerticalScroll():
                yield Static(self._keys(), id="help-table")
            yield Static(Hanging((Text(line), 2) for line in LEGEND), classes="hint")

    def on_resize(self, event: Resize) -> None:
        # Rows the keys may not take: the border, where to send requests and the legend.
        kept = 2 + len(LEGEND) + (1 if self.where else 0)
        self.query_one(VerticalScroll).styles.max_height = max(3, event.size.height - kept)

    def _keys(self) -> Hanging:
        refused = {a.id for a in self.actions if self.read_only and a.mutates}
        labels = {a.id: key_label(self.keys[a.id]) for a in self.actions}
        for action_id in refused:
            labels[action_id] += f" {REFUSED}"
        key_w = max(len(label) for label in labels.values()) + 1
        title_w = max(len(a.title) for a in self.actions) + 2
        lines = []
        for a in self.actions:
            style = self.tones[Tone.DIM] + Style(strike=True) if a.id in refused else Style()
            line = Text(f"{labels[a.id]:<{key_w}}{a.title:<{title_w}}{a.description}", style)
            lines.append((line, key_w + title_w))
        return Hanging(lines)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
