"""Forged or hostile control messages cannot steer a router or blind it to the operator.

Each case runs on the embedded broker and on Mosquitto (``mqtt_broker``), with an attacker
that is an anonymous MQTT client like any other.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from pathlib import Path

import aiomqtt
import pytest

from router.config.schema import ControlConfig
from router.control import ControlSurface, Drain, Eject, SetStrategy, SetWeight
from router.core import RouterCore
from router.errors import ControlError
from router.replica import ReplicaState
from router.telemetry.control_auth import SECRET_ENV, check
from router.telemetry.control_topics import (
    MAX_CONTROL_BYTES,
    MAX_PEERS,
    REFUSALS,
    ControlLink,
    ControlPublisher,
    encode_desired,
)
from router.telemetry.topics import Topics
from tests.mqtt_fixtures import Broker, until
from tests.telemetry_helpers import fleet, linked, quick_backoff, target

TOPICS = Topics("h100-a100-l4")
SECRET = b"test-control-secret-0123"
WRONG_SECRET = b"not-the-control-secret-99"
NOW_S = 1_800_000_000.0
"""The wall clock of the links built without a real one."""
FLOOD = 30_000


def link_for(
    url: str = "mqtt://127.0.0.1:1", *, secret: bytes | None = SECRET, **options: object
) -> tuple[ControlLink, ControlSurface]:
    surface = ControlSurface(RouterCore(fleet()))
    link = ControlLink(
        surface,
        target=target(url),
        router_id="ra",
        stats_period_s=0.05,
        backoff=quick_backoff(),
        secret=secret,
        **options,  # type: ignore[arg-type]
    )
    return link, surface


def signed(command: object, version: int, *, secret: bytes | None = SECRET, slot: str) -> bytes:
    return encode_desired(
        command,  # type: ignore[arg-type]
        version,
        "alice",
        version / 1000,
        topic=TOPICS.desired(slot),
        secret=secret,
    )


def mqtt_actions(surface: ControlSurface) -> list[str]:
    return [f"{e.actor} {e.kind} {e.ok}" for e in surface.audit if e.actor.startswith("mqtt:")]


def now_ms() -> int:
    return int(time.time() * 1000)


def states(surface: ControlSurface) -> set[ReplicaState]:
    return {r.state for r in surface.core.pool}


# -- on both brokers ----------------------------------------------------------------------


async def test_unsigned_and_badly_signed_commands_are_dropped_and_counted(
    mqtt_broker: Broker,
) -> None:
    """An anonymous, well-formed eject and drain change nothing; the operator's signed
    command is applied."""
    link, surface = link_for(mqtt_broker.url)
    async with (
        linked(link),
        aiomqtt.Client("127.0.0.1", mqtt_broker.port, identifier="mallory") as mallory,
    ):
        version = now_ms()
        unsigned_eject = encode_desired(Eject("h100-0"), version, "mallory", 1.0)
        unsigned_drain = encode_desired(Drain("l4-0"), version, "mallory", 1.0)
        forged_drain = signed(Drain("a100-0"), version, secret=WRONG_SECRET, slot="service/a100-0")
        await mallory.publish(TOPICS.desired("eject/h100-0"), unsigned_eject, qos=1, retain=True)
        await mallory.publish(TOPICS.desired("service/l4-0"), unsigned_drain, qos=1, retain=True)
        await mallory.publish(TOPICS.desired("service/a100-0"), forged_drain, qos=1, retain=True)
        async with ControlPublisher(
            target(mqtt_broker.url), TOPICS.cluster, origin="alice", secret=SECRET
        ) as operator:
            await operator.publish(SetStrategy("least-connections"))
        await until(
            lambda: (
                surface.core.strategy.name == "least-connections"
                and link.refused["unsigned"] == 2
                and link.refused["bad_signature"] == 1
            ),
            what="the signed command applied and the forged ones counted",
        )
    assert states(surface) == {ReplicaState.ACTIVE}
    assert mqtt_actions(surface) == ["mqtt:alice strategy True"]
    assert link.dropped == 3


@pytest.mark.parametrize("secret", [None, SECRET], ids=["no-secret", "secret"])
async def test_a_version_far_ahead_cannot_hold_a_slot_against_the_operator(
    mqtt_broker: Broker, secret: bytes | None
) -> None:
    """A retained weight with version 2**63-1 (unsigned, or signed by a publisher whose clock
    is wrong) is refused: the operator's later weight on that slot is applied."""
    link, surface = link_for(mqtt_broker.url, secret=secret)
    async with (
        linked(link),
        aiomqtt.Client("127.0.0.1", mqtt_broker.port, identifier="mallory") as mallory,
    ):
        top = 2**63 - 1
        forged = signed(SetWeight("h100-0", 7.0), top, secret=secret, slot="weight/h100-0")
        await mallory.publish(TOPICS.desired("weight/h100-0"), forged, qos=1, retain=True)
        await until(lambda: link.refused["future_version"] == 1, what="the version refused")
        async with ControlPublisher(
            target(mqtt_broker.url), TOPICS.cluster, origin="alice", secret=secret
        ) as operator:
            await operator.publish(SetWeight("h100-0", 3.0))
        await until(lambda: surface.core.replica("h100-0").weight == 3.0, what="weight 3")
    assert mqtt_actions(surface) == ["mqtt:alice weight True"]
    assert link.applied["weight/h100-0"] < top


