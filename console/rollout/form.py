"""The rollout form: the version and the main settings, before the plan is shown.

An empty field leaves the setting to the router's fleet file (its ``rollout:`` section); the
confirmation then shows every setting in force. The updater is the fleet file's unless a
command is named here (``systemctl restart vllm@{replica}``). The router checks every value
again; this form refuses only what cannot be a value at all, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import Input, Static

__all__ = ["FIELDS", "RolloutForm", "RolloutRequest", "read_form"]

ORDERS = ("weakest-first", "strongest-first")
CHOICES = ("wait", "preempt")
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("version", "version", "served model name, e.g. org/llama-3.1-8b-v2"),
    ("floor", "floor", "share kept in service: 0.75 or 75%"),
    ("order", "order", "weakest-first, strongest-first, or ids a,b,c"),
    ("drain", "drain timeout", "seconds a wave waits for its requests"),
    ("on_timeout", "then", "wait or preempt"),
    ("updater", "update command", "e.g. systemctl restart vllm@{replica}"),
)
"""Each field's id, label and placeholder, in the form's order."""


@dataclass(frozen=True, slots=True)
class RolloutRequest:
    """What the operator asked for: the version and the settings given (the rest are the
    fleet file's)."""

    version: str
    settings: Mapping[str, Any] = field(default_factory=dict)


def read_form(values: Mapping[str, str]) -> RolloutRequest | str:
    """The request, or why a field cannot be read (naming the field)."""
    got = {k: v.strip() for k, v in values.items()}
    version = got.get("version", "")
    if not version or " " in version:
        return "version: give the model name the replicas will serve (no spaces)"
    settings: dict[str, Any] = {}
    floor = got.get("floor", "")
    if floor:
        try:
            settings["floor"] = float(floor[:-1]) / 100 if floor.endswith("%") else float(floor)
        except ValueError:
            return f"floor: {floor!r} is not a share such as 0.75 or 75%"
    order = got.get("order", "")
    if order:
        ids = [r.strip() for r in order.split(",") if r.strip()]
        settings["order"] = order if order in ORDERS else ids
    drain = got.get("drain", "")
    if drain:
        try:
            settings["drain_timeout_s"] = float(drain)
        except ValueError:
            return f"drain timeout: {drain!r} is not a number of seconds"
    choice = got.get("on_timeout", "")
    if choice:
        if choice not in CHOICES:
            return f"then: {choice!r} is not one of {', '.join(CHOICES)}"
        settings["on_drain_timeout"] = choice
    if command := got.get("updater", ""):
        settings["updater"] = {"command": {"run": command}}
    return RolloutRequest(version, settings)


class RolloutForm(Screen[RolloutRequest | None]):
    """Enter in any field asks for the plan; Escape cancels. Built once and kept
    (console/app.py): :meth:`reset` empties it. A full screen, not a modal, as the help is:
    nothing of the table behind it is composited into its frames."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="rollout-form"):
            yield Static("Roll out a model version", classes="title")
            # One row each (compact): six bordered inputs took 18 rows, and each open drew
            # them all (a third of the key's time to the screen).
            with Grid(id="rollout-fields"):
                for name, label, placeholder in FIELDS:
                    yield Static(label, classes="label")
                    yield Input(placeholder=placeholder, id=f"rollout-{name}", compact=True)
            yield Static("", id="rollout-form-error")
            yield Static(
                "Empty: the fleet file's rollout setting (its updater too). Enter shows the "
                "plan, nothing starts yet; Tab moves; Esc cancels.",
                classes="hint",
            )

    def on_mount(self) -> None:
        self.query_one("#rollout-version", Input).focus()

    def reset(self) -> None:
        """Empty, version focused: as a new form would be."""
        if not self.is_mounted:
            return
        for name, _, _ in FIELDS:
            self.query_one(f"#rollout-{name}", Input).value = ""
        error = self.query_one("#rollout-form-error", Static)
        if str(error.render()):
            error.update("")  # only then: an update lays the screen out again
        self.set_focus(self.query_one("#rollout-version", Input))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        values = {name: self.query_one(f"#rollout-{name}", Input).value for name, _, _ in FIELDS}
        answer = read_form(values)
        if isinstance(answer, str):
            self.query_one("#rollout-form-error", Static).update(f"✖ {answer}")
            return
        self.dismiss(answer)

    def action_cancel(self) -> None:
        self.dismiss(None)
