"""Control over MQTT: operators' desired state in, each router's stats, acks and audit out.

Desired state is kept by the broker: each command goes, retained and QoS 1, to the topic of
its *slot*, so the broker holds the operator's last word per slot and every router, however
late it connects, gets the whole desired state:

=========================  ==============================================
slot                       commands
=========================  ==============================================
``strategy``               ``strategy``
``weight/<replica>``       ``weight``
``batch/<replica>``        ``batch``
``service/<replica>``      ``drain``, ``undrain``, ``preempt``
``eject/<replica>``        ``eject``, ``readmit``
``split``                  ``split``, ``unsplit`` (a canary's or blue-green switch's)
=========================  ==============================================

A message is ``{"v": 1, "version": N, "origin": "...", "ts": ..., "command": {...}}`` with
``command`` as :func:`router.control.parse_command` reads it. A router applies a slot's
command only when its version is newer than the last one it applied there (so a retained
message delivered again after a reconnect changes nothing), through the
:class:`~router.control.ControlSurface` with actor ``mqtt:<origin>`` (it lands in the audit
trail like any other), and acknowledges on ``control/acks/<router>``. Versions are the
publisher's wall clock in milliseconds (strictly growing per publisher), so the last command
sent is the one every router converges on.

Hostile or broken publishers cannot steer a router or blind it:

- with a shared secret (:mod:`~router.telemetry.control_auth`), a message that is unsigned
  or badly signed is dropped and counted; without one the router says at start, loudly,
  that anyone who can publish on the control topics can steer it;
- a version further ahead of the router's clock than ``control.max_clock_skew_s`` is
  refused, so that no message can hold its slot against the operator's later commands;
- every message is judged as it comes off the socket, before it takes a place in the
  link's bounded queue: only commands to apply are queued, so a flood of junk cannot push
  out the operator's command. What is dropped is counted by reason (:data:`REFUSALS`) and
  not acknowledged (a flood of junk must not become a flood of acks).

Each router keeps the last applied message of every slot in a state file
(:mod:`~router.telemetry.desired_state`) and applies it when it starts, so that a broker
which lost its retained messages does not send the fleet back to the fleet file's settings.

Each router also publishes its snapshot's essentials on ``routers/<router>/stats`` every
period and every audit event on ``events``. The stats carry the router's own load per replica
(``load``: requests in flight and their cost, router/peer_load.py); every other router counts
it on those replicas until it is three periods old, and a malformed ``load`` is ignored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import aiomqtt

from router.config.schema import ControlConfig
from router.control import Applied, Command, ControlSurface, Event
from router.errors import ControlError
from router.peer_load import STATS_PERIOD_S, load_body, read_load
from router.telemetry import control_auth
from router.telemetry.connection import (
    Backoff,
    BrokerTarget,
    cancel_and_wait,
    make_client,
    publish,
    screened_queue,
    stay_connected,
    subscribe,
)
from router.telemetry.control_messages import (
    CONTROL_VERSION,
    MAX_CONTROL_BYTES,
    REFUSALS,
    Accepted,
    Ack,
    Desired,
    Refused,
    Stale,
    Verdict,
    decode_ack,
    decode_desired,
    desired_from,
    encode_desired,
    load_message,
    slot_of,
)
from router.telemetry.control_publisher import ControlPublisher, publish_command
from router.telemetry.desired_state import DesiredStateFile, state_path
from router.telemetry.router_events import encode_event
from router.telemetry.router_stats import MAX_STATS_BYTES, encode_stats
from router.telemetry.status import ControlLinkStatus
from router.telemetry.topics import Topics, check_level

__all__ = [
    "CONTROL_VERSION",
    "MAX_CONTROL_BYTES",
    "MAX_PEERS",
    "MAX_QUEUED",
    "REFUSALS",
    "Ack",
    "ControlLink",
    "ControlPublisher",
    "Desired",
    "NotLinkedError",
    "decode_desired",
    "encode_desired",
    "publish_command",
    "slot_of",
]

log = logging.getLogger(__name__)

_EVENTS_KEPT = 1000
_SPARE_SLOTS = 64
"""Slots a link tracks beyond those its fleet's replicas can have (a command on an unknown
replica is applied, refused by the surface and acknowledged); a new slot past them is
refused, so that made-up slots cannot grow the link's memory without end."""
MAX_QUEUED = 10_000
"""Commands waiting to be applied; junk never takes a place (see the module docstring)."""


