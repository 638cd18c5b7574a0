"""The router that ``gpurouter console`` runs in its own process, on the console's loop.

:class:`LocalRouter` starts the full data plane (:class:`router.http.server.RouterServer`:
front door, admin API, upstream pool, health checks) and, unless told not to, the telemetry
feed: the embedded MQTT broker in a process of its own (off the console's loop, as
docs/telemetry.md advises) or the fleet's broker, and the subscriber that feeds the core.
A telemetry feed that cannot start is reported in the console, not fatal: the router then
routes on its own accounting, which the dashboard marks as such.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from console.backend import ConsoleBackend
from router.config.schema import FleetConfig
from router.telemetry.status import DISABLED, TelemetryStatus

if TYPE_CHECKING:
    from router.http.server import RouterServer
    from router.telemetry.feeds import RouterFeeds


class LocalRouter:
    """RouterServer plus its telemetry feed, started and stopped together."""

    def __init__(
        self,
        fleet: FleetConfig,
        *,
        telemetry: bool = True,
        listen: str | None = None,
        admin_listen: str | None = None,
    ) -> None:
        # Imported here: uvicorn and aiomqtt are not needed to build the CLI parser.
        from router.http.admin import admin_token
        from router.http.server import RouterServer

        self.fleet = fleet
        self.want_telemetry = telemetry
        self.server: RouterServer = RouterServer(
            fleet,
            listen=listen,
            admin_listen=admin_listen,
            # Read first: an unset variable is its own error, whatever the address.
            admin_token=admin_token(fleet),
            telemetry=self.telemetry,
        )
        self.feeds: RouterFeeds | None = None
        self.notes: list[str] = []
        self._backend: ConsoleBackend | None = None

    def telemetry(self) -> TelemetryStatus:
        return DISABLED if self.feeds is None else self.feeds.status()

    def backend(self) -> ConsoleBackend:
        """The console's view of this router; its addresses are filled in when it starts."""
        if self._backend is None:
            self._backend = ConsoleBackend(
                self.server.core,
                self.server.control,
                telemetry=self.telemetry,
                failing=self.server.health.failing,
                engine_metrics=self.server.engine_metrics.status,
                host=self,
                rollouts=self.server.rollouts,
                notes=self.notes,
            )
        return self._backend

    async def start(self) -> None:
        await self.server.start()
        # Known only now: a listener on port 0 has just been given its port.
        backend = self.backend()
        backend.front_url, backend.admin_url = self.server.front_url, self.server.admin_url
        self.notes.append(f"router serving {self.server.front_url} (admin {self.server.admin_url})")
        if self.want_telemetry:
            await self._start_telemetry()
        else:
            self.notes.append("telemetry off (--no-telemetry)")

    async def _start_telemetry(self) -> None:
        from router.telemetry.feeds import RouterFeeds

        # Its operator steers it from the keyboard; `gpurouter serve` runs the MQTT control link.
        self.feeds = RouterFeeds(self.fleet, self.server.control, control=False)
        await self.feeds.start()
        self.notes.extend(self.feeds.notes)

    async def stop(self) -> None:
        if self.feeds is not None:
            await self.feeds.stop()
        await self.server.stop()
