"""The router's telemetry subscriber: node agents' messages in, replica telemetry out.

It subscribes to ``nodes/+/status`` and ``nodes/+/gpus`` of its cluster and nothing else, and
ignores (counts, does not read) any message on another topic: amqtt may hand a client
retained messages that match other clients' filters. Each payload is checked
(:func:`~router.telemetry.decode_gpus`); a malformed, oversized or wrong-version one is
dropped and counted against its node, and nothing raises out of :meth:`handle`.

GPUs map to replicas through the fleet file (node name and GPU index), never through the
``replica`` a payload claims. A replica's :class:`~router.replica.Telemetry` gets the mean
utilization of its GPUs and their memory used, stamped with the router's clock when the
message arrives: ages never come from the agent's clock. Strategies read it at pick time
(``Replica.utilization`` falls back to the router's own accounting once it is older than
3 periods), so no ``pool.changed`` is needed per sample.

Per node it counts samples, gaps in ``seq`` within a session (lost samples) and new sessions
(agent restarts), and reports it all as a :class:`~router.telemetry.status.TelemetryStatus`,
drops counted by reason (:data:`DROP_REASONS`).

Sessions are numbered by the agent's wall clock, so no single message may decide the session
for good: a birth (``online``) always starts its session, even one numbered below the
current (the agent's clock stepped back), and a lower session whose batches keep coming, in
order, while the current one has sent nothing for 3 periods takes over (the current one was
forged, or numbered by a clock set far ahead). An ``offline`` of an older session is still a
late will, and ignored.
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
from router.config.schema import BrokerConfig, FleetConfig
from router.core import RouterCore
from router.errors import TelemetryError
from router.replica import Replica, Telemetry
from router.telemetry.connection import (
    Backoff,
    BrokerTarget,
    cancel_and_wait,
    make_client,
    resolve_target,
    stay_connected,
    subscribe,
)
from router.telemetry.schema import (
    GpuBatch,
    GpuInventory,
    GpuSample,
    NodeStatus,
    PayloadError,
    decode_gpus,
    decode_status,
)
from router.telemetry.status import BrokerState, NodeFeed, TelemetryStatus
from router.telemetry.topics import Topics

log = logging.getLogger(__name__)

STALE_PERIODS = 3
"""A node whose latest sample is older than this many of its periods is stale; a lower
session takes over after this many batches in order while the current one is silent."""
_ERRORS_KEPT = 10
MAX_DISCOVERED = 1024
"""Nodes a discovering subscriber watches at most, those of its fleet included."""

DROP_REASONS = (
    "not_bytes",
    "oversized",
    "malformed",
    "wrong_node",
    "older_session",
    "repeated_seq",
    "unknown_node",
)
"""Why a payload was dropped (``TelemetryStatus.drop_reasons``)."""


@dataclass(slots=True)
class _Node:
    """What the subscriber keeps about one node of the fleet."""

    name: str
    replicas: tuple[tuple[Replica, tuple[int, ...]], ...]
    period_s: float
    online: bool = False
    session: int | None = None
    status_session: int | None = None
    last_seq: int | None = None
    received_at: float | None = None
    samples: int = 0
    lost: int = 0
    restarts: int = 0
    dropped: int = 0
    last_error: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    inventory: tuple[GpuInventory, ...] = ()
    agent_version: str | None = None
    driver: str | None = None
    drops: dict[str, int] = field(default_factory=dict)
    challenger: int | None = None
    """A session below the current one that keeps sending (see the module docstring)."""
    challenger_seq: int = -1
    challenger_run: int = 0

    def drop(self, reason: str, detail: str) -> None:
        """Count a dropped payload under ``reason`` (one of DROP_REASONS)."""
        self.dropped += 1
        self.drops[reason] = self.drops.get(reason, 0) + 1
        self.last_error = detail

    def new_session(self, session: int) -> None:
        """The agent (re)connected, or a session took over."""
        if self.session is not None:
            self.restarts += 1
        self.session = session
        self.last_seq = None
        self.challenger = None


class TelemetrySubscriber:
    """Feeds a router core from the node agents of its fleet.

    ``broker`` is the fleet's :class:`~router.config.schema.BrokerConfig` (its URL must be a
    real ``mqtt://`` one: start an :class:`EmbeddedBroker` first for ``embedded``), a URL
    string, or a resolved :class:`BrokerTarget`. ``clock`` defaults to the core's, which it
    must match: telemetry ages are compared with the core's ``now``.

    Without a core (a console watching a cluster through its broker, routing nothing), the
    subscriber feeds no replica and only reports; ``clock`` is then required. ``discover``
    watches the nodes the fleet does not name as well, as they speak (at most
    :data:`MAX_DISCOVERED`): a watcher that has no fleet file learns the cluster's nodes so.
    """

    def __init__(
        self,
        fleet: FleetConfig,
        core: RouterCore | None,
        *,
        broker: BrokerConfig | BrokerTarget | str,
        clock: Clock | None = None,
        backoff: Backoff | None = None,
        environ: Mapping[str, str] | None = None,
        discover: bool = False,
    ) -> None:
        self.fleet = fleet
        self.core = core
        if clock is None:
            if core is None:
                raise TypeError("a subscriber without a core needs a clock")
            clock = core.clock
        self.clock: Clock = clock
        self.discover = discover
        self.topics = Topics(fleet.cluster)
        self.target = _target(fleet, broker, environ)
        self.max_payload_bytes = fleet.broker.max_payload_bytes
        self.backoff = backoff or Backoff(base_s=0.2, cap_s=10.0)
        self._nodes: dict[str, _Node] = {n.name: self._node(n.name) for n in fleet.nodes}
        self._state = BrokerState.CONNECTING
        self._connected_at: float | None = None
        self._errors: deque[str] = deque(maxlen=_ERRORS_KEPT)
        self._ignored = 0
        self._unknown = 0
        self._overflow = _OverflowCounter()
        self.internal_errors = 0
        """Exceptions the handler raised (bugs), caught so the feed keeps running."""
        self._task: asyncio.Task[None] | None = None

    def _node(self, name: str) -> _Node:
        node = next(n for n in self.fleet.nodes if n.name == name)
        core = self.core
        replicas = (
            () if core is None else tuple((core.replica(r.id), r.gpus) for r in node.replicas)
        )
        return _Node(name, replicas, self.fleet.broker.sample_period_s)

    def _discovered(self, name: str) -> _Node | None:
        """A node the fleet does not name, watched from its first message when discovering;
        None past :data:`MAX_DISCOVERED` (junk names cannot grow the subscriber for ever)."""
        if not self.discover or len(self._nodes) >= MAX_DISCOVERED:
            return None
        node = self._nodes[name] = _Node(name, (), self.fleet.broker.sample_period_s)
        return node

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background (and reconnect with backoff whenever the link drops)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="telemetry-subscriber")

    async def stop(self) -> None:
        """Disconnect and stop; the replicas keep their last telemetry (which goes stale)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        self._state, self._connected_at = BrokerState.CONNECTING, None

    async def _run(self) -> None:
        client_id = f"gpurouter-router-{self.fleet.cluster}-{uuid.uuid4().hex[:12]}"
        logger = logging.getLogger(f"{__name__}.client.{client_id}")
        logger.addFilter(self._overflow)
        await stay_connected(
            lambda: make_client(self.target, identifier=client_id, logger=logger),
            self._receive,
            backoff=self.backoff,
            on_change=self._on_change,
        )

    def _on_change(self, up: bool, reason: str | None) -> None:
        if up:
            self._state, self._connected_at = BrokerState.CONNECTED, self.clock()
            return
        if reason is not None:
            self._errors.append(reason)
        if self._state is BrokerState.CONNECTED:
            self._state = BrokerState.RECONNECTING
        self._connected_at = None

    async def _receive(self, client: aiomqtt.Client) -> None:
        await subscribe(client, self.topics.all_status, qos=1)
        await subscribe(client, self.topics.all_gpus, qos=0)
        async for message in client.messages:
            try:
                self.handle(message.topic.value, message.payload)
            except Exception:  # a bug must not stop the feed; counted and logged
                self.internal_errors += 1
                log.exception("telemetry message on %s", message.topic.value)

    # ---- messages --------------------------------------------------------------------------

    def handle(self, topic: str, payload: object) -> None:
        """Apply one message; drops and counts anything wrong with it. Never raises."""
        parsed = self.topics.parse_node(topic)
        if parsed is None:
            self._ignored += 1
            return
        name, kind = parsed
        node = self._nodes.get(name) or self._discovered(name)
        if node is None:
            self._unknown += 1
            return
        if not isinstance(payload, bytes | bytearray):
            node.drop("not_bytes", f"{kind}: payload is not bytes")
            return
        if len(payload) > self.max_payload_bytes:
            node.drop("oversized", f"{kind}: {len(payload)} bytes, over {self.max_payload_bytes}")
            return
        try:
            decoded = decode_gpus(payload) if kind == "gpus" else decode_status(payload)
        except PayloadError as exc:
            node.drop("malformed", f"{kind}: {exc.reason}")
            return
        if decoded.node != name:
            node.drop("wrong_node", f"{kind}: payload names node {decoded.node!r}, topic {name!r}")
        elif isinstance(decoded, GpuBatch):
            self._apply_gpus(node, decoded)
        else:
            self._apply_status(node, decoded)

    def _apply_status(self, node: _Node, status: NodeStatus) -> None:
        online = status.state == "online"
        if node.session is not None and status.session < node.session and not online:
            return  # the will of an older session, e.g. a connection that lingered
        if status.session != node.session:
            # A birth starts its session even below the current one: the agent's clock
            # stepped back, or a forged number held the place.
            node.new_session(status.session)
        node.status_session = status.session
        node.online = online
        node.period_s = status.sample_period_s
        node.inventory = status.gpus
        node.agent_version = status.agent_version
        node.driver = status.driver
        for replica, _ in node.replicas:
            replica.node_online = node.online

    def _apply_gpus(self, node: _Node, batch: GpuBatch) -> None:
        if node.session is not None and batch.session < node.session:
            if not self._takes_over(node, batch):
                detail = f"gpus: session {batch.session} is older than {node.session}"
                node.drop("older_session", detail)
                return
            node.new_session(batch.session)
        elif node.session is None or batch.session > node.session:
            node.new_session(batch.session)
        elif node.last_seq is not None:
            if batch.seq <= node.last_seq:
                node.drop("repeated_seq", f"gpus: seq {batch.seq} after {node.last_seq}")
                return
            node.lost += batch.seq - node.last_seq - 1
        now = self.clock()
        node.last_seq = batch.seq
        node.received_at = now
        node.samples += 1
        node.period_s = batch.period_s
        node.gpus = batch.gpus
        if node.status_session is None or batch.session != node.status_session:
            node.online = True  # data of another session than the last status: it is up
        by_index = {g.index: g for g in batch.gpus}
        for replica, indexes in node.replicas:
            replica.node_online = node.online
            _feed(replica, [by_index.get(i) for i in indexes], now)

    def _takes_over(self, node: _Node, batch: GpuBatch) -> bool:
        """Whether a batch of a session below the current one takes over: its session has
        sent STALE_PERIODS batches in order while the current one sent nothing for as many
        of the challenger's periods."""
        if node.challenger == batch.session and batch.seq > node.challenger_seq:
            node.challenger_run += 1
        else:
            node.challenger, node.challenger_run = batch.session, 1
        node.challenger_seq = batch.seq
        quiet_s = None if node.received_at is None else self.clock() - node.received_at
        silent = quiet_s is None or quiet_s > STALE_PERIODS * batch.period_s
        return silent and node.challenger_run >= STALE_PERIODS

    # ---- the view --------------------------------------------------------------------------

    def status(self) -> TelemetryStatus:
        """The feed now, for the console, ``ctl`` and the admin API."""
        now = self.clock()
        return TelemetryStatus(
            broker=self._state,
            broker_url=self.target.url,
            nodes=tuple(_feed_view(n, now) for n in self._nodes.values()),
            dropped_unknown=self._unknown,
            since_connect_s=None if self._connected_at is None else now - self._connected_at,
            errors=tuple(self._errors),
            ignored=self._ignored,
            overflowed=self._overflow.count,
            drop_reasons=self._drop_reasons(),
        )

    def _drop_reasons(self) -> dict[str, int]:
        reasons = dict.fromkeys(DROP_REASONS, 0)
        for node in self._nodes.values():
            for reason, count in node.drops.items():
                reasons[reason] += count
        reasons["unknown_node"] += self._unknown
        return reasons


