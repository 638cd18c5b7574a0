"""What one router process hears over MQTT: the GPUs' telemetry and the operators' commands.

:class:`RouterFeeds` starts, over the fleet's broker (for ``broker.url: embedded``, a broker of
gpurouter's own on loopback, in a process of its own), the
:class:`~router.telemetry.subscriber.TelemetrySubscriber` that feeds the core, and, when asked,
the :class:`~router.telemetry.control_topics.ControlLink` that applies the desired state
operators publish (signed, bounded, kept on disk: the fleet file's ``control`` section). A
feed that cannot start is reported, not fatal: the router then routes on its own accounting.
``gpurouter serve`` runs both; the console runs the telemetry feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from router.config.schema import BrokerConfig, FleetConfig
from router.control import Applied, Command, ControlSurface, command_name
from router.telemetry.status import DISABLED, BrokerState, TelemetryStatus

if TYPE_CHECKING:
    from router.telemetry.control_topics import ControlLink
    from router.telemetry.embedded_broker import EmbeddedBroker
    from router.telemetry.subscriber import TelemetrySubscriber

__all__ = ["RouterFeeds"]

log = logging.getLogger("gpurouter.telemetry")

CONNECT_WAIT_S = 5.0
"""How long start() waits for the broker before it lets the clients retry on their own."""


class RouterFeeds:
    """The broker (when embedded), the telemetry subscriber and the control link of one
    router, started and stopped together."""

    def __init__(
        self,
        fleet: FleetConfig,
        surface: ControlSurface,
        *,
        control: bool = True,
        router_id: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.fleet = fleet
        self.surface = surface
        self.want_control = control
        self.router_id = router_id
        self.environ = environ
        self.broker: EmbeddedBroker | None = None
        self.subscriber: TelemetrySubscriber | None = None
        self.link: ControlLink | None = None
        self.notes: list[str] = []
        """What happened at start, one line each, for the console or the log."""

    async def apply(self, command: Command, actor: str) -> Applied:
        """A command given to this router: published as the cluster's desired state, so
        that every router applies it, while the control link is up (with who acknowledged
        it); else applied here alone, and the log says so. TimeoutError if the broker did
        not bring it back."""
        from router.telemetry.control_topics import NotLinkedError

        if self.link is not None:
            with contextlib.suppress(NotLinkedError):
                return await self.link.publish_command(command, actor)
        event = self.surface.apply(command, actor=actor)
        if self.link is not None:
            log.warning("control link down: %s applied on this router only", command_name(command))
        return Applied(event)

    def status(self) -> TelemetryStatus:
        """The telemetry feed's status, with the control link's counters when it runs."""
        if self.subscriber is None:
            return DISABLED
        status = self.subscriber.status()
        if self.link is None:
            return status
        return dataclasses.replace(status, control=self.link.status())

    async def start(self) -> None:
        from router.telemetry.control_topics import ControlLink
        from router.telemetry.embedded_broker import EmbeddedBroker
        from router.telemetry.subscriber import TelemetrySubscriber

        target: BrokerConfig | str = self.fleet.broker
        try:
            if self.fleet.broker.url == "embedded":
                self.broker = EmbeddedBroker()
                target = await self.broker.start()
                self.notes.append(f"embedded MQTT broker on {target}")
            core = self.surface.core
            self.subscriber = TelemetrySubscriber(
                self.fleet, core, broker=target, environ=self.environ
            )
            await self.subscriber.start()
            if self.want_control:
                link = ControlLink.from_fleet(
                    self.surface,
                    target=self.subscriber.target,
                    environ=self.environ,
                    router_id=self.router_id,
                )
                await link.start()
                self.link = link
                signed = "signed" if link.secret is not None else "NOT authenticated"
                self.notes.append(f"control link as {link.router_id} ({signed} commands)")
            if not await self._connected(CONNECT_WAIT_S):
                self.notes.append(f"broker not reached within {CONNECT_WAIT_S:g} s; retrying")
        except Exception as exc:  # the router routes without them; say why it has none
            self.notes.append(f"telemetry could not start: {exc}")
            await self.stop()

    async def _connected(self, wait_s: float) -> bool:
        """Whether both clients are connected, waiting up to ``wait_s``. Started means
        connected where the broker answers: a stop during the MQTT client's connect
        raises inside aiomqtt's callbacks, after the task is gone."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while not self._all_connected():
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def _all_connected(self) -> bool:
        subscriber = self.subscriber
        if subscriber is None or subscriber.status().broker is not BrokerState.CONNECTED:
            return False
        return self.link is None or self.link.connected

    async def stop(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            await link.stop()
        subscriber, self.subscriber = self.subscriber, None
        if subscriber is not None:
            await subscriber.stop()
        broker, self.broker = self.broker, None
        if broker is not None:
            await broker.stop()
