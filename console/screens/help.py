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
PAIRED = {"faster": ("slower", "Refresh")}
"""Actions shown on one line with their pair (both keys, one title), as docs/console.md's
table shows them: one line less, so that every key fits an 80x24 screen."""


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
        rows = self._rows(labels)
        key_w = max(len(label) for _, label, _, _ in rows) + 1
        title_w = max(len(title) for _, _, title, _ in rows) + 2
        lines = []
        for action_id, label, title, description in rows:
            style = self.tones[Tone.DIM] + Style(strike=True) if action_id in refused else Style()
            line = Text(f"{label:<{key_w}}{title:<{title_w}}{description}", style)
            lines.append((line, key_w + title_w))
        return Hanging(lines)

    def _rows(self, labels: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
        """(action id, key label, title, description) per line; a pair on one line."""
        by_id = {a.id: a for a in self.actions}
        paired = {second for first, (second, _) in PAIRED.items() if first in by_id}
        rows = []
        for a in self.actions:
            if a.id in paired:
                continue
            pair = PAIRED.get(a.id)
            if pair is None or pair[0] not in by_id:
                rows.append((a.id, labels[a.id], a.title, a.description))
                continue
            b = by_id[pair[0]]
            first, second = labels[a.id], labels[b.id]
            description = f"{a.description} ({first}); {b.description.lower()} ({second})"
            rows.append((a.id, f"{first}/{second}", pair[1], description))
        return rows

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