async def test_a_flood_of_junk_cannot_push_out_the_operators_command(
    mqtt_broker: Broker,
) -> None:
    """30,000 junk messages (unsigned commands, bad signatures, not JSON, wrong version,
    oversized) with the operator's command sent halfway: every junk message is dropped
    before the queue and counted by reason, none is applied, and the command is."""
    link, surface = link_for(mqtt_broker.url)
    junk = [
        encode_desired(Eject("h100-0"), now_ms(), "mallory", 1.0),
        signed(Eject("h100-0"), now_ms(), secret=WRONG_SECRET, slot="eject/h100-0"),
        b"\xff not json",
        b'{"v": 2, "version": 1}',
        b" " * (MAX_CONTROL_BYTES + 1),
    ]
    sent = dict.fromkeys(("unsigned", "bad_signature", "malformed", "oversized"), 0)
    reasons = ["unsigned", "bad_signature", "malformed", "unsigned", "oversized"]
    async with (
        linked(link),
        aiomqtt.Client(
            "127.0.0.1", mqtt_broker.port, identifier="mallory", max_queued_outgoing_messages=None
        ) as mallory,
        ControlPublisher(
            target(mqtt_broker.url), TOPICS.cluster, origin="alice", secret=SECRET
        ) as operator,
    ):
        for i in range(FLOOD):
            kind = i % len(junk) if i % 100 else i % 4  # few oversized ones: they are heavy
            await mallory.publish(TOPICS.desired("eject/h100-0"), junk[kind], qos=0)
            sent[reasons[kind]] += 1
            if i == FLOOD // 2:
                await operator.publish(SetStrategy("least-connections"))
        await until(
            lambda: link.dropped == FLOOD, what=f"all {FLOOD} junk messages counted", timeout_s=60
        )
        await until(
            lambda: surface.core.strategy.name == "least-connections",
            what="the operator's command applied",
        )
    assert {reason: link.refused[reason] for reason in sent} == sent
    assert link.refused["overflow"] == 0
    assert mqtt_actions(surface) == ["mqtt:alice strategy True"]
    assert states(surface) == {ReplicaState.ACTIVE}


# -- the link's judgement, message by message ----------------------------------------------


def test_each_refusal_is_counted_under_its_reason_and_answered_with_ok_false() -> None:
    link, surface = link_for(wall_clock=lambda: NOW_S)
    version = int(NOW_S * 1000)
    slot = "service/h100-0"
    cases = {
        "oversized": b"{" * (MAX_CONTROL_BYTES + 1),
        "malformed": b'{"v": 1, "version": NaN}',
        "unsigned": encode_desired(Drain("h100-0"), version, "m", 1.0),
        "bad_signature": signed(Drain("h100-0"), version, secret=WRONG_SECRET, slot=slot),
        "wrong_slot": signed(SetWeight("h100-0", 2), version, slot=slot),
        "future_version": signed(Drain("h100-0"), version + 61_000, slot=slot),
    }
    for reason, payload in cases.items():
        ack = link.handle(TOPICS.desired(slot), payload)
        assert ack is not None, reason
        assert not ack.ok, reason
        assert link.refused[reason] == 1, reason
        assert link.last_refusal is not None
        assert link.last_refusal.startswith(reason)
    assert link.dropped == len(cases)
    assert len(surface.audit) == 0
    # Signed for one slot, it is not good on another: the topic is under the signature.
    moved = signed(Drain("h100-0"), version, slot="service/h100-1")
    assert link.handle(TOPICS.desired(slot), moved) is not None
    assert link.refused["bad_signature"] == 2


def test_a_version_within_the_clock_skew_is_applied_and_older_ones_counted_as_stale() -> None:
    link, surface = link_for(wall_clock=lambda: NOW_S, max_clock_skew_s=60.0)
    slot = "service/h100-0"
    ahead = int(NOW_S * 1000) + 59_000
    ack = link.handle(TOPICS.desired(slot), signed(Drain("h100-0"), ahead, slot=slot))
    assert ack is not None
    assert ack.ok
    assert link.handle(TOPICS.desired(slot), signed(Drain("h100-0"), ahead, slot=slot)) is None
    older = signed(Drain("h100-0"), ahead - 1, slot=slot)
    assert link.handle(TOPICS.desired(slot), older) is None
    assert (link.stale, link.dropped) == (1, 0)
    assert surface.core.replica("h100-0").state is not ReplicaState.ACTIVE


