"""The console's one seam to the router: read a snapshot, apply a command, nothing else.

The console never contains the router. It is handed a :class:`Backend`, of which there are
two: :class:`ConsoleBackend` holds the router core, its control surface and callables for
telemetry, so tests build one around a core they drive by hand and ``gpurouter console``
builds one around the router it starts in the same process (:mod:`console.router_host`);
:class:`console.attach.backend.RemoteBackend` reads and steers a router running elsewhere
through its admin API (``gpurouter console --attach URL``). Everything the widgets show
comes through here; every change goes through :meth:`Backend.apply`, which the router's
control surface validates, applies and writes to the audit trail with the console as actor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from console.attach.link import Link
from console.rollout.model import (
    RolloutPreview,
    RolloutProgress,
    preview_from_json,
    progress_from_json,
)
from console.rollout.split_model import SplitState, split_from_json
from router.config.schema import FleetConfig
from router.control import Command, ControlSurface, Event
from router.core import RouterCore
from router.errors import ControlError, RolloutError
from router.in_flight import InFlight, in_flight
from router.snapshot import FleetSnapshot
from router.strategies import Explanation
from router.telemetry.schema import GpuSample
from router.telemetry.status import (
    DISABLED,
    NO_ENGINE_METRICS,
    EngineMetricsStatus,
    TelemetryStatus,
)

if TYPE_CHECKING:
    from console.cluster.watch import ClusterWatch
    from router.rollout.manager import RolloutManager

GpuKey = tuple[str, int]
"""A GPU: its node's name and its NVML index on that node."""


