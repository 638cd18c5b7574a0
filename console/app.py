"""The gpurouter console: a live dashboard of the fleet and the operator's controls.

The app holds no router state. Each refresh (a fixed timer, default 1 s; one due just after
a key waits until the key's frames are out, ``KEY_FIRST_S``) takes one snapshot
through the :class:`~console.backend.ConsoleBackend`, turns it into view models (pure
functions in :mod:`console.view`) and hands them to the widgets, which redraw only what
changed. Every control goes through the backend to the router's control surface, which
validates it and writes the audit trail; the result comes back as a notification and, like
any other router event, as a :class:`~console.messages.RouterEventRecorded` message.

The router may run in this process or elsewhere (``--attach``): the app does not know which,
but for two things the backend tells it. A backend with a ``refusal`` sends nothing (the
console is read-only, and each command key says why); one with a ``link`` may lose its router,
which the header then says, with the events pane noting each loss and return, and each
restart of the router before the events it numbers from 1 again.
"""

from __future__ import annotations

import functools
import gc
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from textual import events
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Container
from textual.screen import Screen
from textual.signal import Signal
from textual.timer import Timer

from console.actions import ACTIONS, BY_ID, bindings, resolve_keys
from console.backend import Backend
from console.cluster.screen import ClusterScreen
from console.commands import ConsoleCommands
from console.ctl.rollout import STEERING
from console.messages import FilterClosed, RouterEventRecorded
from console.rollout.confirm import RolloutConfirm
from console.rollout.form import RolloutForm, RolloutRequest
from console.rollout.progress import RolloutScreen
from console.rollout.split_actions import SplitActions
from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen, where
from console.screens.replica_detail import DetailData, ReplicaDetail
from console.screens.strategy_picker import StrategyPicker
from console.screens.value_input import Answer, ValueScreen
from console.view.events import Watch, alerts, event_line, watch
from console.view.fleet import SORTS, CellCache, GpuRow, gpu_rows, select, table_rows
from console.view.format import Cell, Tone, number
from console.view.header import Modes, header_lines
from console.view.history import History
from console.view.impact import impact, impact_lines
from console.view.models import model_rows
from console.view.service import Service, service, up_by_model
from console.widgets.events_pane import EventsPane
from console.widgets.filter_input import FilterInput
from console.widgets.fleet_table import FleetTable
from console.widgets.header import DashboardHeader
from console.widgets.key_footer import KeyFooter
from console.widgets.model_summary import ModelSummary
from console.widgets.tones import Styles, styles_for
from router.control import (
    Command,
    Drain,
    Eject,
    Event,
    Preempt,
    Readmit,
    SetBatchSize,
    SetStrategy,
    SetWeight,
    Undrain,
)
from router.errors import ConfigError, GpuRouterError, Problem
from router.snapshot import FleetSnapshot
from router.telemetry.status import NO_ENGINE_METRICS, TelemetryStatus
from themes import CSS_PATHS, DEFAULT, THEMES

GC_THRESHOLDS = (20_000, 20, 10)
"""The garbage collector's thresholds while the console runs (Python's are 700, 10, 10).

Textual makes cyclic garbage as it draws (strips, and widgets built and dropped).
Collected every 700 allocations, much of it was still alive and moved to the
older generations, and at 512 GPUs the full passes that then freed it took 100-150 ms every
few seconds, stalling keys and, in the same loop, the router. Collected less often, it dies
young: a bench_console.py run at 160x48, watched with ``gc.callbacks``, had one full pass
(11 ms) where it had eleven."""

KEY_FIRST_S = 0.15
"""A refresh waits until this long after the last key.

A key's frames (a screen opened, a row moved) take 10-50 ms under the demo's load; a refresh
landing in them (about 15 ms of the console's CPU, then a frame of its own) kept the screen
changing for another 25-50 ms after the key's effect was drawn: the tail of the demo's
key-to-screen latency (docs/benchmarks.md)."""