class _OverflowCounter(logging.Filter):
    """Counts (and silences) the client's "queue is full" drops: when the subscriber falls
    behind, excess messages are discarded one by one, and a log line each would flood."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Message queue is full"):
            self.count += 1
            return False
        return True


def _feed(replica: Replica, gpus: list[GpuSample | None], now: float) -> None:
    """Set a replica's telemetry from its GPUs; left alone (to go stale) if none reads."""
    utils = [
        g.gpu_util_pct for g in gpus if g is not None and not g.lost and g.gpu_util_pct is not None
    ]
    if not utils or len(utils) != len(gpus):
        return  # a GPU of it is lost or unread: better stale than half-true
    used = total = 0
    for g in gpus:
        if g is not None and g.fb_used_mib is not None and g.fb_total_mib:
            used += g.fb_used_mib
            total += g.fb_total_mib
    utilization = sum(utils) / len(utils) / 100.0
    memory = used / total if total else None
    names = {g.name for g in gpus if g is not None}
    name = names.pop() if len(names) == 1 else None
    t = replica.telemetry
    if t is None:
        replica.telemetry = Telemetry(utilization, now, memory, gpu_name=name)
    else:
        t.utilization, t.received_at, t.memory_used_fraction = utilization, now, memory
        t.gpu_name = name


def _feed_view(node: _Node, now: float) -> NodeFeed:
    age = None if node.received_at is None else now - node.received_at
    return NodeFeed(
        node=node.name,
        online=node.online,
        age_s=age,
        stale=age is not None and age > STALE_PERIODS * node.period_s,
        session=node.session,
        restarts=node.restarts,
        samples=node.samples,
        lost_samples=node.lost,
        dropped=node.dropped,
        last_error=node.last_error,
        period_s=node.period_s,
        gpus=node.gpus,
        inventory=node.inventory,
        agent_version=node.agent_version,
        driver=node.driver,
    )


def _target(
    fleet: FleetConfig, broker: BrokerConfig | BrokerTarget | str, environ: Mapping[str, str] | None
) -> BrokerTarget:
    if isinstance(broker, BrokerTarget):
        return broker
    if isinstance(broker, str):
        return resolve_target(fleet.broker, url=broker, environ=environ)
    if broker.url == "embedded":
        raise TelemetryError("start the embedded broker first and pass its URL as broker=")
    return resolve_target(broker, environ=environ)
