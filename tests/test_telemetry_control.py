"""Control over MQTT: retained, versioned desired state applied through the control surface."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator

import aiomqtt
import pytest

from router.control import ControlSurface, Drain, SetStrategy, SetWeight, Undrain
from router.core import RouterCore
from router.replica import ReplicaState
from router.request import Request
from router.telemetry.control_topics import (
    ControlLink,
    ControlPublisher,
    encode_desired,
    publish_command,
)
from router.telemetry.topics import Topics
from tests.mqtt_fixtures import Broker, until
from tests.telemetry_helpers import fleet, quick_backoff, target
from tests.tuner_changes import drive_a_tuner_change, tuning_core

TOPICS = Topics("h100-a100-l4")


def router(url: str, name: str) -> tuple[ControlLink, ControlSurface]:
    surface = ControlSurface(RouterCore(fleet()))
    link = ControlLink(
        surface, target=target(url), router_id=name, stats_period_s=0.05, backoff=quick_backoff()
    )
    return link, surface


@contextlib.asynccontextmanager
async def linked(link: ControlLink) -> AsyncIterator[ControlLink]:
    await link.start()
    try:
        yield link
    finally:
        await link.stop()


def converged(surface: ControlSurface) -> bool:
    core = surface.core
    drained = core.replica("l4-0").state is ReplicaState.DRAINED
    return core.strategy.name == "least-connections" and drained


def mqtt_actions(surface: ControlSurface) -> list[str]:
    return [f"{e.actor} {e.kind} {e.ok}" for e in surface.audit if e.actor.startswith("mqtt:")]


async def test_two_routers_converge_on_the_last_command_and_a_late_one_catches_up(
    mqtt_broker: Broker,
) -> None:
    """Both routers end on the operator's last strategy and drain; a router that connects
    afterwards gets the same desired state from the retained messages."""
    (link_a, a), (link_b, b) = router(mqtt_broker.url, "ra"), router(mqtt_broker.url, "rb")
    async with linked(link_a), linked(link_b):
        await until(lambda: link_a.connected and link_b.connected, what="both links up")
        async with ControlPublisher(target(mqtt_broker.url), TOPICS.cluster, origin="alice") as op:
            await op.publish(SetStrategy("round-robin"))
            await op.publish(Drain("l4-0"))
            last = await op.publish(SetStrategy("least-connections"))
        await until(lambda: converged(a) and converged(b), what="both routers converging")
        assert link_a.applied["strategy"] == last == link_b.applied["strategy"]
        assert "mqtt:alice drain True" in mqtt_actions(a)
        late_link, late = router(mqtt_broker.url, "rc")
        async with linked(late_link):
            await until(
                lambda: (
                    late.core.strategy.name == "least-connections"
                    and late.core.replica("l4-0").state is ReplicaState.DRAINED
                ),
                what="the late router converging",
            )
            assert len(mqtt_actions(late)) == 2  # only the retained last word per slot


async def test_routers_acknowledge_publish_stats_and_events(mqtt_broker: Broker) -> None:
    link, surface = router(mqtt_broker.url, "ra")
    async with (
        linked(link),
        aiomqtt.Client("127.0.0.1", mqtt_broker.port, identifier="watcher") as watcher,
    ):
        await watcher.subscribe(TOPICS.all_acks, qos=1)
        await watcher.subscribe(TOPICS.all_router_stats, qos=0)
        await watcher.subscribe(TOPICS.events, qos=1)
        await until(lambda: link.connected, what="link up")
        version = await publish_command(
            mqtt_broker.url, TOPICS.cluster, {"command": "weight", "replica": "ghost", "weight": 2}
        )
        seen: dict[str, dict[str, object]] = {}
        async with asyncio.timeout(10):
            async for message in watcher.messages:
                kind = message.topic.value.rsplit("/", 2)[-2]
                seen.setdefault(kind if kind != "h100-a100-l4" else "events", {}).update(
                    json.loads(message.payload)
                )
                if {"acks", "ra", "events"} <= seen.keys():
                    break
        assert seen["acks"]["version"] == version
        assert seen["acks"]["ok"] is False  # no replica 'ghost': refused, and said so
        assert seen["ra"]["router"] == "ra"  # routers/ra/stats
        assert seen["events"]["actor"] == "mqtt:operator"
        assert surface.audit[-1].message == "no replica 'ghost'"


async def test_a_real_tuner_change_is_published_on_the_events_topic(mqtt_broker: Broker) -> None:
    """A tuning round of the core reaches the MQTT events topic, as the audit trail has it."""
    core, clock = tuning_core()
    surface = ControlSurface(core)
    link = ControlLink(
        surface, target=target(mqtt_broker.url), router_id="ra", backoff=quick_backoff()
    )
    topics = Topics(core.fleet.cluster)
    async with (
        linked(link),
        aiomqtt.Client("127.0.0.1", mqtt_broker.port, identifier="watcher") as watcher,
    ):
        await watcher.subscribe(topics.events, qos=1)
        await until(lambda: link.connected, what="link up")
        changes = drive_a_tuner_change(core, clock)
        published: list[dict[str, object]] = []
        async with asyncio.timeout(10):
            async for message in watcher.messages:
                published.append(json.loads(message.payload))
                if len(published) == len(changes):
                    break
    assert [(p["router"], p["actor"], p["kind"], p["ok"]) for p in published] == [
        ("ra", "tuner", "tune", True)
    ] * len(changes)
    assert [p["message"] for p in published] == [c.message for c in changes]
    assert [p["args"] for p in published] == [
        {"replica": c.replica, "setting": c.setting, "old": c.old, "new": c.new, "signal": c.signal}
        for c in changes
    ]
    assert [p["seq"] for p in published] == [e.seq for e in surface.audit]


def test_a_command_is_applied_once_per_version_and_only_on_its_own_slot() -> None:
    """Idempotent: the same or an older version changes nothing; a newer one applies."""
    link, surface = router("mqtt://127.0.0.1:1", "ra")
    drain = encode_desired(Drain("h100-0"), 5, "bob", 1.0)
    assert link.handle(TOPICS.desired("service/h100-0"), drain) is not None
    assert link.handle(TOPICS.desired("service/h100-0"), drain) is None
    older = encode_desired(Undrain("h100-0"), 4, "bob", 1.0)
    assert link.handle(TOPICS.desired("service/h100-0"), older) is None
    assert surface.core.replica("h100-0").state is ReplicaState.DRAINED
    newer = encode_desired(Undrain("h100-0"), 6, "bob", 1.0)
    ack = link.handle(TOPICS.desired("service/h100-0"), newer)
    assert ack is not None
    assert ack.ok
    assert surface.core.replica("h100-0").state is ReplicaState.ACTIVE
    assert mqtt_actions(surface) == ["mqtt:bob drain True", "mqtt:bob undrain True"]
    wrong = link.handle(
        TOPICS.desired("strategy"), encode_desired(SetWeight("h100-0", 2), 9, "b", 1)
    )
    assert wrong is not None
    assert not wrong.ok
    assert link.dropped == 1


def test_malformed_control_messages_are_refused_and_foreign_topics_ignored() -> None:
    link, surface = router("mqtt://127.0.0.1:1", "ra")
    slot = TOPICS.desired("strategy")
    for payload in (b"{", b"[]", b'{"v":2}', b'{"v":1,"version":-1,"origin":"x","command":{}}'):
        ack = link.handle(slot, payload)
        assert ack is not None
        assert not ack.ok
    assert link.handle(slot, b"") is None  # a retained message being cleared
    assert link.handle(TOPICS.gpus("h100-node"), b"{}") is None
    assert link.dropped == 4
    assert len(surface.audit) == 0


@pytest.mark.parametrize(
    ("slot", "command", "message"),
    [
        ("weight/h100-0", {"command": "weight", "replica": "h100-0", "weight": 1e308}, "1e+06"),
        # The link reads JSON strictly: NaN and Infinity are not JSON to it.
        ("weight/h100-0", {"command": "weight", "replica": "h100-0", "weight": math.nan}, "JSON"),
        ("weight/h100-0", {"command": "weight", "replica": "h100-0", "weight": math.inf}, "JSON"),
        ("batch/h100-0", {"command": "batch", "replica": "h100-0", "size": 2**63}, "65536"),
    ],
)
def test_a_control_message_with_an_absurd_value_is_dropped_and_counted(
    slot: str, command: dict[str, object], message: str
) -> None:
    """Through the link's own reading of a message, then parse_command's."""
    link, surface = router("mqtt://127.0.0.1:1", "ra")
    before = surface.core.replica("h100-0").weight, surface.core.replica("h100-0").batch_size
    body = {"v": 1, "version": 1, "origin": "bob", "ts": 1.0, "command": command}
    ack = link.handle(TOPICS.desired(slot), json.dumps(body).encode())
    assert ack is not None
    assert not ack.ok
    assert message in ack.message
    assert link.dropped == 1
    assert len(surface.audit) == 0
    after = surface.core.replica("h100-0").weight, surface.core.replica("h100-0").batch_size
    assert after == before


async def test_routers_count_each_others_load_over_the_broker(mqtt_broker: Broker) -> None:
    """Each router's stats carry its own requests per replica; the other router counts them
    on the same replicas (router/peer_load.py), and not as its own."""
    (link_a, a), (link_b, b) = router(mqtt_broker.url, "ra"), router(mqtt_broker.url, "rb")
    for i in range(3):
        b.core.submit(Request(f"b{i}", 100, 100, arrival=b.core.clock()))
    held = {r.id: r.own_in_flight for r in b.core.pool if r.own_in_flight}
    async with linked(link_a), linked(link_b):
        await until(
            lambda: {r.id: r.in_flight for r in a.core.pool if r.in_flight} == held,
            what="router a counting router b's requests",
        )
        assert all(r.own_in_flight == 0 for r in a.core.pool)
        # a runs nothing, but is counted as a peer once b hears a's stats (its own schedule)
        await until(lambda: b.core.peers.count == 1, what="router b counting router a")
