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
=========================  ==============================================

A message is ``{"v": 1, "version": N, "origin": "...", "ts": ..., "command": {...}}`` with
``command`` as :func:`router.control.parse_command` reads it. A router applies a slot's
command only when its version is newer than the last one it applied there (so a retained
message delivered again after a reconnect changes nothing), through the
:class:`~router.control.ControlSurface` with actor ``mqtt:<origin>`` (it lands in the audit
trail like any other), and acknowledges on ``control/acks/<router>``. Versions are the
publisher's wall clock in milliseconds (strictly growing per publisher), so the last command
sent is the one every router converges on.

Each router also publishes its snapshot's essentials on ``routers/<router>/stats`` every
period and every audit event on ``events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiomqtt

from router.config.schema import BrokerConfig
from router.control import (
    Command,
    ControlSurface,
    Drain,
    Eject,
    Event,
    Preempt,
    Readmit,
    SetBatchSize,
    SetStrategy,
    SetWeight,
    Undrain,
    command_args,
    command_name,
    parse_command,
)
from router.errors import ControlError, TelemetryError
from router.telemetry.connection import (
    Backoff,
    BrokerTarget,
    cancel_and_wait,
    make_client,
    publish,
    resolve_target,
    stay_connected,
    subscribe,
)
from router.telemetry.topics import Topics, check_level

log = logging.getLogger(__name__)

CONTROL_VERSION = 1
MAX_CONTROL_BYTES = 16 * 1024
_ORIGIN = re.compile(r"^[\w.@:-]{1,64}$")
_EVENTS_KEPT = 1000


def slot_of(command: Command) -> str:
    """The desired-state slot a command sets (see the module docstring)."""
    match command:
        case SetStrategy():
            return "strategy"
        case SetWeight(replica):
            return f"weight/{check_level(replica, 'replica id')}"
        case SetBatchSize(replica):
            return f"batch/{check_level(replica, 'replica id')}"
        case Drain(replica) | Undrain(replica) | Preempt(replica):
            return f"service/{check_level(replica, 'replica id')}"
        case Eject(replica) | Readmit(replica):
            return f"eject/{check_level(replica, 'replica id')}"
    raise ControlError(f"no slot for {command!r}")


