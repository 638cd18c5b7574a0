"""The console's one seam to the router: read a snapshot, apply a command, nothing else.

The console never contains the router. It is handed a :class:`ConsoleBackend` that holds the
router core, its control surface and callables for telemetry, so tests build one around a
core they drive by hand and ``gpurouter console`` builds one around the router it starts in
the same process (:mod:`console.router_host`). Everything the widgets show comes through
here; every change goes through :meth:`ConsoleBackend.apply`, which the control surface
validates, applies and writes to the audit trail with the console as the actor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from router.control import Command, ControlSurface, Event
from router.core import RouterCore
from router.errors import ControlError
from router.request import Priority
from router.snapshot import FleetSnapshot
from router.strategies import Explanation
from router.telemetry.schema import GpuSample
from router.telemetry.status import DISABLED, TelemetryStatus

GpuKey = tuple[str, int]
"""A GPU: its node's name and its NVML index on that node."""


class RouterHost(Protocol):
    """Whatever runs the router's own tasks (HTTP server, timers) in the console's loop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class InFlight:
    """One request running on a replica, as a confirmation shows it."""

    request_id: str
    priority: str
    streaming: bool
    """Its first byte has reached the client: it cannot be re-run elsewhere."""


def samples_from(status: TelemetryStatus) -> dict[GpuKey, GpuSample]:
    """Every GPU reading in a telemetry status, by (node, index)."""
    return {(feed.node, g.index): g for feed in status.nodes for g in feed.gpus}


def _disabled() -> TelemetryStatus:
    return DISABLED


def _none_failing() -> frozenset[str]:
    return frozenset()


@dataclass(slots=True)
class ConsoleBackend:
    """The router as the console sees it."""

    core: RouterCore
    control: ControlSurface
    telemetry: Callable[[], TelemetryStatus] = _disabled
    """The telemetry feed's status now; DISABLED when the router runs without one."""
    gpu_samples: Callable[[], Mapping[GpuKey, GpuSample]] | None = None
    """Latest per-GPU readings; by default, those carried in ``telemetry()``."""
    failing: Callable[[], frozenset[str]] = _none_failing
    """Replicas whose latest request or health check failed (the router's health monitor)."""
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

    def snapshot(self) -> FleetSnapshot:
        return self.core.snapshot()

    def samples(self, status: TelemetryStatus) -> Mapping[GpuKey, GpuSample]:
        if self.gpu_samples is not None:
            return self.gpu_samples()
        return samples_from(status)

    def apply(self, command: Command) -> Event:
        """Apply through the control surface; the event says what happened."""
        return self.control.apply(command, self.actor)

    def audit(self) -> list[Event]:
        return list(self.control.audit)

    def decisions(self, replica_id: str, limit: int = 20) -> list[Explanation]:
        """The newest routing decisions that chose ``replica_id``, newest first."""
        out = [d for d in reversed(self.core.decisions) if d.chosen == replica_id]
        return out[:limit]

    def in_flight(self, replica_id: str) -> list[InFlight]:
        """What runs on the replica now; empty for an unknown replica."""
        try:
            replica = self.core.replica(replica_id)
        except ControlError:
            return []
        running = self.core.running
        out = []
        for rid, req in replica.running.items():
            attempt = running.get(rid)
            streaming = attempt is not None and attempt.first_byte is not None
            out.append(InFlight(rid, Priority(req.priority).name.lower(), streaming))
        return out
