"""Pick a routing strategy; each is shown with its one-line summary."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.padding import Padding
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from router.strategies import STRATEGIES


class StrategyPicker(ModalScreen[str | None]):
    """Every strategy with its summary. The cursor's option starts with ``▶`` and the current
    strategy says ``(current)``: both read without colour."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current
        self._marked: int | None = None

    def compose(self) -> ComposeResult:
        options = [Option(self._prompt(name, cursor=False), id=name) for name in STRATEGIES]
        with Vertical(classes="dialog"):
            yield Static(f"Routing strategy (now {self.current})", classes="title")
            yield OptionList(*options, id="strategies")
            yield Static(
                "Enter switches; in-flight work is untouched. Esc cancels.", classes="hint"
            )

    def _prompt(self, name: str, *, cursor: bool) -> Group:
        mark = "▶" if cursor else " "
        now = "  (current)" if name == self.current else ""
        # The summary wraps under itself, not under the mark.
        summary = Padding(Text(STRATEGIES[name].summary), (0, 0, 0, 4))
        return Group(Text(f"{mark} {name}{now}"), summary)

    def on_mount(self) -> None:
        picker = self.query_one(OptionList)
        names = list(STRATEGIES)
        if self.current in names:
            picker.highlighted = names.index(self.current)
        picker.focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        picker = event.option_list
        names = list(STRATEGIES)
        if self._marked is not None and self._marked != event.option_index:
            old = names[self._marked]
            picker.replace_option_prompt_at_index(self._marked, self._prompt(old, cursor=False))
        self._marked = event.option_index
        name = names[event.option_index]
        picker.replace_option_prompt_at_index(event.option_index, self._prompt(name, cursor=True))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
