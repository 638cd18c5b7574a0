"""``GET /admin/state`` and ``GET /admin/fleet`` as the types the console's views take.

:func:`state_from_json` is the one conversion of the admin API's state: the snapshot
(``FleetSnapshot.to_dict()``), the telemetry feed, the health monitor's failing replicas, the
engine /metrics poller's troubles and the requests running on each replica, each rebuilt by
:func:`~console.attach.rebuild.rebuild`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from console.attach.rebuild import rebuild
from router.config.schema import ConsoleConfig, FleetConfig, NodeConfig
from router.in_flight import InFlight
from router.snapshot import FleetSnapshot
from router.telemetry.status import (
    DISABLED,
    NO_ENGINE_METRICS,
    EngineMetricsStatus,
    TelemetryStatus,
)

__all__ = ["RemoteState", "fleet_from_json", "state_from_json"]


@dataclass(frozen=True, slots=True)
class RemoteState:
    """What one ``GET /admin/state?running=1`` said."""

    snapshot: FleetSnapshot
    telemetry: TelemetryStatus = DISABLED
    """DISABLED when the router runs without a telemetry feed (the key is absent)."""
    failing: frozenset[str] = frozenset()
    """Replicas whose latest request or health check failed."""
    running: Mapping[str, tuple[InFlight, ...]] = field(default_factory=dict)
    engine_metrics: EngineMetricsStatus = NO_ENGINE_METRICS
    """NO_ENGINE_METRICS when the router polls no engine /metrics (the key is absent)."""


def state_from_json(data: Mapping[str, Any]) -> RemoteState:
    """The admin state as parsed from JSON; ValueError when it is not one."""
    telemetry = data.get("telemetry")
    engines = data.get("engine_metrics")
    health = data.get("health") or {}
    running = data.get("running") or {}
    if not isinstance(health, Mapping) or not isinstance(running, Mapping):
        raise ValueError("state: `health` and `running` must be JSON objects")
    return RemoteState(
        snapshot=rebuild(FleetSnapshot, data),
        telemetry=DISABLED if telemetry is None else rebuild(TelemetryStatus, telemetry),
        failing=frozenset(
            rid
            for rid, h in health.items()
            if isinstance(h, Mapping) and h.get("answered") is False
        ),
        running={
            rid: tuple(rebuild(InFlight, item) for item in _list(items, rid))
            for rid, items in running.items()
        },
        engine_metrics=(
            NO_ENGINE_METRICS if engines is None else rebuild(EngineMetricsStatus, engines)
        ),
    )


def fleet_from_json(data: Mapping[str, Any]) -> FleetConfig:
    """``GET /admin/fleet``'s answer as a fleet: its shape and console settings, the rest
    (broker, listeners) at their defaults, which an attached console does not use."""
    nodes = _list(data.get("nodes"), "nodes")
    return FleetConfig(
        nodes=tuple(rebuild(NodeConfig, node) for node in nodes),
        cluster=rebuild(str, data.get("cluster")) if "cluster" in data else "default",
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        console=rebuild(ConsoleConfig, data.get("console") or {}),
    )


def _list(items: object, where: str) -> list[Any]:
    if not isinstance(items, list):
        raise ValueError(f"{where}: expected a JSON array")
    return items
