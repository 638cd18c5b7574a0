"""Operators' side of the control topics: commands published as desired state.

:class:`ControlPublisher` (for ``gpurouter ctl``, the console and scripts) publishes each
command retained, QoS 1, on its slot's topic, versioned by the wall clock in milliseconds and
signed when given the routers' secret; :func:`publish_command` does it once and disconnects.
``control_topics`` describes what the routers do with it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiomqtt

from router.config.schema import BrokerConfig, ControlConfig
from router.control import Command, parse_command
from router.errors import TelemetryError
from router.telemetry import control_auth
from router.telemetry.connection import BrokerTarget, make_client, publish, resolve_target
from router.telemetry.control_messages import encode_desired, slot_of, valid_origin
from router.telemetry.topics import Topics

__all__ = ["ControlPublisher", "publish_command"]


class ControlPublisher:
    """Sends operator commands as desired state (for ``gpurouter ctl`` and the console)."""

    def __init__(
        self,
        target: BrokerTarget,
        cluster: str,
        *,
        origin: str = "operator",
        wall_clock: Callable[[], float] = time.time,
        secret: bytes | None = None,
    ) -> None:
        if not valid_origin(origin):
            raise TelemetryError(f"origin {origin!r}: 1-64 of letters, digits, . @ : _ -")
        self.target = target
        self.topics = Topics(cluster)
        self.origin = origin
        self.wall_clock = wall_clock
        self.secret = secret
        """Signs every command when set (routers with a secret drop unsigned ones)."""
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
        topic = self.topics.desired(slot_of(cmd))
        payload = encode_desired(
            cmd, version, self.origin, self.wall_clock(), topic=topic, secret=self.secret
        )
        try:
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
    secret: bytes | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Publish one command as desired state and disconnect; the version it got.

    ``broker`` is a resolved target or a ``mqtt://`` URL (credentials from the environment).
    Without ``secret``, the command is signed with ``GPUROUTER_CONTROL_SECRET`` when it is set.
    """
    if isinstance(broker, str):
        broker = resolve_target(BrokerConfig(), url=broker, environ=environ)
    target = broker
    if secret is None:
        secret = control_auth.resolve_secret(ControlConfig(), environ)
    async with ControlPublisher(target, cluster, origin=origin, secret=secret) as publisher:
        return await publisher.publish(command)
