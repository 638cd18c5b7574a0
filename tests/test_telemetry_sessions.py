"""Agent sessions: no single telemetry message can blind the router to a node's agent.

A session number is the agent's wall clock in milliseconds, so one message numbered far
ahead (forged, or from a clock set wrong) must not hold the node's session, and an agent
whose clock stepped back must be followed from its birth on.
"""

from __future__ import annotations

import time

import aiomqtt

from router.clock import ManualClock
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.telemetry.agent import EmulatedSource, NodeAgent, node_replicas
from router.telemetry.schema import GpuBatch, GpuSample, NodeStatus, encode
from router.telemetry.subscriber import DROP_REASONS, STALE_PERIODS, TelemetrySubscriber
from router.telemetry.topics import Topics
from tests.mqtt_fixtures import Broker, until
from tests.telemetry_helpers import (
    PERIOD_S,
    feed,
    fleet,
    quick_backoff,
    running,
    started,
    subscriber,
    target,
)

TOPICS = Topics("h100-a100-l4")
NODE = "h100-node"
TOP = 2**63 - 1


def make() -> tuple[TelemetrySubscriber, RouterCore, ManualClock]:
    clock = ManualClock(100.0)
    core = RouterCore(fleet(), clock=clock)
    return TelemetrySubscriber(fleet(), core, broker=target("mqtt://127.0.0.1:1")), core, clock


def batch(session: int, seq: int, period_s: float = PERIOD_S) -> bytes:
    gpus = (GpuSample(0, gpu_util_pct=50), GpuSample(1, gpu_util_pct=30))
    return encode(GpuBatch(NODE, session, seq, 1.7e9, period_s, gpus))


def status(state: str, session: int, period_s: float = PERIOD_S) -> bytes:
    return encode(NodeStatus(NODE, state, session, "0.1.0", period_s, (), 1.7e9))  # type: ignore[arg-type]


def send_until_applied(
    sub: TelemetrySubscriber, clock: ManualClock, session: int, first_seq: int
) -> int:
    """Batches of ``session``, one per period, until one is applied; how many it took."""
    samples = feed(sub, NODE).samples
    for sent in range(1, 20):
        clock.advance(PERIOD_S)
        sub.handle(TOPICS.gpus(NODE), batch(session, first_seq + sent))
        if feed(sub, NODE).samples > samples:
            return sent
    raise AssertionError(f"session {session} was never followed again")


def test_a_batch_numbered_far_ahead_costs_a_few_samples_not_the_node() -> None:
    sub, core, clock = make()
    for seq in range(3):
        clock.advance(PERIOD_S)
        sub.handle(TOPICS.gpus(NODE), batch(7, seq))
    sub.handle(TOPICS.gpus(NODE), batch(TOP, 0))
    assert feed(sub, NODE).session == TOP
    took = send_until_applied(sub, clock, 7, 2)
    assert took <= STALE_PERIODS + 1
    node = feed(sub, NODE)
    assert node.session == 7
    assert node.dropped == took - 1
    assert sub.status().drop_reasons["older_session"] == took - 1
    telemetry = core.replica("h100-0").telemetry
    assert telemetry is not None
    assert telemetry.received_at == clock.now


def test_a_forged_birth_numbered_far_ahead_is_overtaken_by_the_agent_that_keeps_sending() -> None:
    """Even one that says offline, with an hour's period: the agent's own batches, in
    order, take the node back and mark it online."""
    sub, core, clock = make()
    sub.handle(TOPICS.status(NODE), status("online", 7))
    sub.handle(TOPICS.gpus(NODE), batch(7, 0))
    sub.handle(TOPICS.status(NODE), status("offline", TOP, period_s=3600))
    assert not feed(sub, NODE).online
    assert send_until_applied(sub, clock, 7, 0) <= STALE_PERIODS + 1
    node = feed(sub, NODE)
    assert (node.session, node.online) == (7, True)
    assert core.replica("h100-1").node_online


def test_an_agent_whose_clock_stepped_back_is_followed_from_its_birth() -> None:
    sub, _, clock = make()
    sub.handle(TOPICS.status(NODE), status("online", 1_000))
    sub.handle(TOPICS.gpus(NODE), batch(1_000, 0))
    clock.advance(PERIOD_S)
    sub.handle(TOPICS.status(NODE), status("online", 500))  # restarted, clock stepped back
    sub.handle(TOPICS.gpus(NODE), batch(500, 0))
    node = feed(sub, NODE)
    assert (node.session, node.online, node.samples, node.dropped) == (500, True, 2, 0)
    assert node.restarts == 1


