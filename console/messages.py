"""Past-tense messages the console's widgets react to."""

from __future__ import annotations

from textual.message import Message

from router.control import Event


class RouterEventRecorded(Message):
    """The control surface recorded an event: a command (anyone's) or a state change."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class FilterClosed(Message):
    """The operator closed the filter box: Enter keeps the filter as typed, Escape clears it."""

    def __init__(self, *, clear: bool) -> None:
        super().__init__()
        self.clear = clear