def encode_desired(command: Command, version: int, origin: str, ts: float) -> bytes:
    body = {"command": command_name(command), **command_args(command)}
    message = {"v": CONTROL_VERSION, "version": version, "origin": origin, "ts": ts}
    return json.dumps(message | {"command": body}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Desired:
    """One decoded desired-state message."""

    version: int
    origin: str
    command: Command


def decode_desired(payload: bytes) -> Desired:
    """Read a desired-state message; ControlError says what is wrong with it."""
    if len(payload) > MAX_CONTROL_BYTES:
        raise ControlError(f"control message of {len(payload)} bytes, over {MAX_CONTROL_BYTES}")
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ControlError("control message is not JSON") from None
    if not isinstance(data, dict) or data.get("v") != CONTROL_VERSION or data.get("v") is True:
        raise ControlError(f"control message: expected an object with v {CONTROL_VERSION}")
    version, origin, body = data.get("version"), data.get("origin"), data.get("command")
    if type(version) is not int or not 0 <= version < 2**63:
        raise ControlError("control message: version must be a non-negative integer")
    if not isinstance(origin, str) or not _ORIGIN.match(origin):
        raise ControlError("control message: origin must be 1-64 of letters, digits, . @ : _ -")
    if not isinstance(body, dict):
        raise ControlError("control message: command must be an object")
    return Desired(version, origin, parse_command(body))


@dataclass(frozen=True, slots=True)
class Ack:
    """What a router did with one desired-state message."""

    slot: str
    version: int | None
    ok: bool
    message: str

    def encode(self, router: str) -> bytes:
        body = {"v": CONTROL_VERSION, "router": router, "slot": self.slot}
        body |= {"version": self.version, "ok": self.ok, "message": self.message}
        return json.dumps(body, separators=(",", ":")).encode()


class ControlLink:
    """One router instance's link to the control topics (see the module docstring)."""

    def __init__(
        self,
        surface: ControlSurface,
        *,
        target: BrokerTarget,
        router_id: str | None = None,
        stats_period_s: float = 1.0,
        backoff: Backoff | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.surface = surface
        self.core = surface.core
        self.target = target
        self.topics = Topics(self.core.fleet.cluster)
        self.router_id = check_level(router_id or f"router-{uuid.uuid4().hex[:8]}", "router id")
        self.stats_period_s = stats_period_s
        self.backoff = backoff or Backoff(base_s=0.2, cap_s=10.0)
        self.wall_clock = wall_clock
        self.applied: dict[str, int] = {}
        """Per slot, the version last applied."""
        self.dropped = 0
        """Control messages that could not be read."""
        self.connected = False
        self._events: deque[Event] = deque(maxlen=_EVENTS_KEPT)
        self._events_ready = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._unsubscribe = self.surface.subscribe(self._on_event)
            self._task = asyncio.create_task(self._run(), name=f"control-{self.router_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if task is not None:
            await cancel_and_wait(task)
        self.connected = False

    def handle(self, topic: str, payload: object) -> Ack | None:
        """Apply one control message if it is new; the ack to send, or None. Never raises."""
        slot = self.topics.parse_desired(topic)
        if slot is None or not isinstance(payload, bytes | bytearray) or not payload:
            return None  # not ours, or a retained message being cleared
        try:
            desired = decode_desired(bytes(payload))
            expected = slot_of(desired.command)
        except (ControlError, ValueError) as exc:
            self.dropped += 1
            return Ack(slot, None, False, str(exc))
        if expected != slot:
            self.dropped += 1
            return Ack(slot, desired.version, False, f"a {expected} command on slot {slot}")
        if desired.version <= self.applied.get(slot, -1):
            return None  # applied already (a retained message seen again)
        self.applied[slot] = desired.version
        event = self.surface.apply(desired.command, actor=f"mqtt:{desired.origin}")
        return Ack(slot, desired.version, event.ok, event.message)

    def stats_payload(self) -> bytes:
        """The ``routers/<router>/stats`` message: this router's queue and replicas now."""
        snap = self.core.snapshot()
        replicas = [
            {
                "id": r.id,
                "state": r.state,
                "in_flight": r.in_flight,
                "weight": r.weight,
                "batch_size": r.batch_size,
                "utilization": round(r.utilization, 4),
                "stale": r.stale,
            }
            for r in snap.replicas
        ]
        body: dict[str, Any] = {
            "v": CONTROL_VERSION,
            "router": self.router_id,
            "ts": self.wall_clock(),
            "strategy": snap.strategy,
            "queue": {"depth": snap.queue.depth, "capacity": snap.queue.capacity},
            "in_flight": snap.in_flight,
            "throughput_rps": round(snap.throughput_rps, 3),
            "imbalance_factor": round(snap.imbalance_factor, 4),
            "replicas": replicas,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    def _on_event(self, event: Event) -> None:
        self._events.append(event)
        self._events_ready.set()

    async def _run(self) -> None:
        identifier = f"gpurouter-{self.router_id}-control"
        await stay_connected(
            lambda: make_client(self.target, identifier=identifier),
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
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._publish_stats(client))
                group.create_task(self._publish_events(client))
                await self._receive(client)
        except* aiomqtt.MqttError as lost:  # one lost connection, however many tasks saw it
            raise lost.exceptions[0] from None

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
                body = {"v": CONTROL_VERSION, "router": self.router_id, **event.to_dict()}
                await publish(client, topic, json.dumps(body, default=str).encode(), qos=1)


class ControlPublisher:
    """Sends operator commands as desired state (for ``gpurouter ctl`` and the console)."""

    def __init__(
        self,
        target: BrokerTarget,
        cluster: str,
        *,
        origin: str = "operator",
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not _ORIGIN.match(origin):
            raise TelemetryError(f"origin {origin!r}: 1-64 of letters, digits, . @ : _ -")
        self.target = target
        self.topics = Topics(cluster)
        self.origin = origin
        self.wall_clock = wall_clock
        self._last = 0
        self._client: aiomqtt.Client | None = None

    async def __aenter__(self) -> ControlPublisher:
        identifier = f"gpurouter-ctl-{uuid.uuid4().hex[:12]}"
        self._client = make_client(self.target, identifier=identifier)
        try:
            await self._client.__aenter__()
        except aiomqtt.MqttError as exc:
            self._client = None
            raise TelemetryError(f"cannot reach the broker at {self.target.url}: {exc}") from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await client.__aexit__(None, None, None)

    def next_version(self) -> int:
        """Wall-clock milliseconds, strictly above the last version this publisher used."""
        self._last = max(self._last + 1, int(self.wall_clock() * 1000))
        return self._last

    async def publish(self, command: Command | Mapping[str, Any]) -> int:
        """Publish ``command`` (a Command or its JSON form) as desired state; its version."""
        if self._client is None:
            raise TelemetryError("ControlPublisher is used as 'async with ControlPublisher(...)'")
        cmd = command if not isinstance(command, Mapping) else parse_command(command)
        version = self.next_version()
        payload = encode_desired(cmd, version, self.origin, self.wall_clock())
        try:
            topic = self.topics.desired(slot_of(cmd))
            await publish(self._client, topic, payload, qos=1, retain=True)
        except aiomqtt.MqttError as exc:
            raise TelemetryError(f"could not publish to {self.target.url}: {exc}") from None
        return version


async def publish_command(
    broker: BrokerTarget | str,
    cluster: str,
    command: Command | Mapping[str, Any],
    *,
    origin: str = "operator",
) -> int:
    """Publish one command as desired state and disconnect; the version it got.

    ``broker`` is a resolved target or a ``mqtt://`` URL (credentials from the environment).
    """
    if isinstance(broker, str):
        broker = resolve_target(BrokerConfig(), url=broker)
    target = broker
    async with ControlPublisher(target, cluster, origin=origin) as publisher:
        return await publisher.publish(command)
