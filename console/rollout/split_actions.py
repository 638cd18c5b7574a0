"""The console's traffic-split actions (``g``): start a canary, follow it, set its share,
promote it or roll it back; switch the fleet file's blue-green set, switch it back, release it.

:class:`SplitActions` is a part of :class:`~console.app.ConsoleApp` in a module of its own (the
app is its subclass): each action goes through the backend (``split()`` and ``split_act()``,
in-process the router's own splits, attached ``/admin/split``), asks first with what it will
do, and is refused with the reason in a read-only console. A refusal from the router (a
canary already going, a step out of turn, a blue set not yet empty) is notified as it came.
"""

from __future__ import annotations

from typing import Any

from textual.app import App
from textual.signal import Signal

from console.backend import Backend
from console.rollout.canary_form import CanaryForm
from console.rollout.share_input import ShareScreen
from console.rollout.split_model import BlueGreenState, CanaryState, SplitState
from console.rollout.split_screen import SplitScreen
from console.screens.confirm import ConfirmScreen
from console.view.format import pct
from console.view.split import canary_request_lines, steering_lines
from console.widgets.tones import Styles
from router.errors import GpuRouterError
from router.snapshot import FleetSnapshot

__all__ = ["BLUE_GREEN_ACTIONS", "CANARY_ACTIONS", "SplitActions"]

CANARY_ACTIONS = {"step": "Set the share", "promote": "Promote", "abort": "Roll back"}
"""A canary's actions and their confirmations' titles (``abort`` is its roll back)."""
BLUE_GREEN_ACTIONS = {"switch": "Switch", "switch back": "Switch back", "release": "Release"}
DANGER = frozenset({"promote", "abort", "switch", "release"})
"""Actions that move every request of the model, or end what undoes them: confirmed in red."""


class SplitActions(App[None]):
    """The split's key and screens; what it needs of the app is declared here."""

    backend: Backend
    read_only: bool
    styles_now: Styles
    refreshed_signal: Signal[FleetSnapshot]

    def refresh_data(self, *, tick: bool = False) -> None:
        raise NotImplementedError  # the app's

    def split_key(self) -> None:
        """The split when there is one (a canary going or ended, a blue-green set), else a
        new canary's form: a watcher sees the split, only an operator who may steer gets
        the form."""
        if self.backend.split() is None and not self.read_only:
            self.ask_canary()
        else:
            self.show_split()

    def show_split(self) -> None:
        if any(isinstance(s, SplitScreen) for s in self.screen_stack):
            return  # open already (the form was opened from it)
        screen = SplitScreen(
            self.backend.split,
            self.steer_split,
            self.ask_canary,
            self.refreshed_signal,
            self.styles_now,
        )
        self.push_screen(screen)

    def ask_canary(self) -> None:
        """The form, then what it asks for to confirm, then the start."""
        if self._split_refused("canary"):
            return
        self.push_screen(CanaryForm(), self._canary_asked)

    def _canary_asked(self, body: dict[str, Any] | None) -> None:
        if body is None:
            return
        version = str(body["version"])

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._canary_start(body), group="split", exit_on_error=False)
            else:
                self.notify(f"canary of {version}: cancelled", severity="information")

        lines = canary_request_lines(body)
        dialog = ConfirmScreen(
            f"Start a canary of {version}?",
            lines,
            self.styles_now,
            confirm_label="Start",
            danger=False,
        )
        self.push_screen(dialog, answered)

    async def _canary_start(self, body: dict[str, Any]) -> None:
        try:
            state = await self.backend.split_act(body)
        except GpuRouterError as exc:
            self.notify(str(exc), title="refused", severity="error")
            return
        if isinstance(state, CanaryState):
            where = ", ".join(state.replicas)
            self.notify(f"{state.id}: {state.new} on {where} beside {state.old}", title="started")
        self.show_split()

    def steer_split(self, action: str) -> None:
        """Set a canary's share, promote it or roll it back; switch a blue-green set, switch
        it back or release it: each confirmed first."""
        title = CANARY_ACTIONS.get(action) or BLUE_GREEN_ACTIONS[action]
        if self._split_refused(title.lower()):
            return
        state = self.backend.split()
        kind = CanaryState if action in CANARY_ACTIONS else BlueGreenState
        if not isinstance(state, kind):
            what = "no canary" if kind is CanaryState else "no blue-green set"
            held = "" if state is None else f" ({state.id} holds the split)"
            self.notify(f"{what}{held}: {title.lower()} refused", severity="warning")
            return
        if action == "step":
            current = f"{pct(state.share)} to {state.new}"
            ask = ShareScreen(f"Share of {state.model} to {state.new}", current)
            self.push_screen(
                ask, lambda percent: self._split_confirm(state, action, title, percent)
            )
            return
        self._split_confirm(state, action, title, None)

    def _split_confirm(
        self, state: SplitState, action: str, title: str, percent: float | None
    ) -> None:
        if action == "step" and percent is None:
            return  # the share was not given
        body: dict[str, Any] = {"action": action}
        if percent is not None:
            body["percent"] = percent

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(
                    self._split_steered(body, title), group="split", exit_on_error=False
                )

        lines = steering_lines(state, action, percent)
        danger = action in DANGER
        dialog = ConfirmScreen(
            f"{title} {state.id}?", lines, self.styles_now, confirm_label=title, danger=danger
        )
        self.push_screen(dialog, answered)

    async def _split_steered(self, body: dict[str, Any], title: str) -> None:
        try:
            state = await self.backend.split_act(body)
        except GpuRouterError as exc:
            self.notify(str(exc), title="refused", severity="error")
            return
        if state is not None:
            self.notify(
                f"{state.id}: {state.phase}, {pct(state.share)} to {state.new}", title=title.lower()
            )
        self.refresh_data()

    def _split_refused(self, what: str) -> bool:
        if not self.read_only:
            return False
        why = self.backend.refusal or "read-only console"
        self.notify(f"{why}: {what} refused", severity="warning", title="refused")
        return True
