"""Helpers for the HTTP data plane's tests (no tests here): a router in front of emulated
replicas on loopback, with the router's settings given per test."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from openai import AsyncOpenAI

from router.config.schema import (
    FleetConfig,
    HealthConfig,
    QueueConfig,
    RetryConfig,
    RouterConfig,
    ServerConfig,
    TimeoutConfig,
)
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from tests.test_emulator_support import MODEL, Spec, any_ports, fleet_config

__all__ = ["MODEL", "Spec", "openai_client", "routed", "routed_fleet", "with_endpoints"]

QUIET_HEALTH = HealthConfig(
    check_interval_s=0.0, eject_after_failures=0, engine_metrics_interval_s=0.0
)
"""No active checks, no ejection, no engine-metrics polling: tests that want them say so."""


def with_endpoints(config: FleetConfig, emulated: EmulatedFleet) -> FleetConfig:
    """The fleet with every replica's endpoint pointing at its emulated server."""
    nodes = tuple(
        dataclasses.replace(
            n,
            replicas=tuple(dataclasses.replace(r, endpoint=emulated.url(r.id)) for r in n.replicas),
        )
        for n in config.nodes
    )
    return dataclasses.replace(config, nodes=nodes)


def routed_fleet(
    config: FleetConfig,
    emulated: EmulatedFleet,
    *,
    batch_size: int | None = None,
    queue: QueueConfig | None = None,
    retries: RetryConfig | None = None,
    timeouts: TimeoutConfig | None = None,
    health: HealthConfig = QUIET_HEALTH,
    server: ServerConfig | None = None,
    strategy: str | None = None,
) -> FleetConfig:
    fleet = with_endpoints(config, emulated)
    if batch_size is not None:
        fleet = dataclasses.replace(
            fleet,
            nodes=tuple(
                dataclasses.replace(
                    n,
                    replicas=tuple(
                        dataclasses.replace(r, batch_size=batch_size) for r in n.replicas
                    ),
                )
                for n in fleet.nodes
            ),
        )
    router: RouterConfig = fleet.router
    changes: dict[str, Any] = {"health": health}
    if queue is not None:
        changes["queue"] = queue
    if retries is not None:
        changes["retries"] = retries
    if timeouts is not None:
        changes["timeouts"] = timeouts
    if strategy is not None:
        changes["strategy"] = dataclasses.replace(router.strategy, name=strategy)
    fleet = dataclasses.replace(fleet, router=dataclasses.replace(router, **changes))
    if server is not None:
        fleet = dataclasses.replace(fleet, server=server)
    return fleet


@asynccontextmanager
async def routed(
    specs: Sequence[Spec],
    *,
    time_scale: float = 100.0,
    admin_token: str | None = None,
    **settings: Any,
) -> AsyncIterator[tuple[RouterServer, EmulatedFleet]]:
    """Emulated replicas for ``specs`` and a started RouterServer in front of them."""
    config = fleet_config(*specs)
    async with EmulatedFleet(config, time_scale=time_scale, ports=any_ports(specs)) as emulated:
        server = RouterServer(
            routed_fleet(config, emulated, **settings),
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            admin_token=admin_token,
        )
        await server.start()
        try:
            yield server, emulated
        finally:
            await server.stop(grace_s=0)


def openai_client(server: RouterServer, timeout: float = 10.0) -> AsyncOpenAI:
    """The real OpenAI client, pointed at the front door, with its own retries off."""
    return AsyncOpenAI(
        base_url=server.front_url + "/v1", api_key="test", max_retries=0, timeout=timeout
    )


def hint(prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """``extra_body`` that fixes the emulated request's lengths."""
    return {"gpurouter": {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens}}
