"""Pick a routing strategy; each is shown with its one-line summary."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from router.strategies import STRATEGIES


class StrategyPicker(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        options = [
            Option(
                f"{'▶' if name == self.current else ' '} {name}\n    {cls.summary}",
                id=name,
            )
            for name, cls in STRATEGIES.items()
        ]
        with Vertical(classes="dialog"):
            yield Static(f"Routing strategy (now {self.current})", classes="title")
            yield OptionList(*options, id="strategies")
            yield Static(
                "Enter switches; in-flight work is untouched. Esc cancels.", classes="hint"
            )

    def on_mount(self) -> None:
        picker = self.query_one(OptionList)
        names = list(STRATEGIES)
        if self.current in names:
            picker.highlighted = names.index(self.current)
        picker.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
