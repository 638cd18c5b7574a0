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
    strategy says ``(current)``: both read without colour.

    Built once and kept by the app: :meth:`show` makes it what a new picker for the current
    strategy would be, so an open costs no compose, no styling of new widgets and no first
    render of every option."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current
        self._marked: int | None = None
        self._drawn = current
        """The strategy the options name as current, as last composed or drawn."""
        self._ready = False
        """Mounted with every widget: the app builds the kept picker ahead of its first key,
        and a key can come after compose, with its widgets still mounting."""

    def compose(self) -> ComposeResult:
        self._drawn = self.current
        options = [Option(self._prompt(name, cursor=False), id=name) for name in STRATEGIES]
        with Vertical(classes="dialog"):
            yield Static(self._title(), classes="title", id="strategy-title")
            yield OptionList(*options, id="strategies")
            yield Static(
                "Enter switches; in-flight work is untouched. Esc cancels.", classes="hint"
            )

    def _title(self) -> str:
        return f"Routing strategy (now {self.current})"

    def _prompt(self, name: str, *, cursor: bool) -> Group:
        mark = "▶" if cursor else " "
        now = "  (current)" if name == self.current else ""
        # The summary wraps under itself, not under the mark.
        summary = Padding(Text(STRATEGIES[name].summary), (0, 0, 0, 4))
        return Group(Text(f"{mark} {name}{now}"), summary)

    def on_mount(self) -> None:
        if not self.children:
            return  # composed while the app was closing: Textual mounted nothing
        self._ready = True
        self._draw()  # what a key asked since compose

    def show(self, current: str) -> None:
        """Open again as a new picker would: ``current`` in the title and marked, the cursor
        on it. Only the options whose prompt changes are drawn again."""
        self.current = current
        if self._ready:
            self._draw()
        # Else on mount.

    def _draw(self) -> None:
        self.query_one("#strategy-title", Static).update(self._title())
        picker = self.query_one(OptionList)
        names = list(STRATEGIES)
        cursor = names.index(self.current) if self.current in names else None
        marked = {names[self._marked]} if self._marked is not None else set()
        for name in ({self._drawn, self.current} | marked) & set(names):
            index = names.index(name)
            picker.replace_option_prompt_at_index(index, self._prompt(name, cursor=index == cursor))
        self._drawn, self._marked = self.current, cursor
        picker.highlighted = cursor
        picker.scroll_to(y=0, animate=False, immediate=True)
        if cursor is not None:
            picker.scroll_to_highlight()
        self.set_focus(picker)

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
