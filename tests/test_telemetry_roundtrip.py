"""Agent -> broker -> subscriber, on the embedded amqtt and on a real Mosquitto."""

from __future__ import annotations

import asyncio
import sys

from router.core import RouterCore
from router.telemetry.status import BrokerState
from tests.mqtt_fixtures import Broker, until
from tests.telemetry_helpers import (
    FLEET_FILE,
    emulated_agent,
    feed,
    fleet,
    running,
    started,
    subscriber,
)


async def test_agent_readings_reach_the_router_and_a_clean_exit_says_offline(
    mqtt_broker: Broker,
) -> None:
    """The birth, batches and explicit offline all arrive; GPUs land on their replicas."""
    config = fleet()
    core = RouterCore(config)
    async with started(subscriber(config, core, mqtt_broker.url)) as sub:
        agent = emulated_agent(config, "h100-node", mqtt_broker.url)
        async with running(agent):
            await until(lambda: feed(sub, "h100-node").samples >= 3, what="three samples")
            node = feed(sub, "h100-node")
            assert node.online
            assert not node.stale
            assert node.session == agent.stats.session
            assert [g.name for g in node.inventory] == ["NVIDIA H100 80GB HBM3"] * 2
            assert {g.replica for g in node.gpus} == {"h100-0", "h100-1"}
            assert node.dropped == 0
            assert node.lost_samples == 0
            for rid in ("h100-0", "h100-1"):
                telemetry = core.replica(rid).telemetry
                assert telemetry is not None
                assert telemetry.utilization == 0.0
                assert core.replica(rid).node_online is True
            assert core.replica("a100-0").telemetry is None  # its node sent nothing
            assert sub.status().broker is BrokerState.CONNECTED
        await until(lambda: not feed(sub, "h100-node").online, what="the explicit offline")
        assert feed(sub, "h100-node").restarts == 0


async def test_broker_restart_shows_stale_then_both_sides_reconnect(mqtt_broker: Broker) -> None:
    """Killed mid-stream, the broker comes back on its port: the node reads stale while it is
    gone, then fresh again under a new session (counted as an agent restart)."""
    config = fleet()
    core = RouterCore(config)
    async with started(subscriber(config, core, mqtt_broker.url)) as sub:
        agent = emulated_agent(config, "a100-node", mqtt_broker.url)
        async with running(agent):
            await until(lambda: feed(sub, "a100-node").samples >= 2, what="samples")
            first_session = feed(sub, "a100-node").session
            await mqtt_broker.kill()
            await until(
                lambda: (
                    feed(sub, "a100-node").stale and sub.status().broker is BrokerState.RECONNECTING
                ),
                what="a stale node and a reconnecting subscriber",
            )
            assert core.snapshot().replicas[2].stale  # a100-0: router accounting stands in
            await mqtt_broker.start()
            await until(
                lambda: (
                    sub.status().broker is BrokerState.CONNECTED
                    and not feed(sub, "a100-node").stale
                    and feed(sub, "a100-node").session != first_session
                ),
                what="fresh samples of a new session",
            )
            node = feed(sub, "a100-node")
            assert node.online
            assert node.restarts == 1
            assert agent.stats.connects == 2
            assert agent.stats.dropped >= 1
            assert len(sub.status().errors) >= 1


async def test_a_killed_agent_process_goes_offline_by_its_will(mqtt_broker: Broker) -> None:
    """``gpurouter agent`` killed with SIGKILL sends nothing; the broker's will marks it off."""
    config = fleet()
    core = RouterCore(config)
    async with started(subscriber(config, core, mqtt_broker.url)) as sub:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "console.cli",
            "agent",
            "--broker",
            mqtt_broker.url,
            "--node",
            "l4-node",
            "--config",
            str(FLEET_FILE),
            "--emulate",
            "--period",
            "0.1",
            stdout=asyncio.subprocess.DEVNULL,
        )
        try:
            await until(
                lambda: feed(sub, "l4-node").online and feed(sub, "l4-node").samples >= 1,
                what="the agent process online",
            )
        finally:
            proc.kill()
            await proc.wait()
        await until(lambda: not feed(sub, "l4-node").online, what="the will's offline")
        assert core.replica("l4-0").node_online is False