class RouterHost(Protocol):
    """Whatever runs the router's own tasks (HTTP server, timers) in the console's loop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Backend(Protocol):
    """What the console reads from a router and sends to it, wherever the router runs."""

    front_url: str | None
    """The router's OpenAI-compatible front door, when known."""
    admin_url: str | None
    """The router's admin API (what ``gpurouter ctl --admin`` takes), when it serves one."""
    notes: list[str]
    """Facts worth an operator's attention at start, written to the events pane."""

    @property
    def fleet(self) -> FleetConfig:
        """The fleet's nodes, GPUs and replicas, and the console's settings."""
        ...

    @property
    def refusal(self) -> str | None:
        """Why this backend sends no command at all (read-only); None when it sends them."""
        ...

    @property
    def link(self) -> Link | None:
        """The connection to a router elsewhere; None for a router in this process."""
        ...

    @property
    def cluster(self) -> ClusterWatch | None:
        """The cluster's broker, watched (``--broker``); None when none is."""
        ...

    def snapshot(self) -> FleetSnapshot: ...

    def strategy(self) -> str:
        """The routing strategy now (cheaper than a whole snapshot)."""
        ...

    def telemetry(self) -> TelemetryStatus: ...

    def samples(self, status: TelemetryStatus) -> Mapping[GpuKey, GpuSample]: ...

    def failing(self) -> frozenset[str]: ...

    def engine_metrics(self) -> EngineMetricsStatus:
        """Replicas whose engine /metrics page could not be read, or carried values refused
        as nonsense (the router's engine /metrics poller)."""
        ...

    def apply(self, command: Command) -> Event | Awaitable[Event]:
        """The event saying what happened: at once in-process; attached, once the router
        answered (a :class:`~router.errors.GpuRouterError` when it could not be asked)."""
        ...

    def audit(self) -> list[Event]: ...

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` with each new event; the answer unsubscribes."""
        ...

    def decisions(self, replica_id: str, limit: int = 20) -> list[Explanation] | None:
        """The newest routing decisions that chose ``replica_id``, newest first; None while
        they are not known yet (an attached console has not fetched them)."""
        ...

    def expect_detail(self, replica_id: str) -> None:
        """``replica_id``'s detail may open next (its row is selected): an attached console
        keeps its decisions fetched, so the detail opens with them drawn."""
        ...

    def in_flight(self, replica_id: str) -> list[InFlight]: ...

    # ---- model rollouts (docs/rollouts.md): each refusal is a GpuRouterError -------------

    def rollout(self) -> RolloutProgress | None:
        """The rollout going, or the last one; None before the first (cheap: read at every
        refresh)."""
        ...

    async def rollout_preview(self, version: str, settings: Mapping[str, Any]) -> RolloutPreview:
        """What a start would do now (the plan), starting nothing; the planner's refusal (a
        floor that cannot be kept, a bad setting) is the error's message."""
        ...

    async def rollout_start(self, version: str, settings: Mapping[str, Any]) -> RolloutProgress:
        """Plan and start a rollout of ``version`` (the settings over the fleet file's)."""
        ...

    async def rollout_act(self, action: str) -> RolloutProgress:
        """``pause``, ``resume``, ``abort`` or ``rollback``: the rollout's state after it."""
        ...

    # ---- traffic splits: a canary, or the fleet file's blue-green set (docs/rollouts.md) ----

    def split(self) -> SplitState | None:
        """The canary going or the last one, or the fleet file's blue-green set; None when
        there is neither (cheap: read at every refresh)."""
        ...

    async def split_act(self, body: Mapping[str, Any]) -> SplitState | None:
        """One of the admin API's split actions, as ``POST /admin/split`` takes it
        (``{"action": "canary", "version": V, ...}``, ``{"action": "step", "percent": P}``,
        ``promote``, ``abort``, ``switch``, ``switch back``, ``release``): the split after it."""
        ...


NO_ROLLOUTS = "this router runs no rollouts"


def samples_from(status: TelemetryStatus) -> dict[GpuKey, GpuSample]:
    """Every GPU reading in a telemetry status, by (node, index)."""
    return {(feed.node, g.index): g for feed in status.nodes for g in feed.gpus}


def _disabled() -> TelemetryStatus:
    return DISABLED


def _none_failing() -> frozenset[str]:
    return frozenset()


def _no_engine_metrics() -> EngineMetricsStatus:
    return NO_ENGINE_METRICS


@dataclass(slots=True)
class ConsoleBackend:
    """The router in this process, as the console sees it."""

    core: RouterCore
    control: ControlSurface
    telemetry: Callable[[], TelemetryStatus] = _disabled
    """The telemetry feed's status now; DISABLED when the router runs without one."""
    gpu_samples: Callable[[], Mapping[GpuKey, GpuSample]] | None = None
    """Latest per-GPU readings; by default, those carried in ``telemetry()``."""
    failing: Callable[[], frozenset[str]] = _none_failing
    """Replicas whose latest request or health check failed (the router's health monitor)."""
    engine_metrics: Callable[[], EngineMetricsStatus] = _no_engine_metrics
    """What the router's engine /metrics poller could not take; nothing where it runs none."""
    front_url: str | None = None
    """The router's OpenAI-compatible front door, when it serves one."""
    admin_url: str | None = None
    """The router's admin API (what ``gpurouter ctl --admin`` takes), when it serves one."""
    host: RouterHost | None = None
    """Started when the console mounts and stopped when it exits."""
    actor: str = "console"
    """The name the audit trail records for this console's commands."""
    notes: list[str] = field(default_factory=list)
    """Facts worth an operator's attention at start (e.g. how the router was built)."""

    rollouts: RolloutManager | None = None
    """The router's rollouts (``RouterServer.rollouts``); None where it runs none."""

    refusal: str | None = None
    link: Link | None = None
    cluster: ClusterWatch | None = None

    @property
    def fleet(self) -> FleetConfig:
        return self.core.fleet

    def snapshot(self) -> FleetSnapshot:
        return self.core.snapshot()

    def strategy(self) -> str:
        return self.core.strategy.name

    def samples(self, status: TelemetryStatus) -> Mapping[GpuKey, GpuSample]:
        if self.gpu_samples is not None:
            return self.gpu_samples()
        return samples_from(status)

    def apply(self, command: Command) -> Event:
        """Apply through the control surface; the event says what happened."""
        return self.control.apply(command, self.actor)

    def audit(self) -> list[Event]:
        return list(self.control.audit)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        return self.control.subscribe(listener)

    def decisions(self, replica_id: str, limit: int = 20) -> list[Explanation]:
        """The newest routing decisions that chose ``replica_id``, newest first."""
        out = [d for d in reversed(self.core.decisions) if d.chosen == replica_id]
        return out[:limit]

    def expect_detail(self, replica_id: str) -> None:
        """Nothing to fetch: the decisions are in this process."""

    def in_flight(self, replica_id: str) -> list[InFlight]:
        """What runs on the replica now; empty for an unknown replica."""
        try:
            replica = self.core.replica(replica_id)
        except ControlError:
            return []
        return in_flight(self.core, replica)

    def rollout(self) -> RolloutProgress | None:
        status = None if self.rollouts is None else self.rollouts.status()
        return None if status is None else progress_from_json(status)

    async def rollout_preview(self, version: str, settings: Mapping[str, Any]) -> RolloutPreview:
        return preview_from_json((await self._rollouts().preview(version, settings)).to_dict())

    async def rollout_start(self, version: str, settings: Mapping[str, Any]) -> RolloutProgress:
        self._rollouts().start(version, settings, self.actor)
        return self._now()

    async def rollout_act(self, action: str) -> RolloutProgress:
        await self._rollouts().act(action, self.actor)
        return self._now()

    def split(self) -> SplitState | None:
        status = None if self.rollouts is None else self.rollouts.splits.status()
        return None if status is None else split_from_json(status)

    async def split_act(self, body: Mapping[str, Any]) -> SplitState | None:
        action = body.get("action")
        if not isinstance(action, str):
            raise RolloutError("a split action needs `action`")
        await self._rollouts().splits.act(action, body, self.actor)
        return self.split()

    def _rollouts(self) -> RolloutManager:
        if self.rollouts is None:
            raise RolloutError(NO_ROLLOUTS)
        return self.rollouts

    def _now(self) -> RolloutProgress:
        progress = self.rollout()
        assert progress is not None  # the manager has just started or steered one
        return progress
