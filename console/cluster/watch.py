"""One cluster heard on its broker: every node's GPU telemetry and every router's messages.

:class:`ClusterWatch` runs, over one broker, the router's own
:class:`~router.telemetry.subscriber.TelemetrySubscriber` (without a core: it feeds no
replica, it reports) and a :class:`~router.telemetry.router_watch.RouterWatch`. Both discover
what speaks: nodes the fleet does not name (or all of them, for ``--broker`` alone, where
there is no fleet) and every router. Each connects and reconnects on its own, with backoff.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from router.clock import Clock
from router.config.schema import FleetConfig
from router.telemetry.connection import resolve_target
from router.telemetry.router_watch import RoutersStatus, RouterWatch
from router.telemetry.status import TelemetryStatus
from router.telemetry.subscriber import TelemetrySubscriber

__all__ = ["ClusterWatch"]


class ClusterWatch:
    """The nodes and routers of ``fleet.cluster`` on the broker at ``url``."""

    def __init__(
        self,
        url: str,
        fleet: FleetConfig,
        *,
        clock: Clock = time.monotonic,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """A :class:`~router.errors.TelemetryError` when ``url`` is not a broker's URL (or a
        password variable the fleet names is not set)."""
        target = resolve_target(fleet.broker, url=url, environ=environ)
        self.url = target.url
        self.cluster = fleet.cluster
        self.nodes = TelemetrySubscriber(fleet, None, broker=target, clock=clock, discover=True)
        self.routers_watch = RouterWatch(target, fleet.cluster, clock=clock)

    def telemetry(self) -> TelemetryStatus:
        return self.nodes.status()

    def routers(self) -> RoutersStatus:
        return self.routers_watch.status()

    async def start(self) -> None:
        await self.nodes.start()
        await self.routers_watch.start()

    async def stop(self) -> None:
        await self.routers_watch.stop()
        await self.nodes.stop()
