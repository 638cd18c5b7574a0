"""What the router knows of its telemetry feed, control link and engines' /metrics, as plain
frozen data.

The MQTT subscriber, the control link and the engine /metrics poller keep this up to date;
the console, ``gpurouter ctl status``, the admin API and /metrics read it. Ages are measured
on the router's own monotonic clock at arrival, never from timestamps in payloads, so a node
with a wrong clock cannot look fresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from router.telemetry.schema import GpuInventory, GpuSample


class BrokerState(StrEnum):
    DISABLED = "disabled"
    """No broker configured for this process (telemetry off)."""
    CONNECTING = "connecting"
    """Trying to connect for the first time."""
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    """The connection was lost; retrying with backoff."""


@dataclass(frozen=True, slots=True)
class NodeFeed:
    """One node's telemetry as the router has received it."""

    node: str
    online: bool
    """The agent's last status said ``online`` (its will or its clean exit says ``offline``)."""
    age_s: float | None
    """Seconds since the node's last GPU sample arrived; None if none ever did."""
    stale: bool
    """No sample for more than 3 sample periods: its readings are not trusted."""
    session: int | None
    """The agent's session number (grows with each connect)."""
    restarts: int
    """New sessions seen after the first one."""
    samples: int
    """GPU batches applied."""
    lost_samples: int
    """Sequence numbers skipped within a session (messages the broker or network lost)."""
    dropped: int
    """Payloads from this node that were malformed, oversized or of a wrong version."""
    last_error: str | None = None
    """Why the latest dropped payload was refused."""
    period_s: float | None = None
    """The sample period the agent announces (the fleet's until it has announced one)."""
    gpus: tuple[GpuSample, ...] = ()
    """The latest reading of each GPU, as the agent sent it."""
    inventory: tuple[GpuInventory, ...] = ()
    """The GPUs the agent's last birth message listed."""
    agent_version: str | None = None
    driver: str | None = None
    """NVIDIA driver version the agent reported (None on emulated nodes)."""


@dataclass(frozen=True, slots=True)
class ControlLinkStatus:
    """A router's link to the control topics: what it applied and what it dropped."""

    router: str
    connected: bool
    authenticated: bool
    """Control messages must carry a good signature (a shared secret is set)."""
    slots: int
    """Desired-state slots with an applied command."""
    refused: Mapping[str, int]
    """Messages dropped, by reason: ``oversized``, ``malformed``, ``unsigned``,
    ``bad_signature``, ``wrong_slot``, ``future_version``, ``too_many_slots``, ``overflow``."""
    stale: int
    """Messages older than the command applied on their slot (ignored)."""
    restored: int
    """Commands applied from the state file when the link started."""
    last_refusal: str | None = None
    """Why the latest dropped message was dropped."""
    state_file: str | None = None
    """Where the applied desired state is kept (None: it is not kept)."""
    state_errors: int = 0
    """Times the state file could not be read or written."""
    last_state_error: str | None = None
    routers: tuple[str, ...] = ()
    """The cluster's routers heard from lately (their stats): those whose acknowledgement
    a command given to this router waits for."""

    @property
    def dropped(self) -> int:
        return sum(self.refused.values())


@dataclass(frozen=True, slots=True)
class TelemetryStatus:
    """The whole feed: the broker connection and every node the fleet names or that spoke."""

    broker: BrokerState
    broker_url: str | None
    nodes: tuple[NodeFeed, ...] = ()
    dropped_unknown: int = 0
    """Payloads on topics of nodes the fleet does not name, or unreadable topics."""
    since_connect_s: float | None = None
    """Seconds since the current connection was made (None when not connected)."""
    errors: tuple[str, ...] = field(default=())
    """Recent connection errors, newest last (bounded)."""
    ignored: int = 0
    """Messages on topics the subscriber did not ask for (amqtt may deliver some); unread."""
    overflowed: int = 0
    """Messages discarded unread because the subscriber fell behind (its queue is bounded)."""
    drop_reasons: Mapping[str, int] = field(default_factory=dict)
    """Every payload dropped, by reason (they add up to :attr:`dropped`): ``not_bytes``,
    ``oversized``, ``malformed``, ``wrong_node``, ``older_session``, ``repeated_seq``,
    ``unknown_node``."""
    control: ControlLinkStatus | None = None
    """The control link's counters, where this router runs one (whoever serves this status
    adds them: ``dataclasses.replace(subscriber.status(), control=link.status())``)."""

    @property
    def dropped(self) -> int:
        """Every payload dropped, whichever node it claimed to come from."""
        return self.dropped_unknown + sum(n.dropped for n in self.nodes)


DISABLED = TelemetryStatus(BrokerState.DISABLED, None)
"""The status of a router that runs without telemetry."""


@dataclass(frozen=True, slots=True)
class EngineMetricsStatus:
    """What the engine /metrics poller (router/telemetry/engine_metrics.py) could not take, per
    replica id: a page it could not read, and values it refused as nonsense (each field kept
    at its last good value)."""

    errors: Mapping[str, str] = field(default_factory=dict)
    """Why the replica's latest poll failed (absent once one succeeds)."""
    rejected: Mapping[str, int] = field(default_factory=dict)
    """How many values the replica's pages carried that were refused as nonsense."""
    last_rejection: Mapping[str, str] = field(default_factory=dict)
    """The latest refused value and why (kept after later good pages)."""
    refusing: tuple[str, ...] = ()
    """Replicas whose latest page read carried a value refused as nonsense: a broken exporter
    now, where ``rejected`` counts since the router started."""


NO_ENGINE_METRICS = EngineMetricsStatus()
"""The status of a router that polls no engine /metrics (or found nothing wrong)."""