def test_made_up_slots_cannot_grow_the_link_without_end() -> None:
    """Commands on unknown replicas are applied (and refused by the surface) up to a bound;
    past it a new slot is refused before anything is kept."""
    link, _ = link_for(wall_clock=lambda: NOW_S)
    version = int(NOW_S * 1000)
    for i in range(2000):
        slot = f"weight/ghost-{i}"
        link.handle(TOPICS.desired(slot), signed(SetWeight(f"ghost-{i}", 2), version, slot=slot))
    assert link.refused["too_many_slots"] > 0
    assert len(link.applied) + link.refused["too_many_slots"] == 2000
    assert len(link.applied) <= 2 + 4 * len(link.core.pool) + 64


def test_only_commands_to_apply_take_a_place_in_the_queue_and_overflow_is_counted() -> None:
    """``admit`` judges a message as it comes off the socket; ``overflowed`` counts a command
    a full queue could not take."""
    link, _ = link_for(wall_clock=lambda: NOW_S, max_queued=1)
    version = int(NOW_S * 1000)

    def message(payload: bytes, slot: str = "strategy") -> aiomqtt.Message:
        return aiomqtt.Message(TOPICS.desired(slot), payload, 1, False, 1, None)

    good = signed(SetStrategy("round-robin"), version, slot="strategy")
    assert link.admit(message(good))
    assert not link.admit(message(encode_desired(SetStrategy("random"), version, "m", 1.0)))
    assert not link.admit(message(b""))  # a slot being cleared: nothing to count
    assert not link.admit(aiomqtt.Message(TOPICS.events, good, 1, False, 1, None))
    assert link.refused["unsigned"] == 1
    link.overflowed(message(good))
    assert link.refused["overflow"] == 1
    assert link.dropped == 2


def test_the_status_shows_every_counter() -> None:
    link, _ = link_for(wall_clock=lambda: NOW_S)
    link.handle(TOPICS.desired("strategy"), b"junk")
    status = link.status()
    assert status.authenticated
    assert set(status.refused) == set(REFUSALS)
    assert status.refused["malformed"] == status.dropped == 1
    assert status.last_refusal == "malformed: control message is not JSON"


# -- the secret ----------------------------------------------------------------------------


async def test_without_a_secret_the_link_says_so_loudly_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    link, _ = link_for(secret=None)
    with caplog.at_level(logging.WARNING, logger="router.telemetry.control_topics"):
        await link.start()
        await link.stop()
    assert any("NOT authenticated" in r.getMessage() for r in caplog.records)
    assert not link.status().authenticated


def test_the_fleet_file_names_the_secret_and_an_unset_or_short_one_is_refused() -> None:
    named = ControlSurface(
        RouterCore(dataclasses.replace(fleet(), control=ControlConfig(secret_env="RS")))
    )
    broker = target("mqtt://127.0.0.1:1")
    link = ControlLink.from_fleet(named, target=broker, environ={"RS": SECRET.decode()})
    assert link.secret == SECRET
    with pytest.raises(ControlError, match="RS, which is not set"):
        ControlLink.from_fleet(named, target=broker, environ={})
    with pytest.raises(ControlError, match="under 16 characters"):
        ControlLink.from_fleet(named, target=broker, environ={"RS": "short"})
    plain = ControlSurface(RouterCore(fleet()))
    by_default = ControlLink.from_fleet(plain, target=broker, environ={SECRET_ENV: "s" * 16})
    assert by_default.secret == b"s" * 16
    assert ControlLink.from_fleet(plain, target=broker, environ={}).secret is None


def test_the_signed_example_in_the_docs_checks_out_with_its_secret() -> None:
    """docs/telemetry.md shows a message signed with ``example-secret-do-not-use``."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "telemetry.md").read_text()
    message = json.loads(re.findall(r"```json\n(.*?)```", text, re.DOTALL)[2])
    topic = "gpurouter/v1/mixed-demo/control/desired/service/a100-0"
    assert check(message, topic, b"example-secret-do-not-use") is None
    assert check(message, topic, SECRET) == "bad_signature"
    assert check(message, topic.replace("mixed-demo", "prod"), b"example-secret-do-not-use")


def test_junk_on_the_acks_and_stats_topics_goes_no_further_and_cannot_grow_the_peer_table() -> None:
    """Routers read each other's acks and stats (to say who applied a command): junk there
    is neither queued nor counted as a refused command, and a flood of made-up router ids
    stops at MAX_PEERS."""
    link, surface = link_for()
    junk = [b"", b"\xff", b"[]", b'{"slot": 1}', b"{" * 10_000, b'{"slot":"s","version":1.5}']
    for i, payload in enumerate(junk * 400):
        for topic in (TOPICS.acks(f"r{i}"), TOPICS.router_stats(f"r{i}")):
            assert not link.admit(aiomqtt.Message(topic, payload, 1, False, 1, None))
    assert len(link.peers) == MAX_PEERS
    assert link.dropped == 0
    assert len(surface.audit) == 0