PUBLISH_WAIT_S = 5.0
"""How long a command given to this router may take to come back from the broker."""
ACK_WAIT_S = 1.0
"""How long, after applying it, a router waits for the others' acknowledgements of a
command it published."""
PEER_FRESH_S = 5.0
"""A router whose stats (every second) came within this long counts as in the cluster."""
MAX_PEERS = 1024
"""Routers a link keeps track of: junk router ids cannot grow it without end."""


class NotLinkedError(ControlError):
    """The control link is not connected: a command cannot be published now."""


def _origin(actor: str, router_id: str) -> str:
    """A publisher name for ``actor`` (an admin API's ``X-Actor``) as it came to this router:
    the characters an origin may hold, at most 64."""
    name = re.sub(r"[^A-Za-z0-9.@:_-]", "_", actor)[:40] or "admin"
    return f"{name}@{router_id}"[:64]


class ControlLink:
    """One router instance's link to the control topics (see the module docstring).

    ``secret`` authenticates control messages (None: they are not, and :meth:`start` says
    so); ``state`` keeps the applied desired state across restarts (None: it is not kept).
    :meth:`from_fleet` takes all of it from the fleet file's ``control`` section.
    """

    def __init__(
        self,
        surface: ControlSurface,
        *,
        target: BrokerTarget,
        router_id: str | None = None,
        stats_period_s: float = STATS_PERIOD_S,
        backoff: Backoff | None = None,
        wall_clock: Callable[[], float] = time.time,
        secret: bytes | None = None,
        max_clock_skew_s: float = ControlConfig().max_clock_skew_s,
        state: DesiredStateFile | None = None,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.surface = surface
        self.core = surface.core
        self.target = target
        self.topics = Topics(self.core.fleet.cluster)
        self.router_id = check_level(router_id or f"router-{uuid.uuid4().hex[:8]}", "router id")
        self.stats_period_s = stats_period_s
        self.backoff = backoff or Backoff(base_s=0.2, cap_s=10.0)
        self.wall_clock = wall_clock
        self.secret = secret
        self.max_clock_skew_s = max_clock_skew_s
        self.state = state
        self.max_queued = max_queued
        self.applied: dict[str, int] = {}
        """Per slot, the version last applied."""
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        """Messages dropped, by reason (:data:`REFUSALS`)."""
        self.stale = 0
        """Messages older than the version applied on their slot (ignored)."""
        self.restored = 0
        """Commands applied from the state file at start."""
        self.state_errors = 0
        """State files that could not be read or written."""
        self.last_refusal: str | None = None
        self.last_state_error: str | None = None
        self.connected = False
        self._saved: dict[str, dict[str, Any]] = {}
        self._max_slots = 2 + 4 * len(self.core.pool) + _SPARE_SLOTS
        self._events: deque[Event] = deque(maxlen=_EVENTS_KEPT)
        self._events_ready = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: aiomqtt.Client | None = None
        self._waiting: dict[tuple[str, int], asyncio.Future[Event]] = {}
        self._acks: dict[tuple[str, int], dict[str, bool]] = {}
        """Per command this router published and waits on: each router's acknowledgement."""
        self.peers: dict[str, float] = {}
        """Routers of the cluster heard from (their stats), by id: when (``time.monotonic``)."""

    @classmethod
    def from_fleet(
        cls,
        surface: ControlSurface,
        *,
        target: BrokerTarget,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> ControlLink:
        """A link set up as the fleet file's ``control`` section says: its secret, clock
        skew and state file. ControlError when the secret's variable is unset or short."""
        fleet = surface.core.fleet
        return cls(
            surface,
            target=target,
            secret=control_auth.resolve_secret(fleet.control, environ),
            max_clock_skew_s=fleet.control.max_clock_skew_s,
            state=DesiredStateFile(state_path(fleet, environ), fleet.cluster),
            **options,
        )

    @property
    def dropped(self) -> int:
        """Control messages dropped, whatever the reason."""
        return sum(self.refused.values())

    def status(self) -> ControlLinkStatus:
        """The link's counters, for the admin API and /metrics."""
        return ControlLinkStatus(
            router=self.router_id,
            connected=self.connected,
            authenticated=self.secret is not None,
            slots=len(self.applied),
            refused=dict(self.refused),
            stale=self.stale,
            restored=self.restored,
            last_refusal=self.last_refusal,
            state_file=None if self.state is None else str(self.state.path),
            state_errors=self.state_errors,
            last_state_error=self.last_state_error,
            routers=tuple(self.routers()),
        )

    async def start(self) -> None:
        """Apply the saved desired state, then connect in the background."""
        if self._task is None:
            if self.secret is None:
                log.warning(
                    "control link %s: control messages are NOT authenticated: anyone who can "
                    "publish on %s can steer this router. Set control.secret_env (or %s) "
                    "on every router and publisher.",
                    self.router_id,
                    self.topics.all_desired,
                    control_auth.SECRET_ENV,
                )
            self._unsubscribe = self.surface.subscribe(self._on_event)
            self.restore()
            self._task = asyncio.create_task(self._run(), name=f"control-{self.router_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if task is not None:
            await cancel_and_wait(task)
        self.connected = False

    # ---- judging and applying messages -----------------------------------------------------

    def handle(self, topic: str, payload: object) -> Ack | None:
        """Apply one control message if it is new and sound; the ack to send, or None.

        A refused message is counted and answered with ``ok: false`` here; off the network
        it never gets this far (:meth:`admit` drops it before the queue). Never raises.
        """
        verdict = self.screen(topic, payload)
        if isinstance(verdict, Accepted):
            return self._apply(verdict)
        self._count(verdict)
        if isinstance(verdict, Refused):
            return Ack(verdict.slot, verdict.version, False, verdict.detail)
        return None

    def screen(self, topic: str, payload: object) -> Verdict:
        """What one message comes to, without applying or counting it."""
        slot = self.topics.parse_desired(topic)
        if slot is None or not isinstance(payload, bytes | bytearray) or not payload:
            return None  # not ours, or a retained message being cleared
        if len(payload) > MAX_CONTROL_BYTES:
            size = f"control message of {len(payload)} bytes, over {MAX_CONTROL_BYTES}"
            return Refused(slot, "oversized", size)
        try:
            message = load_message(bytes(payload))
        except ControlError as exc:
            return Refused(slot, "malformed", str(exc))
        return self.judge(slot, message)

    def judge(self, slot: str, message: Mapping[str, Any]) -> Verdict:
        """What a parsed message on ``slot`` comes to: its signature, its command, its
        version against the router's clock and against the slot's last."""
        if self.secret is not None:
            problem = control_auth.check(message, self.topics.desired(slot), self.secret)
            if problem is not None:
                return Refused(slot, problem, f"{problem.replace('_', ' ')} control message")
        try:
            desired = desired_from(message)
            expected = slot_of(desired.command)
        except (ControlError, ValueError) as exc:
            return Refused(slot, "malformed", str(exc))
        version = desired.version
        if expected != slot:
            return Refused(slot, "wrong_slot", f"a {expected} command on slot {slot}", version)
        ahead_s = version / 1000 - self.wall_clock()
        if ahead_s > self.max_clock_skew_s:
            return Refused(
                slot,
                "future_version",
                f"version {version} is {ahead_s:.0f} s ahead of router {self.router_id}'s "
                f"clock (at most {self.max_clock_skew_s:g} s allowed)",
                version,
            )
        last = self.applied.get(slot)
        if last is not None and version <= last:
            return Stale(slot, version) if version < last else None
        if last is None and len(self.applied) >= self._max_slots:
            many = f"over {self._max_slots} slots; a new slot {slot} is refused"
            return Refused(slot, "too_many_slots", many, version)
        return Accepted(slot, desired, message)

    def restore(self) -> int:
        """Apply the desired state saved by this router's last run, oldest command first;
        how many were applied. :meth:`start` calls it before connecting."""
        if self.state is None:
            return 0
        try:
            saved = self.state.load()
        except ControlError as exc:
            self._state_failed(f"saved desired state not used: {exc}")
            return 0
        accepted: list[Accepted] = []
        for slot, message in saved.items():
            verdict = self.judge(slot, message)
            if isinstance(verdict, Accepted):
                accepted.append(verdict)
            elif isinstance(verdict, Refused):
                why = verdict.detail
                log.warning("control link %s: saved %s not applied: %s", self.router_id, slot, why)
        for item in sorted(accepted, key=lambda a: a.desired.version):
            self._apply(item, source="restored")
        self.restored += len(accepted)
        return len(accepted)

    def _apply(self, accepted: Accepted, source: str = "mqtt") -> Ack:
        slot, desired = accepted.slot, accepted.desired
        self.applied[slot] = desired.version
        self._saved[slot] = dict(accepted.message)
        event = self.surface.apply(desired.command, actor=f"{source}:{desired.origin}")
        self._save()
        waiter = self._waiting.pop((slot, desired.version), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(event)
        return Ack(slot, desired.version, event.ok, event.message)

    # ---- commands given to this router -----------------------------------------------------

    async def publish_command(
        self, command: Command, actor: str, timeout_s: float = PUBLISH_WAIT_S
    ) -> Applied:
        """Publish a command given to this router (its admin API) as the cluster's desired
        state, signed, so that every router applies it: this router's own application, once
        its message came back, and the acknowledgements of the routers heard from lately
        (waited for up to ``ACK_WAIT_S``). NotLinkedError while the link is down (the caller
        applies it alone); TimeoutError if it did not come back in ``timeout_s``."""
        client = self._client
        if client is None or not self.connected:
            raise NotLinkedError(f"control link {self.router_id} is not connected")
        slot = slot_of(command)
        topic = self.topics.desired(slot)
        version = max(int(self.wall_clock() * 1000), self.applied.get(slot, 0) + 1)
        origin = _origin(actor, self.router_id)
        payload = encode_desired(
            command, version, origin, self.wall_clock(), topic=topic, secret=self.secret
        )
        key = (slot, version)
        waiter: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        acks = self._acks[key] = {}
        try:
            await publish(client, topic, payload, qos=1, retain=True)
            event = await asyncio.wait_for(waiter, timeout_s)
            acks[self.router_id] = event.ok
            await self._wait_for_peers(acks)
            return Applied(event, dict(acks))
        finally:
            self._waiting.pop(key, None)
            self._acks.pop(key, None)

    async def _wait_for_peers(self, acks: dict[str, bool]) -> None:
        """Until every router heard from in the last ``PEER_FRESH_S`` has acknowledged, for
        at most ``ACK_WAIT_S``: who applied it is the answer's to show, not to hold up."""
        deadline = time.monotonic() + ACK_WAIT_S
        while time.monotonic() < deadline:
            if set(self.routers()) <= acks.keys():
                return
            await asyncio.sleep(0.02)

    def routers(self) -> list[str]:
        """The routers of the cluster heard from in the last ``PEER_FRESH_S``, this one too
        once its own stats came back."""
        now = time.monotonic()
        return sorted(r for r, at in self.peers.items() if now - at < PEER_FRESH_S)

    def _heard(self, topic: str, payload: object) -> bool:
        """Note another router's acknowledgement or stats; whether the message was one."""
        router = self.topics.parse_router(topic)
        if router is None:
            return False
        name, kind = router
        if kind == "stats":
            if name in self.peers or len(self.peers) < MAX_PEERS:
                self.peers[name] = time.monotonic()
                if name != self.router_id:  # our own, echoed: already counted as ours
                    self._peer_load(name, payload)
            return True
        ack = decode_ack(payload)
        if ack is not None and (wanted := self._acks.get((ack.slot, ack.version or 0))) is not None:
            wanted[name] = ack.ok
        return True

    def _peer_load(self, name: str, payload: object) -> None:
        """Count another router's published load (router/peer_load.py) on the core."""
        if not isinstance(payload, bytes | bytearray) or len(payload) > MAX_STATS_BYTES:
            return
        try:
            body = json.loads(payload)
        except ValueError:
            return
        report = read_load(name, body.get("load") if isinstance(body, dict) else None)
        if report is not None:
            self.core.hear_peer(report)

    def _save(self) -> None:
        if self.state is None:
            return
        try:
            self.state.save(self._saved)
        except OSError as exc:
            self._state_failed(f"cannot write {self.state.path}: {exc.strerror or exc}")

    def _state_failed(self, reason: str) -> None:
        self.state_errors += 1
        self.last_state_error = reason
        log.warning("control link %s: %s", self.router_id, reason)

    def _count(self, verdict: Verdict) -> None:
        if isinstance(verdict, Stale):
            self.stale += 1
        elif isinstance(verdict, Refused):
            self._refuse(verdict.reason, verdict.detail)

    def _refuse(self, reason: str, detail: str) -> None:
        count = self.refused[reason] = self.refused[reason] + 1
        self.last_refusal = f"{reason}: {detail}"
        if count & (count - 1) == 0:  # the 1st, 2nd, 4th...: a flood is not a flood of logs
            log.warning(
                "control link %s dropped a message (%s, %d so far): %s",
                self.router_id,
                reason,
                count,
                detail,
            )

    def admit(self, message: aiomqtt.Message) -> bool:
        """Judge a message as it comes off the socket: only a command to apply is queued.
        Another router's stats or acknowledgement is noted here and goes no further."""
        if self._heard(message.topic.value, message.payload):
            return False
        verdict = self.screen(message.topic.value, message.payload)
        if isinstance(verdict, Accepted):
            return True
        self._count(verdict)
        return False

    def overflowed(self, message: aiomqtt.Message) -> None:
        """Count a command the full queue could not take."""
        self._refuse("overflow", f"{self.max_queued} commands already wait to be applied")

    def stats_payload(self) -> bytes:
        """The ``routers/<router>/stats`` message: this router's queue and replicas now."""
        load = load_body(self.core.load_report())
        return encode_stats(self.core.snapshot(), self.router_id, self.wall_clock(), load=load)

    def _on_event(self, event: Event) -> None:
        self._events.append(event)
        self._events_ready.set()

    async def _run(self) -> None:
        identifier = f"gpurouter-{self.router_id}-control"
        queue = screened_queue(self.admit, self.overflowed)
        await stay_connected(
            lambda: make_client(
                self.target,
                identifier=identifier,
                max_queued_incoming=self.max_queued,
                queue_type=queue,
            ),
            self._connected,
            backoff=self.backoff,
            on_change=self._on_change,
        )

    def _on_change(self, up: bool, reason: str | None) -> None:
        self.connected = up
        if reason is not None:
            log.warning("control link %s: %s", self.router_id, reason)

    async def _connected(self, client: aiomqtt.Client) -> None:
        await subscribe(client, self.topics.all_desired, qos=1)
        await subscribe(client, self.topics.all_acks, qos=1)
        await subscribe(client, self.topics.all_router_stats, qos=0)
        self._client = client
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._publish_stats(client))
                group.create_task(self._publish_events(client))
                await self._receive(client)
        except* aiomqtt.MqttError as lost:  # one lost connection, however many tasks saw it
            raise lost.exceptions[0] from None
        finally:
            self._client = None

    async def _receive(self, client: aiomqtt.Client) -> None:
        acks = self.topics.acks(self.router_id)
        async for message in client.messages:
            try:
                ack = self.handle(message.topic.value, message.payload)
            except Exception:  # a bug must not stop the link
                log.exception("control message on %s", message.topic.value)
                continue
            if ack is not None:
                await publish(client, acks, ack.encode(self.router_id), qos=1)

    async def _publish_stats(self, client: aiomqtt.Client) -> None:
        topic = self.topics.router_stats(self.router_id)
        while True:
            await publish(client, topic, self.stats_payload(), qos=0)
            await asyncio.sleep(self.stats_period_s)

    async def _publish_events(self, client: aiomqtt.Client) -> None:
        topic = self.topics.events
        while True:
            await self._events_ready.wait()
            self._events_ready.clear()
            while self._events:
                event = self._events.popleft()
                await publish(client, topic, encode_event(self.router_id, event), qos=1)
