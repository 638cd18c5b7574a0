"""The console's backend for a router running elsewhere: ``gpurouter console --attach URL``.

:func:`attach` asks the admin API for the fleet, its state and its audit trail, so a wrong
URL or token is one clear error before the console draws. :class:`RemoteBackend` then polls
``GET /admin/state`` (and ``/admin/rollout``, ``/admin/split``) at the console's refresh
interval, follows ``GET /admin/events``, and sends commands with ``POST /admin/commands``
(a rollout's steps to ``/admin/rollout``, a split's to ``/admin/split``). Between polls the
console reads the last state received; while the router does not answer,
:class:`~console.attach.link.Link` says so and the poller asks again after a growing wait, so
a router that goes away never stops the console, and one that comes back is picked up. With
``--broker`` a :class:`~console.cluster.watch.ClusterWatch` runs beside it, and the GPUs'
telemetry comes from the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from console.attach.admin_http import AsyncAdmin
from console.attach.events import EventCursor, follow_events
from console.attach.link import Backoff, Link
from console.attach.rebuild import rebuild
from console.attach.state import RemoteState, fleet_from_json, state_from_json
from console.backend import GpuKey, samples_from
from console.ctl.client import TOKEN_ENV
from console.ctl.errors import UnreachableError
from console.rollout.model import (
    RolloutPreview,
    RolloutProgress,
    preview_from_json,
    progress_from_json,
)
from console.rollout.split_model import SplitState, split_from_json
from router.config.schema import FleetConfig
from router.control import Command, Event, command_args, command_name
from router.errors import GpuRouterError
from router.in_flight import InFlight
from router.snapshot import FleetSnapshot
from router.strategies import Explanation
from router.telemetry.schema import GpuSample
from router.telemetry.status import EngineMetricsStatus, TelemetryStatus

if TYPE_CHECKING:
    from console.cluster.watch import ClusterWatch

__all__ = ["NO_TOKEN", "RemoteBackend", "attach"]

NO_TOKEN = f"read-only: attached without an admin token; set {TOKEN_ENV} to steer"
AUDIT_KEPT = 1000
"""Events kept for the console (it shows the newest 20 at start)."""
DECISIONS_ASKED = 20
"""Newest routing decisions fetched while a replica's detail is open: that replica's, as many
as the detail shows (200 of every replica's were 300 KB of JSON a poll, decoded beside the
frame: the demo's slowest key, a detail at 158 ms)."""
DECISIONS_WANTED_POLLS = 2.0
"""Decisions are fetched while asked for within this many poll intervals: an open detail
asks at each refresh, and so does the dashboard for its selected row's replica; when neither
asks (a dialog open over the dashboard, the console paused) they are not fetched."""

Sleep = Callable[[float], Awaitable[None]]
T = TypeVar("T")
ROLLOUT = "/admin/rollout"
SPLIT = "/admin/split"


class RemoteBackend:
    """A router elsewhere, read through its admin API."""

    def __init__(
        self,
        admin: AsyncAdmin,
        fleet: FleetConfig,
        first: RemoteState,
        backlog: list[Event],
        *,
        read_only: bool,
        run: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        interval: Callable[[], float] = lambda: 1.0,
        cluster: ClusterWatch | None = None,
    ) -> None:
        self.admin = admin
        self.fleet = fleet
        self.refusal: str | None = NO_TOKEN if read_only else None
        self.clock = clock
        self.link = Link(admin.base_url, clock, backoff)
        self.front_url: str | None = None  # the admin API does not say where its front door is
        self.admin_url: str | None = admin.base_url
        self.notes = [f"attached to {admin.base_url}"] + ([NO_TOKEN] if read_only else [])
        self.interval = interval
        """Seconds between polls: the console sets its refresh interval here."""
        self.state = first
        self.cluster = cluster
        """The cluster's broker, when watched too: the GPUs' telemetry comes from it."""
        self.sleep = sleep
        self.backoff = backoff or Backoff()
        self._audit: deque[Event] = deque(backlog, maxlen=AUDIT_KEPT)
        self.cursor = EventCursor(max((e.seq for e in backlog), default=0), run)
        """Where the event stream resumes: after the last event, in the backlog's run."""
        self._listeners: list[Callable[[Event], None]] = []
        self._decisions: list[Explanation] = []
        self._decisions_for: str | None = None
        """The replica whose decisions the polls fetch (the detail open last)."""
        self._decisions_of: str | None = None
        """The replica whose decisions the latest poll fetched; None: that poll fetched none."""
        self._decisions_asked_at: float | None = None
        self._running_asked_at: float | None = None
        self._rollout: RolloutProgress | None = None
        self._rollouts_served = True
        """False once the router answered 404 to /admin/rollout: it is not asked again."""
        self._split: SplitState | None = None
        self._splits_served = True
        """False once the router answered 404 to /admin/split: it is not asked again."""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- what the console reads -----------------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        return self.state.snapshot

    def strategy(self) -> str:
        return self.state.snapshot.strategy

    def telemetry(self) -> TelemetryStatus:
        # The admin state carries the router's feed, if it has one; the broker carries every
        # node's, whatever the router runs.
        if self.cluster is not None:
            return self.cluster.telemetry()
        return self.state.telemetry

    def samples(self, status: TelemetryStatus) -> Mapping[GpuKey, GpuSample]:
        return samples_from(status)

    def failing(self) -> frozenset[str]:
        return self.state.failing

    def engine_metrics(self) -> EngineMetricsStatus:
        return self.state.engine_metrics

    def audit(self) -> list[Event]:
        return list(self._audit)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def decisions(self, replica_id: str, limit: int = 20) -> list[Explanation] | None:
        """As of the latest poll; asking makes the polls fetch them for as long as they are
        asked for, at once when they were not. None until a poll has fetched that replica's:
        an empty list would say that no decision chose it."""
        fresh = self._wants(self._decisions_asked_at, self.clock())
        if not fresh or replica_id != self._decisions_for:
            self._wake.set()  # a detail waits for them: fetched now, not at the next poll
        self.expect_detail(replica_id)
        if self._decisions_of != replica_id:
            return None
        # A router from before ``?replica=`` answers every replica's: filtered here too.
        out = [d for d in reversed(self._decisions) if d.chosen == replica_id]
        return out[:limit]

    def expect_detail(self, replica_id: str) -> None:
        """The polls fetch ``replica_id``'s decisions from now on, at their own pace (a cursor
        moving down the table wakes no poll): a detail opened on the selected row then draws
        them at once, where a fetch asked for on opening drew them up to 200 ms after the
        rest at the demo's load."""
        self._decisions_asked_at = self.clock()
        if replica_id != self._decisions_for:
            # What the polls fetched is another replica's: none of it is this one's answer.
            self._decisions_for, self._decisions, self._decisions_of = replica_id, [], None

    def in_flight(self, replica_id: str) -> list[InFlight]:
        """As of the latest poll; asking makes the polls fetch the requests running (a
        confirmation shows them, rebuilt at each refresh) for as long as they are asked for,
        at once when they were not."""
        now = self.clock()
        if not self._wants(self._running_asked_at, now):
            self._wake.set()
        self._running_asked_at = now
        return list(self.state.running.get(replica_id, ()))

    def rollout(self) -> RolloutProgress | None:
        """As of the latest poll (or the latest answer to a rollout command)."""
        return self._rollout

    def split(self) -> SplitState | None:
        """As of the latest poll (or the latest answer to a split action)."""
        return self._split

    # ---- what it sends ---------------------------------------------------------------------

    async def rollout_preview(self, version: str, settings: Mapping[str, Any]) -> RolloutPreview:
        body = {"action": "preview", "version": version, "settings": dict(settings)}
        answer = await self._rollout_post(body)
        return _read(preview_from_json, answer.get("preview"), "rollout preview")

    async def rollout_start(self, version: str, settings: Mapping[str, Any]) -> RolloutProgress:
        body = {"action": "start", "version": version, "settings": dict(settings)}
        return self._progress(await self._rollout_post(body))

    async def rollout_act(self, action: str) -> RolloutProgress:
        return self._progress(await self._rollout_post({"action": action}))

    async def split_act(self, body: Mapping[str, Any]) -> SplitState | None:
        if self.refusal is not None:
            raise GpuRouterError(self.refusal)  # the console refuses first; any other caller
        self._split = _split_state(await self.admin.post(SPLIT, body))
        return self._split

    async def _rollout_post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.refusal is not None:
            raise GpuRouterError(self.refusal)  # the console refuses first; any other caller
        return await self.admin.post(ROLLOUT, body)

    def _progress(self, answer: Mapping[str, Any]) -> RolloutProgress:
        progress = _read(progress_from_json, answer.get("rollout"), "rollout")
        self._rollout = progress
        return progress

    def apply(self, command: Command) -> Awaitable[Event]:
        return self._apply(command)

    async def _apply(self, command: Command) -> Event:
        if self.refusal is not None:
            # The console refuses before asking; this guards any other caller.
            raise GpuRouterError(self.refusal)
        body = {"command": command_name(command), **command_args(command)}
        answer = await self.admin.command(body)
        try:
            return rebuild(Event, answer)
        except ValueError as exc:
            raise UnreachableError(f"the router's answer is not an audit event: {exc}") from None

    # ---- running ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self.cluster is not None:
            await self.cluster.start()
        self._tasks = [
            asyncio.create_task(self.poll_forever(), name="attach-poll"),
            asyncio.create_task(
                follow_events(
                    self.admin.follow,
                    self.cursor,
                    self._receive,
                    sleep=self.sleep,
                    backoff=self.backoff,
                    restarted=self._restarted,
                ),
                name="attach-events",
            ),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.cluster is not None:
            await self.cluster.stop()
        await self.admin.aclose()

    async def poll(self) -> float:
        """Ask for the state (and the decisions, when wanted) once; the seconds until the next
        poll: the refresh interval, or the backoff while the router does not answer."""
        try:
            now = self.clock()
            self.state = await fetch_state(self.admin, self._wants(self._running_asked_at, now))
            if self._rollouts_served:
                await self._poll_rollout()
            if self._splits_served:
                await self._poll_split()
            wanted = self._wants(self._decisions_asked_at, self.clock())
            replica = self._decisions_for if wanted else None
            self._decisions = await fetch_decisions(self.admin, replica) if replica else []
            self._decisions_of = replica
        except GpuRouterError as exc:
            return self.link.failed(str(exc))
        self.link.answered()
        return self.interval()

    async def _poll_rollout(self) -> None:
        answer = await self.admin.get_if_served(ROLLOUT)
        if answer is None:
            self._rollouts_served = False
            return
        status = answer.get("rollout")
        self._rollout = None if status is None else _read(progress_from_json, status, "rollout")

    async def _poll_split(self) -> None:
        answer = await self.admin.get_if_served(SPLIT)
        if answer is None:
            self._splits_served = False
            return
        self._split = _split_state(answer)

    async def poll_forever(self) -> None:
        """Poll at the refresh interval, or after the backoff while the router is away."""
        while True:
            await self._pause(await self.poll())

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the console wants something fetched now."""
        self._wake.clear()
        sleeping = asyncio.ensure_future(self.sleep(seconds))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((sleeping, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            woken.cancel()

    def _wants(self, asked: float | None, now: float) -> bool:
        """Asked for recently: the decisions are JSON decoded at each poll, and the requests
        running at the demo's load 600-800 objects, rebuilt at each poll; their garbage made
        the console's collector passes the slowest thing a key waited for."""
        return asked is not None and now - asked <= DECISIONS_WANTED_POLLS * self.interval()

    def _restarted(self, run: str) -> None:
        """The trail kept is the old run's: its numbers would mix with the new ones."""
        self._audit.clear()
        self.link.restarted(run)

    def _receive(self, event: Event) -> None:
        self._audit.append(event)
        for listener in list(self._listeners):
            listener(event)


def _read(convert: Callable[[Any], T], data: object, what: str) -> T:
    """``convert(data)``; an UnreachableError when the admin API's answer is not one."""
    if not isinstance(data, Mapping):
        raise UnreachableError(f"the admin API's {what} is not a JSON object")
    try:
        return convert(data)
    except ValueError as exc:
        raise UnreachableError(f"the admin API's {what} is unreadable: {exc}") from None


def _split_state(answer: Mapping[str, Any]) -> SplitState | None:
    """``{"split": ...}``: the split's state, or None when there is none."""
    status = answer.get("split")
    return None if status is None else _read(split_from_json, status, "split")


async def fetch_state(admin: AsyncAdmin, running: bool = False) -> RemoteState:
    """The router's state; with each replica's requests running when ``running``."""
    data = await admin.get("/admin/state", {"running": 1} if running else {})
    try:
        # Off the loop: with hundreds of requests running, the rebuild takes milliseconds
        # that the console's keys would otherwise wait for (the thread yields the GIL).
        return await asyncio.to_thread(state_from_json, data)
    except ValueError as exc:
        raise UnreachableError(
            f"the admin API's state is not what the console expects: {exc}"
        ) from None


async def fetch_decisions(admin: AsyncAdmin, replica: str) -> list[Explanation]:
    """The newest routing decisions that chose ``replica``."""
    data = await admin.get("/admin/decisions", {"limit": DECISIONS_ASKED, "replica": replica})
    items = data.get("decisions")
    try:
        if not isinstance(items, list):
            raise ValueError("no list of decisions")
        return await asyncio.to_thread(_decisions_from, items)
    except ValueError as exc:
        raise UnreachableError(f"the admin API's decisions are unreadable: {exc}") from None


def _decisions_from(items: list[Any]) -> list[Explanation]:
    return [rebuild(Explanation, item) for item in items]


async def attach(
    url: str,
    *,
    token: str | None,
    actor: str,
    timeout_s: float = 10.0,
    **options: Any,
) -> RemoteBackend:
    """Connect to the admin API at ``url``: a :class:`~console.ctl.errors.CtlError` (with its
    exit code) when it cannot be reached, refuses the token, or is not a gpurouter admin API."""
    admin = AsyncAdmin(url, token=token, actor=actor, timeout_s=timeout_s)
    try:
        fleet_data = await admin.get("/admin/fleet")
        state = await fetch_state(admin)
        trail = await admin.get("/admin/events")
        events, run = trail.get("events"), trail.get("run")
        try:
            fleet = fleet_from_json(fleet_data)
            backlog = [rebuild(Event, e) for e in events] if isinstance(events, list) else []
        except ValueError as exc:
            raise UnreachableError(f"{admin.base_url}: unexpected answer: {exc}") from None
    except BaseException:
        await admin.aclose()
        raise
    run = run if isinstance(run, str) else None  # a router too old to name its run
    return RemoteBackend(admin, fleet, state, backlog, read_only=not token, run=run, **options)
