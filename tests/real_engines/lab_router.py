"""Helpers for the real-engine tests (no tests here): a real gpurouter router, in process, in
front of some of the lab's engines; the real OpenAI client; the admin API's state."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from openai import AsyncOpenAI

from router.config import parse_fleet
from router.config.schema import FleetConfig, HealthConfig
from router.http.server import RouterServer
from router.lab import Engine, Lab
from router.lab.fleet_file import fleet_yaml

__all__ = [
    "QUIET_HEALTH",
    "admin_state",
    "counter",
    "engine_metrics",
    "eventually",
    "fleet_of",
    "openai_client",
    "replica_state",
    "routed",
]

QUIET_HEALTH = HealthConfig(
    check_interval_s=0.0, eject_after_failures=0, engine_metrics_interval_s=0.0
)
"""No active checks, no ejection, no engine-metrics polling: tests that want them say so."""

GUARD_S = 120.0
"""How long ``eventually`` waits before it fails: a guard against hangs, not a speed check."""


def fleet_of(lab: Lab, engines: Sequence[Engine] | None = None) -> FleetConfig:
    """A fleet of ``engines`` (default: the lab's fleet file's), written as the lab writes its
    fleet file, every weight at 1."""
    if engines is None:
        return parse_fleet(lab.fleet_file.read_text(), str(lab.fleet_file))
    records = [engine.record for engine in engines]
    text = fleet_yaml("vllm", records, engines[0].model, lab.state.options)
    return parse_fleet(text, "lab fleet")


@asynccontextmanager
async def routed(
    fleet: FleetConfig, *, health: HealthConfig = QUIET_HEALTH, strategy: str | None = None
) -> AsyncIterator[RouterServer]:
    """A started RouterServer in front of ``fleet`` on free loopback ports."""
    router = dataclasses.replace(fleet.router, health=health)
    if strategy is not None:
        router = dataclasses.replace(
            router, strategy=dataclasses.replace(router.strategy, name=strategy)
        )
    server = RouterServer(
        dataclasses.replace(fleet, router=router),
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0)


def openai_client(server: RouterServer, timeout: float = 60.0) -> AsyncOpenAI:
    """The real OpenAI client, pointed at the router's front door, with its own retries off."""
    return AsyncOpenAI(
        base_url=server.front_url + "/v1", api_key="lab", max_retries=0, timeout=timeout
    )


async def admin_state(server: RouterServer) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(server.admin_url + "/admin/state")
    response.raise_for_status()
    state: dict[str, Any] = response.json()
    return state


def replica_state(state: dict[str, Any], replica: str) -> dict[str, Any]:
    """One replica's entry of the admin state."""
    found: dict[str, Any] = next(r for r in state["replicas"] if r["id"] == replica)
    return found


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until ``check`` holds (polling); fail naming ``what`` after ``GUARD_S``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    while not await check():
        assert loop.time() < deadline, f"still not true after {GUARD_S:g} s: {what}"
        await asyncio.sleep(0.2)


async def engine_metrics(engine: Engine) -> str:
    """The engine's own /metrics page."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(engine.url + "/metrics")
    response.raise_for_status()
    return response.text


def counter(metrics: str, family: str) -> float:
    """A counter's value on a /metrics page, summed over its labels (0 when absent)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(family + "{") or line.startswith(family + " ")
    ]
    return sum(values)