def test_a_lingering_older_session_never_takes_over_a_live_one() -> None:
    """While the current session sends, an older one's batches, however many and however
    orderly, are dropped; and an older session's offline is a late will, ignored."""
    sub, _, clock = make()
    sub.handle(TOPICS.status(NODE), status("online", 9))
    for seq in range(10):
        clock.advance(PERIOD_S)
        sub.handle(TOPICS.gpus(NODE), batch(9, seq))
        sub.handle(TOPICS.gpus(NODE), batch(7, seq))
    sub.handle(TOPICS.status(NODE), status("offline", 7))
    node = feed(sub, NODE)
    assert (node.session, node.online, node.samples, node.dropped) == (9, True, 10, 10)


def test_drops_are_counted_by_reason_and_add_up() -> None:
    sub, _, _ = make()
    sub.handle(TOPICS.gpus(NODE), "text")
    sub.handle(TOPICS.gpus(NODE), b" " * (sub.max_payload_bytes + 1))
    sub.handle(TOPICS.gpus(NODE), b"{")
    sub.handle(TOPICS.gpus("l4-node"), batch(7, 0))  # names h100-node
    sub.handle(TOPICS.gpus(NODE), batch(7, 3))
    sub.handle(TOPICS.gpus(NODE), batch(7, 3))
    sub.handle(TOPICS.gpus("ghost"), batch(7, 0))
    status_now = sub.status()
    assert set(status_now.drop_reasons) == set(DROP_REASONS)
    assert {k: v for k, v in status_now.drop_reasons.items() if v} == {
        "not_bytes": 1,
        "oversized": 1,
        "malformed": 1,
        "wrong_node": 1,
        "repeated_seq": 1,
        "unknown_node": 1,
    }
    assert sum(status_now.drop_reasons.values()) == status_now.dropped


# -- on both brokers ----------------------------------------------------------------------


def emulated(url: str, wall_clock: float = 0.0) -> NodeAgent:
    """The node's agent; ``wall_clock`` shifts its clock (and so its session numbers)."""
    config = fleet()
    replica_map, models = node_replicas(config, NODE)
    return NodeAgent(
        NODE,
        EmulatedSource(EmulatedFleet(config), period_s=PERIOD_S),
        target=target(url),
        cluster=config.cluster,
        replica_map=replica_map,
        models=models,
        backoff=quick_backoff(),
        wall_clock=lambda: time.time() + wall_clock,
    )


async def test_a_forged_session_on_the_broker_is_overtaken_by_the_real_agent(
    mqtt_broker: Broker,
) -> None:
    config = fleet()
    core = RouterCore(config)
    async with started(subscriber(config, core, mqtt_broker.url)) as sub:
        agent = emulated(mqtt_broker.url)
        async with (
            running(agent),
            aiomqtt.Client("127.0.0.1", mqtt_broker.port, identifier="mallory") as mallory,
        ):
            await until(lambda: feed(sub, NODE).samples >= 2, what="samples")
            await mallory.publish(TOPICS.gpus(NODE), batch(TOP, 0), qos=1)
            await until(lambda: feed(sub, NODE).restarts >= 1, what="the forged session seen")
            seen = feed(sub, NODE).samples
            await until(
                lambda: (
                    feed(sub, NODE).session == agent.stats.session
                    and feed(sub, NODE).samples >= seen + 3
                ),
                what="the agent's session followed again",
            )
            node = feed(sub, NODE)
            assert node.online
            assert not node.stale
            assert node.restarts == 2  # the forged session, then the agent's again


async def test_an_agent_restarted_with_its_clock_stepped_back_is_followed_at_once(
    mqtt_broker: Broker,
) -> None:
    config = fleet()
    core = RouterCore(config)
    async with started(subscriber(config, core, mqtt_broker.url)) as sub:
        ahead = emulated(mqtt_broker.url, wall_clock=3600.0)
        async with running(ahead):
            await until(lambda: feed(sub, NODE).samples >= 2, what="samples")
        await until(lambda: not feed(sub, NODE).online, what="the clean exit")
        behind = emulated(mqtt_broker.url)
        async with running(behind):
            await until(
                lambda: (
                    feed(sub, NODE).session == behind.stats.session
                    and feed(sub, NODE).online
                    and feed(sub, NODE).samples >= 4
                ),
                what="the restarted agent followed",
            )
        assert behind.stats.session is not None
        assert ahead.stats.session is not None
        assert behind.stats.session < ahead.stats.session
        assert feed(sub, NODE).dropped == 0
