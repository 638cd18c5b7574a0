"""The node agent: reads this node's GPUs and publishes them over MQTT (docs/telemetry.md).

Per connection (a *session*, numbered from the wall clock in milliseconds so that it grows
with each connect and across restarts):

1. the will is set to the node's ``offline`` status (retained, QoS 1): a crash or a lost
   connection marks the node offline;
2. the birth, ``online`` with the GPU inventory, is published retained, QoS 1;
3. every period one :class:`~router.telemetry.GpuBatch` with all GPUs goes out, QoS 0, with
   the session, a sequence number and a timestamp;
4. on a clean stop the agent publishes ``offline`` itself (a clean disconnect sends no will).

Readings that cannot be sent are dropped and counted, never queued: while disconnected no
sample is taken and each missed period counts as dropped; a publish the client cannot take
(its outgoing queue is bounded) is dropped too. Reconnects wait a capped exponential backoff
with jitter. NVML calls block, so a blocking source is read in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeVar

import aiomqtt
import paho.mqtt.client as paho

from router.config.schema import FleetConfig
from router.errors import TelemetryError
from router.telemetry.connection import (
    Backoff,
    BrokerTarget,
    make_client,
    publish,
    reraise_cancellation,
)
from router.telemetry.schema import GpuBatch, NodeStatus, PayloadError, encode
from router.telemetry.topics import Topics, check_level

if TYPE_CHECKING:
    from router.emulator import EmulatedFleet

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

_CONNECTION_GONE = (paho.MQTT_ERR_NO_CONN, paho.MQTT_ERR_CONN_LOST)


class GpuSource(Protocol):
    """Where readings come from: an :class:`~router.telemetry.NvmlSampler` or emulated GPUs."""

    period_s: float

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def birth(
        self, node: str, session: int, agent_version: str, models: Sequence[str] = ()
    ) -> NodeStatus: ...

    def sample(
        self, node: str, session: int, seq: int, replica_map: Mapping[int, str] | None = None
    ) -> GpuBatch: ...


class EmulatedSource:
    """The emulated GPUs of one node of an :class:`~router.emulator.EmulatedFleet`, in the
    schema NVML readings use. Readings show the load of the replicas the fleet runs in this
    process; GPUs of replicas it does not run read idle."""

    blocking = False
    """Reads in memory: called on the event loop, not in a thread."""

    def __init__(
        self,
        fleet: EmulatedFleet,
        *,
        period_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.fleet = fleet
        self.period_s = period_s
        self._wall_clock = wall_clock

    def init(self) -> None:
        """Nothing to open."""

    def shutdown(self) -> None:
        """Nothing to close."""

    def birth(
        self, node: str, session: int, agent_version: str, models: Sequence[str] = ()
    ) -> NodeStatus:
        return NodeStatus(
            node=node,
            state="online",
            session=session,
            agent_version=agent_version,
            sample_period_s=self.period_s,
            gpus=tuple(self.fleet.gpu_inventory(node)),
            ts=self._wall_clock(),
            models=tuple(models),
        )

    def sample(
        self, node: str, session: int, seq: int, replica_map: Mapping[int, str] | None = None
    ) -> GpuBatch:
        gpus = tuple(self.fleet.gpu_samples(node))
        return GpuBatch(node, session, seq, self._wall_clock(), self.period_s, gpus)


def node_replicas(fleet: FleetConfig | None, node: str) -> tuple[dict[int, str], tuple[str, ...]]:
    """GPU index -> replica id on ``node``, and the models it serves, from the fleet file."""
    if fleet is None:
        return {}, ()
    for n in fleet.nodes:
        if n.name == node:
            gpus = {index: r.id for r in n.replicas for index in r.gpus}
            return gpus, tuple(dict.fromkeys(r.model for r in n.replicas))
    known = ", ".join(n.name for n in fleet.nodes)
    raise TelemetryError(f"the fleet file names no node {node!r} (known: {known})")


def agent_version() -> str:
    try:
        return metadata.version("gpurouter")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(slots=True)
class AgentStats:
    """What the agent did, for its log and its tests."""

    connected: bool = False
    connects: int = 0
    session: int | None = None
    published: int = 0
    """GPU batches handed to the broker."""
    dropped: int = 0
    """Samples not sent: periods spent disconnected, and publishes the client refused."""
    sample_errors: int = 0
    """Periods in which the GPUs could not be read at all."""
    last_error: str | None = None


class NodeAgent:
    """Publishes one node's GPUs until :meth:`stop`; see the module docstring for the protocol.

    ``clock`` (monotonic) paces the samples; ``wall_clock`` numbers the sessions.
    """

    def __init__(
        self,
        node: str,
        source: GpuSource,
        *,
        target: BrokerTarget,
        cluster: str = "default",
        replica_map: Mapping[int, str] | None = None,
        models: Sequence[str] = (),
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = check_level(node, "node name")
        self.source = source
        self.target = target
        self.topics = Topics(cluster)
        self.replica_map = dict(replica_map or {})
        self.models = tuple(models)
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.wall_clock = wall_clock
        self.version = agent_version()
        self.stats = AgentStats()
        self._stop = asyncio.Event()
        self._session = 0
        self._blocking = getattr(source, "blocking", True)

    @property
    def period_s(self) -> float:
        return self.source.period_s

    def stop(self) -> None:
        """Ask :meth:`run` to publish ``offline`` and return."""
        self._stop.set()

    async def run(self) -> None:
        """Publish until :meth:`stop`; reconnects as needed. TelemetryError if the source
        cannot start (NvmlUnavailableError: no NVML here)."""
        await self._call(self.source.init)
        try:
            while not self._stop.is_set():
                await self._session_once()
                if self._stop.is_set():
                    return
                await self._disconnected_for(self.backoff.next_delay())
        finally:
            await self._call(self.source.shutdown)

    async def _session_once(self) -> None:
        self._session = max(self._session + 1, int(self.wall_clock() * 1000))
        session = self._session
        try:
            birth = await self._call(
                self.source.birth, self.node, session, self.version, self.models
            )
            offline = encode(replace(birth, state="offline"))
            online = encode(birth)
        except (TelemetryError, PayloadError) as exc:
            self._failed(f"cannot read the node's inventory: {exc}")
            return
        status = self.topics.status(self.node)
        will = aiomqtt.Will(status, offline, qos=1, retain=True)
        # A client id per session: a new connection never takes over (and so never fires
        # the will of) the one before it.
        identifier = f"gpurouter-agent-{self.node}-{session}"
        client = make_client(self.target, identifier=identifier, will=will)
        try:
            async with client:
                self.stats.connected, self.stats.session = True, session
                self.stats.connects += 1
                self.backoff.reset()
                await publish(client, status, online, qos=1, retain=True)
                await self._stream(client, session)
                last = replace(birth, state="offline", ts=self.wall_clock())
                await publish(client, status, encode(last), qos=1, retain=True, timeout=5.0)
        except aiomqtt.MqttError as exc:
            reraise_cancellation()
            self._failed(str(exc) or type(exc).__name__)
        finally:
            self.stats.connected = False

    async def _stream(self, client: aiomqtt.Client, session: int) -> None:
        """One batch per period until stopped; returns on stop, raises on a lost connection."""
        topic = self.topics.gpus(self.node)
        seq = 0
        due = self.clock()
        while not self._stop.is_set():
            payload = await self._reading(session, seq)
            if payload is not None:
                await self._publish(client, topic, payload)
            seq += 1
            due += self.period_s
            now = self.clock()
            if due < now:  # sampling overran: skip the missed ticks rather than burst
                missed = int((now - due) / self.period_s) + 1
                self.stats.dropped += missed
                due += missed * self.period_s
            await self._wait(due - now)

    async def _reading(self, session: int, seq: int) -> bytes | None:
        try:
            batch = await self._call(self.source.sample, self.node, session, seq, self.replica_map)
            return encode(batch)
        except (TelemetryError, PayloadError) as exc:
            self.stats.sample_errors += 1
            self.stats.last_error = str(exc)
            return None

    async def _publish(self, client: aiomqtt.Client, topic: str, payload: bytes) -> None:
        try:
            await publish(client, topic, payload, qos=0, timeout=self.period_s)
        except aiomqtt.MqttCodeError as exc:
            if exc.rc in _CONNECTION_GONE:
                raise
            self.stats.dropped += 1  # the bounded outgoing queue is full: drop, do not pile up
            return
        except aiomqtt.MqttError:
            self.stats.dropped += 1  # timed out behind a slow socket
            return
        self.stats.published += 1

    async def _disconnected_for(self, seconds: float) -> None:
        """Wait out a backoff; each period that passes is a sample dropped."""
        start = self.clock()
        await self._wait(seconds)
        self.stats.dropped += int((self.clock() - start) / self.period_s)

    async def _wait(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._blocking:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def _failed(self, reason: str) -> None:
        self.stats.last_error = reason
        log.warning("agent %s: %s", self.node, reason)
