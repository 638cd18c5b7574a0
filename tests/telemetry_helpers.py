"""Fleets, agents and subscribers wired together for the telemetry tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator
from pathlib import Path

from router.config import load_fleet
from router.config.schema import BrokerConfig, FleetConfig
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.telemetry.agent import EmulatedSource, GpuSource, NodeAgent, node_replicas
from router.telemetry.connection import Backoff, BrokerTarget, resolve_target
from router.telemetry.control_topics import ControlLink
from router.telemetry.status import NodeFeed
from router.telemetry.subscriber import TelemetrySubscriber
from tests.mqtt_fixtures import until

FLEET_FILE = Path(__file__).resolve().parents[1] / "examples" / "fleets" / "h100-a100-l4.yaml"
PERIOD_S = 0.1
"""Short sample period, so that staleness (3 periods) shows within a test."""


@functools.cache
def fleet(period_s: float = PERIOD_S) -> FleetConfig:
    """The example three-node fleet with a short sample period."""
    return dataclasses.replace(
        load_fleet(FLEET_FILE), broker=BrokerConfig(sample_period_s=period_s, keepalive_s=5)
    )


def target(url: str) -> BrokerTarget:
    return resolve_target(BrokerConfig(keepalive_s=5), url=url, environ={})


def quick_backoff() -> Backoff:
    return Backoff(base_s=0.05, cap_s=0.4)


def emulated_agent(config: FleetConfig, node: str, url: str) -> NodeAgent:
    return agent(config, node, url, EmulatedSource(EmulatedFleet(config), period_s=PERIOD_S))


def agent(config: FleetConfig, node: str, url: str, source: GpuSource) -> NodeAgent:
    replica_map, models = node_replicas(config, node)
    return NodeAgent(
        node,
        source,
        target=target(url),
        cluster=config.cluster,
        replica_map=replica_map,
        models=models,
        backoff=quick_backoff(),
    )


def subscriber(config: FleetConfig, core: RouterCore, url: str) -> TelemetrySubscriber:
    return TelemetrySubscriber(config, core, broker=target(url), backoff=quick_backoff())


def feed(sub: TelemetrySubscriber, node: str) -> NodeFeed:
    return next(n for n in sub.status().nodes if n.node == node)


@contextlib.asynccontextmanager
async def running(agent: NodeAgent) -> AsyncIterator[asyncio.Task[None]]:
    """Run the agent; on leaving, stop it cleanly (or cancel it if it is stuck)."""
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        agent.stop()
        try:
            await asyncio.wait_for(task, 10)
        except TimeoutError:
            task.cancel()


@contextlib.asynccontextmanager
async def started(sub: TelemetrySubscriber) -> AsyncIterator[TelemetrySubscriber]:
    await sub.start()
    try:
        yield sub
    finally:
        await sub.stop()


@contextlib.asynccontextmanager
async def linked(link: ControlLink) -> AsyncIterator[ControlLink]:
    """``link`` started and connected, stopped at the end."""
    await link.start()
    try:
        await until(lambda: link.connected, what="the control link up")
        yield link
    finally:
        await link.stop()
