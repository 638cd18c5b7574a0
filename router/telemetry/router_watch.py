"""The cluster's routers as their messages on the broker show them: stats, acks, events.

:class:`RouterWatch` subscribes to ``routers/+/stats`` (each router's queue and replicas,
every second), ``control/acks/+`` (what each router did with each desired-state command) and
``events`` (every router's audit trail) of one cluster, and keeps, per router, its latest
stats, when they arrived (on the watcher's own clock: a router with a wrong clock cannot
look fresh), and the commands it applied or refused, and the cluster's latest events. It
publishes nothing and steers nothing: ``gpurouter console --broker`` reads it.

A payload that is not a router's stats or acknowledgement is dropped and counted by reason
(:data:`DROP_REASONS`), never raised; a stats message whose ``router`` is not its topic's is
dropped too (one router cannot speak for another).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiomqtt

from router.clock import Clock
from router.control import Event
from router.telemetry.connection import (
    Backoff,
    BrokerTarget,
    cancel_and_wait,
    make_client,
    stay_connected,
    subscribe,
)
from router.telemetry.control_messages import Ack, decode_ack
from router.telemetry.router_events import decode_event
from router.telemetry.router_stats import RouterStats, decode_stats
from router.telemetry.schema import PayloadError
from router.telemetry.status import BrokerState
from router.telemetry.topics import Topics

__all__ = ["DROP_REASONS", "RouterFeed", "RouterWatch", "RoutersStatus"]

log = logging.getLogger(__name__)

STALE_AFTER_S = 3.0
"""A router publishes its stats every second: none for 3 s and it is shown stale."""
MAX_ROUTERS = 1024
"""Routers watched at most: junk router ids cannot grow the watcher without end."""
ACKS_KEPT = 8
"""Latest acknowledgements kept per router."""
EVENTS_KEPT = 100
"""Latest events kept, of every router together."""
DROP_REASONS = (
    "malformed_stats",
    "malformed_ack",
    "malformed_event",
    "wrong_router",
    "too_many_routers",
)
"""Why a message was dropped (``RoutersStatus.drop_reasons``)."""


@dataclass(frozen=True, slots=True)
class RouterFeed:
    """One router of the cluster, as its messages showed it."""

    router: str
    stats: RouterStats | None
    """Its latest stats; None while only its acknowledgements were heard."""
    age_s: float | None
    """Seconds since its latest stats arrived; None if none did."""
    stale: bool
    """No stats for more than :data:`STALE_AFTER_S`: gone, or cut off from the broker."""
    applied: int
    """Commands it acknowledged as applied."""
    refused: int
    """Commands it acknowledged as refused."""
    acks: tuple[Ack, ...] = ()
    """Its latest acknowledgements, newest last."""


@dataclass(frozen=True, slots=True)
class RoutersStatus:
    """Every router heard from, and what was dropped."""

    broker: BrokerState
    broker_url: str | None
    routers: tuple[RouterFeed, ...] = ()
    events: tuple[tuple[str, Event], ...] = ()
    """The latest audit events of every router (its id and the event), oldest first."""
    drop_reasons: Mapping[str, int] = field(default_factory=dict)
    last_error: str | None = None
    """Why the latest dropped message was dropped."""

    @property
    def dropped(self) -> int:
        return sum(self.drop_reasons.values())


@dataclass(slots=True)
class _Router:
    name: str
    stats: RouterStats | None = None
    received_at: float | None = None
    applied: int = 0
    refused: int = 0
    acks: deque[Ack] = field(default_factory=lambda: deque(maxlen=ACKS_KEPT))


class RouterWatch:
    """Follows the routers of ``cluster`` on the broker at ``target``."""

    def __init__(
        self,
        target: BrokerTarget,
        cluster: str,
        *,
        clock: Clock,
        backoff: Backoff | None = None,
    ) -> None:
        self.target = target
        self.topics = Topics(cluster)
        self.clock = clock
        self.backoff = backoff or Backoff(base_s=0.2, cap_s=10.0)
        self._routers: dict[str, _Router] = {}
        self._events: deque[tuple[str, Event]] = deque(maxlen=EVENTS_KEPT)
        self._drops = dict.fromkeys(DROP_REASONS, 0)
        self._last_error: str | None = None
        self._state = BrokerState.CONNECTING
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background (and reconnect with backoff whenever the link drops)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="router-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        self._state = BrokerState.CONNECTING

    async def _run(self) -> None:
        client_id = f"gpurouter-watch-{uuid.uuid4().hex[:12]}"
        await stay_connected(
            lambda: make_client(self.target, identifier=client_id),
            self._receive,
            backoff=self.backoff,
            on_change=self._on_change,
        )

    def _on_change(self, up: bool, reason: str | None) -> None:
        if up:
            self._state = BrokerState.CONNECTED
        elif self._state is BrokerState.CONNECTED:
            self._state = BrokerState.RECONNECTING
        if reason is not None:
            self._last_error = reason

    async def _receive(self, client: aiomqtt.Client) -> None:
        await subscribe(client, self.topics.all_router_stats, qos=0)
        await subscribe(client, self.topics.all_acks, qos=1)
        await subscribe(client, self.topics.events, qos=1)
        async for message in client.messages:
            try:
                self.handle(message.topic.value, message.payload)
            except Exception:  # a bug must not stop the watch; logged
                log.exception("router message on %s", message.topic.value)

    # ---- messages --------------------------------------------------------------------------

    def handle(self, topic: str, payload: object) -> None:
        """Note one router's stats, acknowledgement or event; drops and counts anything
        wrong."""
        if topic == self.topics.events:
            self._event(payload)
            return
        parsed = self.topics.parse_router(topic)
        if parsed is None:
            return  # not a topic this watch asked for
        name, kind = parsed
        if kind == "stats":
            self._stats(name, payload)
        else:
            self._ack(name, payload)

    def _stats(self, name: str, payload: object) -> None:
        try:
            stats = decode_stats(payload)
        except PayloadError as exc:
            self._drop("malformed_stats", f"{name}: {exc.reason}")
            return
        if stats.router != name:
            self._drop("wrong_router", f"{name}: the stats name router {stats.router!r}")
            return
        router = self._router(name)
        if router is not None:
            router.stats, router.received_at = stats, self.clock()

    def _event(self, payload: object) -> None:
        try:
            self._events.append(decode_event(payload))
        except PayloadError as exc:
            self._drop("malformed_event", exc.reason)

    def _ack(self, name: str, payload: object) -> None:
        ack = decode_ack(payload)
        if ack is None:
            self._drop("malformed_ack", f"{name}: not an acknowledgement")
            return
        router = self._router(name)
        if router is None:
            return
        router.acks.append(ack)
        if ack.ok:
            router.applied += 1
        else:
            router.refused += 1

    def _router(self, name: str) -> _Router | None:
        router = self._routers.get(name)
        if router is None:
            if len(self._routers) >= MAX_ROUTERS:
                self._drop("too_many_routers", f"{name}: {MAX_ROUTERS} routers already watched")
                return None
            router = self._routers[name] = _Router(name)
        return router

    def _drop(self, reason: str, detail: str) -> None:
        self._drops[reason] += 1
        self._last_error = f"{reason}: {detail}"

    # ---- the view --------------------------------------------------------------------------

    def status(self) -> RoutersStatus:
        now = self.clock()
        return RoutersStatus(
            broker=self._state,
            broker_url=self.target.url,
            routers=tuple(_feed(r, now) for r in sorted(self._routers.values(), key=_by_name)),
            events=tuple(self._events),
            drop_reasons=dict(self._drops),
            last_error=self._last_error,
        )


def _by_name(router: _Router) -> str:
    return router.name


def _feed(router: _Router, now: float) -> RouterFeed:
    age = None if router.received_at is None else now - router.received_at
    return RouterFeed(
        router=router.name,
        stats=router.stats,
        age_s=age,
        stale=age is None or age > STALE_AFTER_S,
        applied=router.applied,
        refused=router.refused,
        acks=tuple(router.acks),
    )
