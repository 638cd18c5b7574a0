"""The canary form: the new version, its replicas and the main rules, before anything starts.

An empty field leaves the value to the router: the canary replicas are those that already
run the version, the stable name is theirs, the steps, dwell and window are the fleet file's
``rollout.canary``, and the floor kept while its replicas move (to the new version, back, or
the rest of the model on a promotion) and the updater its ``rollout:`` section's, unless
given here.
The router checks every value again; this form refuses only what cannot be a value at all,
naming the field. What it reads is the admin API's ``canary`` (``POST /admin/split``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import Input, Static

__all__ = ["FIELDS", "CanaryForm", "read_canary_form"]

FIELDS: tuple[tuple[str, str, str], ...] = (
    ("version", "version", "the new version's model name, e.g. org/llama-3.1-8b-v2"),
    ("replicas", "replicas", "ids a,b (empty: those that run the version)"),
    ("model", "stable name", "what clients ask for (empty: the replicas' model)"),
    ("steps", "steps", "percentages, e.g. 5,25,50,100"),
    ("dwell", "dwell", "seconds each step is held"),
    ("window", "window", "seconds the judge compares over"),
    ("manual", "manual", "yes: the share moves only when you step it"),
    ("floor", "floor", "share kept in service while replicas move: 0.75 or 75%"),
    ("updater", "update command", "e.g. systemctl restart vllm@{replica}"),
)
"""Each field's id, label and placeholder, in the form's order."""

_YES = ("yes", "y", "true")
_NO = ("", "no", "n", "false")


def read_canary_form(values: Mapping[str, str]) -> dict[str, Any] | str:
    """The admin API's ``canary`` body, or why a field cannot be read (naming the field)."""
    got = {k: v.strip() for k, v in values.items()}
    version = got.get("version", "")
    if not version or " " in version:
        return "version: give the new version's model name (no spaces)"
    body: dict[str, Any] = {"action": "canary", "version": version}
    if replicas := [r.strip() for r in got.get("replicas", "").split(",") if r.strip()]:
        body["replicas"] = replicas
    if model := got.get("model", ""):
        body["model"] = model
    rules: dict[str, Any] = {}
    if steps := got.get("steps", ""):
        try:
            rules["steps"] = [float(p.strip().rstrip("%")) for p in steps.split(",")]
        except ValueError:
            return f"steps: {steps!r} is not percentages such as 5,25,50,100"
    for name, key in (("dwell", "dwell_s"), ("window", "window_s")):
        if text := got.get(name, ""):
            try:
                rules[key] = float(text)
            except ValueError:
                return f"{name}: {text!r} is not a number of seconds"
    manual = got.get("manual", "").lower()
    if manual not in _YES + _NO:
        return f"manual: {got['manual']!r} is not yes or no"
    if manual in _YES:
        body["manual"] = True
    settings: dict[str, Any] = {}
    if floor := got.get("floor", ""):
        try:
            settings["floor"] = float(floor[:-1]) / 100 if floor.endswith("%") else float(floor)
        except ValueError:
            return f"floor: {floor!r} is not a share such as 0.75 or 75%"
    if rules:
        settings["canary"] = rules
    if command := got.get("updater", ""):
        settings["updater"] = {"command": {"run": command}}
    if settings:
        body["settings"] = settings
    return body


class CanaryForm(Screen[dict[str, Any] | None]):
    """Enter in any field asks to confirm; Escape cancels. A full screen, not a modal, as the
    rollout form is: nothing of the table behind it is composited into its frames."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="canary-form"):
            yield Static("Start a canary", classes="title")
            with Grid(id="canary-fields"):
                for name, label, placeholder in FIELDS:
                    yield Static(label, classes="label")
                    yield Input(placeholder=placeholder, id=f"canary-{name}", compact=True)
            yield Static("", id="canary-form-error", classes="form-error")
            yield Static(
                "Empty: the router's choice (the fleet file's rollout.canary and updater). "
                "Enter asks to confirm, nothing starts yet; Tab moves; Esc cancels.",
                classes="hint",
            )

    def on_mount(self) -> None:
        self.query_one("#canary-version", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        values = {name: self.query_one(f"#canary-{name}", Input).value for name, _, _ in FIELDS}
        answer = read_canary_form(values)
        if isinstance(answer, str):
            self.query_one("#canary-form-error", Static).update(f"✖ {answer}")
            return
        self.dismiss(answer)

    def action_cancel(self) -> None:
        self.dismiss(None)