KEY_FIRST_MAX_S = 0.5
"""The longest a refresh waits for keys: keys that keep coming (a held arrow key) never hold
the screen's figures back longer than this."""

_HELP = "help"
"""The installed help screen's name."""
_PICKER = "strategy-picker"
"""The installed strategy picker's name."""
_DETAIL = "replica-detail"
"""The installed replica detail's name."""
_CONFIRM = "confirm"
"""The installed confirmation dialog's name."""
_ROLLOUT_FORM = "rollout-form"
"""The installed rollout form's name."""
_ROLLOUT_CONFIRM = "rollout-confirm"
"""The installed rollout confirmation's name."""
_ROLLOUT = "rollout-progress"
"""The installed rollout progress screen's name."""
_KEPT = (_HELP, _PICKER, _DETAIL, _CONFIRM, _ROLLOUT_FORM, _ROLLOUT_CONFIRM, _ROLLOUT)
"""Screens built on first use and kept: composing and styling one anew on each press was
most of the time from its key to the screen (see :meth:`ConsoleApp._kept`)."""

S = TypeVar("S", bound=Screen[Any])

REFRESH_STEPS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
WIDE_AT = 200
"""Columns from which the summary and events move to a side column."""


class ConsoleApp(SplitActions):
    TITLE = "gpurouter"
    CSS_PATH: ClassVar[Any] = [str(p) for p in CSS_PATHS]
    BINDINGS: ClassVar[list[BindingType]] = list(bindings({a.id: a.key for a in ACTIONS}))
    COMMANDS: ClassVar[Any] = {ConsoleCommands}
    # The palette also has its own registry action (":"); Ctrl+P stays as Textual's default.

    def __init__(
        self,
        backend: Backend,
        *,
        theme: str | None = None,
        read_only: bool = False,
        refresh_s: float | None = None,
        auto_refresh: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config = backend.fleet.console
        source = backend.fleet.source
        self.keys = resolve_keys(config.keys, source)
        chosen = theme or config.theme or DEFAULT
        if chosen not in THEMES:
            known = ", ".join(THEMES)
            raise ConfigError(
                [
                    Problem(
                        str(source or "fleet"),
                        None,
                        "console.theme",
                        f"no theme {chosen!r}; known: {known}",
                    )
                ]
            )
        super().__init__()
        self.backend = backend
        self.fleet = backend.fleet
        self.read_only = read_only or backend.refusal is not None
        self.refresh_s = refresh_s or config.refresh_s
        self.live = auto_refresh
        """Refresh on a timer; tests and screenshots turn it off and call refresh_data()."""
        self.paused = False
        self.history = History()
        self.sort_mode = SORTS[0]
        self.filter_text = ""
        self.refreshed_signal: Signal[FleetSnapshot] = Signal(self, "refreshed")
        self.last_snapshot: FleetSnapshot | None = None
        self.last_status: TelemetryStatus | None = None
        self.last_rows: list[GpuRow] = []
        self.last_service = Service(0, frozenset(), ())
        self.last_engines = NO_ENGINE_METRICS
        self._watch: Watch | None = None
        self._cells: CellCache = {}
        self._timer: Timer | None = None
        self._clock = clock
        self._key_at = -math.inf
        """When the last key reached the app (``clock`` seconds)."""
        self._unsubscribe: Callable[[], None] | None = None
        self._gc_before = gc.get_threshold()
        self._frozen = False
        for t in THEMES.values():
            self.register_theme(t)
        self.theme = chosen
        self.styles_now: Styles = styles_for(THEMES[chosen])
        self.set_keymap({k: v for k, v in self.keys.items() if v != BY_ID[k].key})

    # ---- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield DashboardHeader()
        with Container(id="body"):
            yield FleetTable()
            with Container(id="side"):
                yield ModelSummary()
                yield EventsPane()
        yield FilterInput(on_change=self.filter_rows)
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self._gc_before = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)  # put back on unmount
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self._apply_theme_class(self.theme)
        self._unsubscribe = self.backend.subscribe(self._on_router_event)
        for event in self.backend.audit()[-20:]:
            self.query_one(EventsPane).add(event_line(event), self.styles_now)
        for note in self.backend.notes:
            self.query_one(EventsPane).add((("note: " + note, Tone.ACCENT),), self.styles_now)
        self._layout(self.size.width)
        self.query_one(FleetTable).focus()
        self.refresh_data(tick=True)
        if self.live:
            self._timer = self.set_interval(self.refresh_s, self._tick, name="console-refresh")
        self.call_after_refresh(self._prepare_kept, list(_KEPT))

    def on_unmount(self) -> None:
        gc.set_threshold(*self._gc_before)
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def on_resize(self) -> None:
        self._layout(self.size.width)

    def _layout(self, width: int) -> None:
        self.query_one("#body").set_class(width >= WIDE_AT, "-wide")

    # ---- data ------------------------------------------------------------------------------

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:
            self._key_at = self._clock()
        await super().on_event(event)

    def _tick(self) -> None:
        self._refresh_when_keys_allow(self._clock())

    def _refresh_when_keys_allow(self, due: float) -> None:
        now = self._clock()
        wait = KEY_FIRST_S - (now - self._key_at)
        if wait > 0 and now + wait - due <= KEY_FIRST_MAX_S:
            retry = functools.partial(self._refresh_when_keys_allow, due)
            self.set_timer(wait, retry, name="console-deferred")
        else:
            self._refresh_tick()

    def _refresh_tick(self) -> None:
        # Not while the app shuts down: it takes the screens down before its own timers, and
        # a tick between the two found the dashboard's widgets gone (NoMatches on quit).
        if not self.paused and self.is_running:
            self.refresh_data(tick=True)
            self._expect_detail()
            # The survivors of the young passes are collected a second's worth each time,
            # right after the frame (not before it, where a key landing on the tick waited
            # for it too), instead of all at once whenever a key lands on the collector's own
            # middle pass.
            self.call_after_refresh(gc.collect, 1)

    def _expect_detail(self) -> None:
        """On the dashboard, the selected row's detail is the one ``i`` would open."""
        replica = self.selected_replica() if len(self.screen_stack) == 1 else None
        if replica is not None:
            self.backend.expect_detail(replica)

    def refresh_data(self, *, tick: bool = False) -> None:
        """One snapshot -> view models -> widgets. ``tick`` also records history."""
        snap = self.backend.snapshot()
        status = self.backend.telemetry()
        rows = gpu_rows(
            self.fleet, snap, status, self.backend.samples(status), failing=self.backend.failing()
        )
        if tick:
            self.history.add_gpus({r.key: r.util for r in rows})
            for r in snap.replicas:
                self.history.add_replica(
                    r.id, r.ttft_p50_s, r.ttft_p99_s, r.e2e_p50_s, r.throughput_rps
                )
        self.last_snapshot, self.last_status, self.last_rows = snap, status, rows
        self.last_service = service(rows)
        self.last_engines = self.backend.engine_metrics()
        self._note_link()
        self._draw()
        now = watch(snap, status, self.last_service, self._watch, self.last_engines)
        for text, tone in alerts(self._watch, now):
            self.query_one(EventsPane).add((("alert ", Tone.DIM), (text, tone)), self.styles_now)
        self._watch = now
        self.refreshed_signal.publish(snap)

    def _draw(self, force: bool = False) -> None:
        snap, status = self.last_snapshot, self.last_status
        if snap is None or status is None:
            return
        link = self.backend.link
        modes = Modes(
            read_only=self.read_only,
            paused=self.paused,
            refresh_s=self.refresh_s,
            link=None if link is None else link.line(),
        )
        self.query_one(DashboardHeader).show(
            header_lines(snap, status, modes, self.last_service, self.last_engines),
            self.styles_now,
            force,
        )
        feeds = {f.node: f for f in status.nodes}
        shown = select(self.last_rows, self.sort_mode, self.filter_text)
        table = self.query_one(FleetTable)
        table.show(
            table_rows(shown, self.sort_mode, self.history.gpu_points, feeds, self._cells),
            self.styles_now,
            force,
        )
        filtered = f"filter “{self.filter_text}”  " if self.filter_text else ""
        table.border_title = (
            f"Fleet: {len(shown)}/{len(self.last_rows)} GPUs  {filtered}sort {self.sort_mode}"
        )
        # Where to send requests stays in sight: the events pane's note of it scrolls away.
        table.border_subtitle = where(self.backend.front_url, self.backend.admin_url)
        up = up_by_model(snap, self.last_service)
        self.query_one(ModelSummary).show(model_rows(snap.by_gpu_model, up), self.styles_now, force)

    def _note_link(self) -> None:
        """A router elsewhere lost, back or restarted: once each in the events pane and as a
        notification."""
        link = self.backend.link
        if link is None:
            return
        while (change := link.changed()) is not None:
            tone = Tone.OK if link.up else Tone.BAD
            self.query_one(EventsPane).add((("link ", Tone.DIM), (change, tone)), self.styles_now)
            self.notify(change, severity="information" if link.up else "error")

    # ---- router events (past tense) --------------------------------------------------------

    def _on_router_event(self, event: Event) -> None:
        self.post_message(RouterEventRecorded(event))

    def on_router_event_recorded(self, message: RouterEventRecorded) -> None:
        self._note_link()  # a restart of the router is told before its new run's events
        self.query_one(EventsPane).add(event_line(message.event), self.styles_now)

    # ---- selection -------------------------------------------------------------------------

    def selected_replica(self) -> str | None:
        return self.query_one(FleetTable).selected_replica()

    def replica_ids(self) -> list[str]:
        return [r.id for r in self.backend.fleet.replicas]

    def select_replica(self, replica: str) -> bool:
        """Put the cursor on the replica's first GPU row; False if it is not shown."""
        table = self.query_one(FleetTable)
        for slot, row in enumerate(table.rows_shown):
            if row.replica == replica:
                table.select_row(slot)
                return True
        return False

    def on_fleet_table_chosen(self, event: FleetTable.Chosen) -> None:
        if event.replica is not None:
            self.perform("detail", event.replica)

    # ---- actions ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run_registered" and parameters:
            spec = BY_ID.get(str(parameters[0]))
            if spec is not None and spec.broker and self.backend.cluster is None:
                return False  # this console watches no broker: the key is not its

            # Attached without a token the keys stay live: each says why it sends nothing.
            if spec is not None and self.read_only and spec.mutates and not self.backend.refusal:
                return None  # shown greyed, key disabled
        return True

    def action_run_registered(self, action_id: str) -> None:
        self.perform(action_id)

    def perform(self, action_id: str, replica: str | None = None) -> None:
        """Run a registry action, on ``replica`` or the selected one where it targets one."""
        spec = BY_ID[action_id]
        if spec.mutates and self.read_only:
            why = self.backend.refusal or "read-only console"
            self.notify(f"{why}: {spec.title.lower()} refused", severity="warning", title="refused")
            return
        if spec.target:
            replica = replica or self.selected_replica()
            if replica is None:
                self.notify("select a replica's row first", severity="warning")
                return
            self._targeted(action_id, replica)
            return
        handlers: dict[str, Callable[[], None]] = {
            "help": self._help,
            "palette": self.action_command_palette,
            "strategy": self._pick_strategy,
            "cluster": self._show_cluster,
            "rollout": self._rollout_key,
            "split": self.split_key,
            "filter": self._open_filter,
            "sort": self._cycle_sort,
            "theme": self._cycle_theme,
            "pause": self._toggle_pause,
            "faster": lambda: self._step_refresh(-1),
            "slower": lambda: self._step_refresh(+1),
            "quit": self.exit,
        }
        handlers[action_id]()

    def _targeted(self, action_id: str, replica: str) -> None:
        if action_id == "detail":
            data = partial_detail(self, replica)
            detail = self._kept(_DETAIL, ReplicaDetail)
            detail.show(replica, data)
            self._open(detail, _DETAIL)
        elif action_id in ("weight", "batch"):
            self._ask_value(action_id, replica)
        else:
            commands: dict[str, Command] = {
                "drain": Drain(replica),
                "undrain": Undrain(replica),
                "preempt": Preempt(replica),
                "eject": Eject(replica),
                "readmit": Readmit(replica),
            }
            self._confirm_then_apply(action_id, replica, commands[action_id])

    def _show_cluster(self) -> None:
        cluster = self.backend.cluster
        if cluster is None:  # the palette and the key offer it only where there is one
            return
        hint = "Esc or c closes · commands go through the attached router"
        self.push_screen(
            ClusterScreen(cluster, refresh_s=self.refresh_s, hint=hint, live=self.live)
        )

    def _kept(self, name: str, kind: type[S]) -> S:
        """The screen installed as ``name``, built on first use; a new one, not installed,
        while the kept one is already open (a key on it that opens another)."""
        if not self.is_screen_installed(name):
            self.install_screen(self._builders()[name](), name)
        screen = self.get_screen(name)
        if screen in self.screen_stack:
            screen = self._builders()[name]()
        assert isinstance(screen, kind)
        return screen

    def _builders(self) -> dict[str, Callable[[], Screen[Any]]]:
        """A new screen of each kind kept; each open then shows what it is for."""
        first = next(iter(self.replica_ids()), "")
        return {
            _HELP: lambda: HelpScreen(
                self.keys,
                self.styles_now,
                read_only=self.read_only,
                front_url=self.backend.front_url,
                admin_url=self.backend.admin_url,
                broker=self.backend.cluster is not None,
            ),
            _PICKER: lambda: StrategyPicker(self.backend.strategy()),
            _DETAIL: lambda: ReplicaDetail(
                first, partial_detail(self, first), self.styles_now, self.refreshed_signal
            ),
            _CONFIRM: lambda: ConfirmScreen(
                "", (), self.styles_now, confirm_label="", danger=False
            ),
            _ROLLOUT_FORM: RolloutForm,
            _ROLLOUT_CONFIRM: lambda: RolloutConfirm(self.styles_now),
            _ROLLOUT: lambda: RolloutScreen(
                self.backend.rollout,
                self.steer_rollout,
                self.ask_rollout,
                self.refreshed_signal,
                self.styles_now,
            ),
        }

    def _prepare_kept(self, names: list[str]) -> None:
        """Build the kept screens before their first key, one per idle moment after the
        dashboard is drawn: the first ``i`` at the demo's default load took 150 ms (compose,
        styles, and the stylesheet taking in the new widgets' CSS), every later one 25 ms."""
        if not self.is_running or self.return_code is not None:
            return  # the app is leaving: its screens would mount nothing
        if not names:
            self._freeze()
            return
        name, *rest = names
        if not self.is_screen_installed(name):
            screen = self._builders()[name]()
            self.install_screen(screen, name)
            # Textual composes an installed screen on its first push; registering it is what
            # that push does first (Textual 8, pinned), so it is composed and styled now.
            self._register(self, screen)
        self.call_after_refresh(self._prepare_kept, rest)

    def _freeze(self) -> None:
        """Leave what the console holds once built out of the collector's full passes.

        The modules, widgets and kept screens live as long as the console, and a full pass
        walked them all: 85-145 ms at the demo's default load (about one in each run of
        bench/bench_demo_keys.py), the slowest thing a key then waited for; 40-80 ms since.
        What is built later is collected as before; ``on_unmount`` hands the frozen objects
        back to the collector."""
        gc.collect()
        gc.freeze()
        self._frozen = True

    def _open(
        self, screen: Screen[Any], name: str, callback: Callable[[Any], None] | None = None
    ) -> None:
        """Push ``screen``: by its installed name when it is the kept one."""
        kept = self.is_screen_installed(name) and self.get_screen(name) is screen
        self.push_screen(name if kept else screen, callback)

    def _help(self) -> None:
        self._open(self._kept(_HELP, HelpScreen), _HELP)

    def _pick_strategy(self) -> None:
        # The backend's, not the last drawn snapshot's: with the refresh paused that one names
        # a strategy switched since.
        current = self.backend.strategy()

        def chosen(name: str | None) -> None:
            if name is not None and name != current:
                self.switch_strategy(name)

        picker = self._kept(_PICKER, StrategyPicker)
        picker.show(current)
        self._open(picker, _PICKER, chosen)

    # ---- model rollouts (console/rollout/) -------------------------------------------------

    def _rollout_key(self) -> None:
        """The rollout's progress when there is one (going or ended), else a new one's form:
        a watcher sees the progress, only an operator who may steer gets the form."""
        if self.backend.rollout() is None and not self.read_only:
            self.ask_rollout()
        else:
            self._show_rollout()

    def ask_rollout(self) -> None:
        """The form, then the plan the router would run, then (confirmed) the start."""
        if self.read_only:
            why = self.backend.refusal or "read-only console"
            self.notify(f"{why}: rollout refused", severity="warning", title="refused")
            return
        form = self._kept(_ROLLOUT_FORM, RolloutForm)
        form.reset()
        self._open(form, _ROLLOUT_FORM, self._rollout_asked)

    def _rollout_asked(self, request: RolloutRequest | None) -> None:
        if request is not None:
            self.run_worker(self._preview(request), group="rollout", exit_on_error=False)

    async def _preview(self, request: RolloutRequest) -> None:
        try:
            preview = await self.backend.rollout_preview(request.version, request.settings)
            refusal = None
        except GpuRouterError as exc:  # the planner's refusal, shown in place of the plan
            preview, refusal = None, str(exc)
        dialog = self._kept(_ROLLOUT_CONFIRM, RolloutConfirm)
        dialog.show(request.version, preview, refusal, self.styles_now)

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._start_rollout(request), group="rollout", exit_on_error=False)
            else:
                self.notify(f"rollout of {request.version}: cancelled", severity="information")

        self._open(dialog, _ROLLOUT_CONFIRM, answered)

    async def _start_rollout(self, request: RolloutRequest) -> None:
        try:
            progress = await self.backend.rollout_start(request.version, request.settings)
        except GpuRouterError as exc:
            self.notify(str(exc), title="refused", severity="error")
            return
        waves = len(progress.waves)
        self.notify(f"{progress.id}: {progress.version} in {waves} waves", title="started")
        self._show_rollout()

    def _show_rollout(self) -> None:
        if self.is_screen_installed(_ROLLOUT) and self.get_screen(_ROLLOUT) in self.screen_stack:
            return  # open already (the form was opened from it)
        self._open(self._kept(_ROLLOUT, RolloutScreen), _ROLLOUT)

    def steer_rollout(self, action: str) -> None:
        """Pause, resume, abort or roll back the rollout, once confirmed."""
        title = "Roll back" if action == "rollback" else action.capitalize()
        if self.read_only:
            why = self.backend.refusal or "read-only console"
            self.notify(f"{why}: {title.lower()} refused", severity="warning", title="refused")
            return
        progress = self.backend.rollout()
        if progress is None:
            self.notify("there is no rollout", severity="warning")
            return
        lines: list[tuple[Cell, ...]] = [
            ((f"{progress.id}: {progress.version} is {progress.phase}.", Tone.NORMAL),),
            ((f"{title}: {STEERING[action]}.", Tone.NORMAL),),
        ]

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._steered(action), group="rollout", exit_on_error=False)

        dialog = self._kept(_CONFIRM, ConfirmScreen)
        danger = action in ("abort", "rollback")
        dialog.show(
            f"{title} {progress.id}?", lines, self.styles_now, confirm_label=title, danger=danger
        )
        self._open(dialog, _CONFIRM, answered)

    async def _steered(self, action: str) -> None:
        try:
            progress = await self.backend.rollout_act(action)
        except GpuRouterError as exc:
            self.notify(str(exc), title="refused", severity="error")
            return
        self.notify(f"{progress.id}: {progress.phase}", title=action)
        self.refresh_data()

    def switch_strategy(self, name: str) -> None:
        if self.read_only:
            self.perform("strategy")  # refuses, visibly
            return
        self.apply(SetStrategy(name))

    def _ask_value(self, action_id: str, replica: str) -> None:
        r = self._replica_snapshot(replica)
        if r is None:
            self.notify(f"no replica {replica!r}", severity="error")
            return
        if action_id == "weight":
            pinned = ", pinned" if r.weight_pinned else ""
            now = f"{number(r.weight)} (static {number(r.static_weight)}{pinned})"
            title, integer, released = f"Weight of {replica}", False, number(r.static_weight)
        else:
            now = f"{r.batch_size}{' (pinned)' if r.batch_pinned else ''}, {r.in_flight} in flight"
            title, integer, released = f"Batch size of {replica}", True, "the configured size"

        def answered(answer: Answer | None) -> None:
            if answer is None:
                return
            command: Command
            if action_id == "weight":
                command = SetWeight(replica, None if answer.value is None else float(answer.value))
            else:
                command = SetBatchSize(replica, None if answer.value is None else int(answer.value))
            self._confirm_then_apply(action_id, replica, command)

        self.push_screen(ValueScreen(title, now, integer=integer, released=released), answered)

    def _confirm_then_apply(self, action_id: str, replica: str, command: Command) -> None:
        """Destructive actions confirm with their impact; any action on stale data warns."""
        spec = BY_ID[action_id]
        if self._replica_snapshot(replica) is None or not (
            spec.confirm or self.replica_is_stale(replica)
        ):
            self.apply(command)
            return
        title = f"{spec.title} {replica}?"

        def body() -> list[tuple[Cell, ...]]:
            return self._impact_lines(action_id, replica)

        def answered(yes: bool | None) -> None:
            if yes:
                self.apply(command)
            else:
                self.notify(f"{spec.title.lower()} {replica}: cancelled", severity="information")

        lines, danger, follow = body(), spec.confirm, (self.refreshed_signal, body)
        dialog = self._kept(_CONFIRM, ConfirmScreen)
        dialog.show(
            title, lines, self.styles_now, confirm_label=spec.title, danger=danger, follow=follow
        )
        self._open(dialog, _CONFIRM, answered)

    def _impact_lines(self, action_id: str, replica: str) -> list[tuple[Cell, ...]]:
        """What the action would do now (the confirmation's body, rebuilt at each refresh)."""
        spec = BY_ID[action_id]
        target = self._replica_snapshot(replica)
        if target is None:
            return [((f"no replica {replica!r}", Tone.BAD),)]
        snap = self.last_snapshot or self.backend.snapshot()
        running = self.backend.in_flight(replica)
        stale = self.replica_is_stale(replica)
        lines = impact_lines(impact(action_id, target, snap.replicas, running, stale=stale))
        if not spec.confirm:
            lines.append(((f"Apply {spec.title.lower()} anyway?", Tone.NORMAL),))
        return lines

    def apply(self, command: Command) -> None:
        """Through the control surface; the result is notified and the view redrawn.

        In-process the event is there at once; a router elsewhere answers later, in a worker,
        so the keys stay live while it does."""
        outcome = self.backend.apply(command)
        if inspect.isawaitable(outcome):
            self.run_worker(self._applied_later(outcome), group="commands", exit_on_error=False)
        else:
            self._applied(outcome)

    async def _applied_later(self, outcome: Awaitable[Event]) -> None:
        try:
            event = await outcome
        except GpuRouterError as exc:
            self.notify(str(exc), title="not sent", severity="error")
            return
        self._applied(event)

    def _applied(self, event: Event) -> None:
        if event.ok:
            self.notify(event.message, title="done", severity="information")
        else:
            self.notify(event.message, title="refused", severity="error")
        self.refresh_data()

    def _replica_snapshot(self, replica: str) -> Any:
        snap = self.last_snapshot or self.backend.snapshot()
        return next((r for r in snap.replicas if r.id == replica), None)

    def replica_is_stale(self, replica: str) -> bool:
        rows = [r for r in self.last_rows if r.replica == replica]
        return any(r.stale for r in rows)

    # ---- view controls ---------------------------------------------------------------------

    def _open_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.add_class("-shown")
        self.add_class("-filtering")  # toasts move up, off the box
        # Focus set now (``focus()`` defers it): the box, the table's dimmed cursor and the
        # footer's keys reach the screen together.
        self.screen.set_focus(box)

    def filter_rows(self, text: str) -> None:
        """Show only the rows that match ``text`` (every word, anywhere in the row)."""
        text = text.strip()
        if text != self.filter_text:
            self.filter_text = text
            self._draw()

    def on_filter_closed(self, message: FilterClosed) -> None:
        box, table = self.query_one(FilterInput), self.query_one(FleetTable)
        # One batch, focus set now rather than deferred: the rows coming back, the box closing
        # and the footer's keys reach the screen in one frame, where a message each took a
        # frame each.
        with self.batch_update():
            if message.clear:
                box.value = ""  # the rows come back through filter_rows
            box.remove_class("-shown")
            self.remove_class("-filtering")
            self.screen.set_focus(table)

    def _cycle_sort(self) -> None:
        self.sort_mode = SORTS[(SORTS.index(self.sort_mode) + 1) % len(SORTS)]
        self._draw()

    def _cycle_theme(self) -> None:
        names = list(THEMES)
        current = names.index(self.theme) if self.theme in names else -1
        self.set_theme(names[(current + 1) % len(names)])

    def set_theme(self, name: str) -> None:
        self.theme = name

    def _on_theme_changed(self, theme: Any) -> None:
        self.styles_now = styles_for(theme)
        for name in _KEPT:
            if not self.is_screen_installed(name):
                continue
            screen = self.get_screen(name)
            if screen not in self.screen_stack:
                # Drawn in the old theme's tones: built anew. Uninstalled, it would still run.
                self.uninstall_screen(name)
                screen.remove()
            elif isinstance(screen, ReplicaDetail | RolloutScreen):
                screen.restyle(self.styles_now)  # on show (or under a dialog): kept, redrawn
        self._apply_theme_class(theme.name)
        self._draw(force=True)
        self.call_after_refresh(self._prepare_kept, list(_KEPT))

    def _apply_theme_class(self, name: str) -> None:
        self.set_class(name == "high-contrast", "-high-contrast")

    def _toggle_pause(self) -> None:
        self.paused = not self.paused
        self._draw()

    def _step_refresh(self, step: int) -> None:
        nearest = min(
            range(len(REFRESH_STEPS)), key=lambda i: abs(REFRESH_STEPS[i] - self.refresh_s)
        )
        index = max(0, min(len(REFRESH_STEPS) - 1, nearest + step))
        self.set_refresh(REFRESH_STEPS[index])

    def set_refresh(self, seconds: float) -> None:
        """Change the refresh interval at run time."""
        self.refresh_s = seconds
        if self._timer is not None:
            self._timer.stop()
            self._timer = self.set_interval(seconds, self._tick, name="console-refresh")
        self._draw()


def partial_detail(app: ConsoleApp, replica: str) -> Callable[[], DetailData]:
    def data() -> DetailData:
        snap = app.last_snapshot or app.backend.snapshot()
        return DetailData(
            replica=next((r for r in snap.replicas if r.id == replica), None),
            history=app.history.replica.get(replica),
            decisions=app.backend.decisions(replica),
            now=snap.time,
        )

    return data
