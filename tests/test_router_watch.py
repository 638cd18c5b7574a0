"""The routers' stats and acknowledgements as a cluster watcher reads them: stats written by
a router read back whole; junk, a router speaking for another, and an endless stream of
router ids dropped and counted; nodes the fleet does not name discovered, within a bound."""

from __future__ import annotations

import json

import pytest

from router import ManualClock, RouterCore
from router.config.schema import FleetConfig
from router.control import Event
from router.telemetry import router_watch, subscriber
from router.telemetry.control_messages import Ack
from router.telemetry.router_events import encode_event
from router.telemetry.router_stats import decode_stats, encode_stats
from router.telemetry.router_watch import RouterWatch
from router.telemetry.schema import GpuBatch, GpuSample, PayloadError, encode
from router.telemetry.subscriber import TelemetrySubscriber
from router.telemetry.topics import Topics
from tests.fleet_factory import make_fleet
from tests.telemetry_helpers import target

TOPICS = Topics("c1")


def stats_of(router: str) -> bytes:
    core = RouterCore(make_fleet())
    return encode_stats(core.snapshot(), router, 1234.5)


def watch(clock: ManualClock) -> RouterWatch:
    return RouterWatch(target("mqtt://127.0.0.1:1"), "c1", clock=clock)


def test_stats_written_by_a_router_are_read_back_whole() -> None:
    core = RouterCore(make_fleet())
    stats = decode_stats(encode_stats(core.snapshot(), "r-1", 99.0))
    assert (stats.router, stats.ts, stats.strategy) == ("r-1", 99.0, core.strategy.name)
    assert [r.id for r in stats.replicas] == [r.id for r in core.pool]
    assert stats.queue_capacity == core.queue.capacity


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{", "not JSON"),
        (b"[]", "expected an object"),
        (b'{"v": 2}', "v: expected 1"),
        (json.dumps({**json.loads(stats_of("r")), "in_flight": -1}).encode(), "negative"),
        (json.dumps({**json.loads(stats_of("r")), "ts": True}).encode(), "finite number"),
        (stats_of("r").replace(b'"stale":false', b'"stale":0'), "stale: expected bool"),
    ],
)
def test_stats_that_are_not_stats_are_refused_naming_why(payload: bytes, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        decode_stats(payload)


def test_a_router_is_seen_with_its_stats_and_its_acks_and_ages_on_the_watchers_clock() -> None:
    clock = ManualClock(10.0)
    w = watch(clock)
    w.handle(TOPICS.router_stats("r-1"), stats_of("r-1"))
    w.handle(TOPICS.acks("r-1"), Ack("strategy", 7, True, "ok").encode("r-1"))
    w.handle(TOPICS.acks("r-1"), Ack("weight/a", 8, False, "no replica a").encode("r-1"))
    clock.advance(4.0)
    (feed,) = w.status().routers
    assert feed.stats is not None
    assert feed.stats.router == "r-1"
    assert (feed.age_s, feed.stale, feed.applied, feed.refused) == (4.0, True, 1, 1)
    assert feed.acks[-1] == Ack("weight/a", 8, False, "no replica a")
    assert w.status().dropped == 0


def test_junk_and_a_router_speaking_for_another_are_dropped_and_counted() -> None:
    w = watch(ManualClock())
    w.handle(TOPICS.router_stats("r-1"), b"{nope")
    w.handle(TOPICS.router_stats("r-2"), stats_of("r-1"))
    w.handle(TOPICS.acks("r-3"), b'{"slot": 1}')
    w.handle(TOPICS.acks("r-3"), b"[]")
    w.handle(TOPICS.events, b'{"v": 1, "router": "r-1", "seq": "one"}')
    w.handle(TOPICS.status("n-1"), b"anything")  # not a topic the watch asked for: ignored
    status = w.status()
    assert (status.routers, status.events) == ((), ())
    assert status.drop_reasons == {
        "malformed_stats": 1,
        "wrong_router": 1,
        "malformed_ack": 2,
        "malformed_event": 1,
        "too_many_routers": 0,
    }
    assert status.last_error == "malformed_event: router, seq: expected a name and an integer"


def test_the_routers_events_are_read_back_as_their_router_wrote_them() -> None:
    w = watch(ManualClock())
    event = Event(3, 17.5, "mqtt:alice", "drain", {"replica": "a"}, True, "a: draining")
    w.handle(TOPICS.events, encode_event("r-1", event))
    assert w.status().events == (("r-1", event),)


def test_router_ids_without_end_cannot_grow_the_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_watch, "MAX_ROUTERS", 2)
    w = watch(ManualClock())
    for name in ("r-1", "r-2", "r-3"):
        w.handle(TOPICS.router_stats(name), stats_of(name))
    assert [f.router for f in w.status().routers] == ["r-1", "r-2"]
    assert w.status().drop_reasons["too_many_routers"] == 1


def batch(node: str) -> bytes:
    return encode(GpuBatch(node=node, session=1, seq=1, ts=0.0, period_s=1.0, gpus=(GpuSample(0),)))


def test_without_a_fleet_a_discovering_subscriber_learns_the_nodes_that_speak() -> None:
    clock = ManualClock()
    sub = TelemetrySubscriber(
        FleetConfig(nodes=(), cluster="c1"),
        None,
        broker=target("mqtt://127.0.0.1:1"),
        clock=clock,
        discover=True,
    )
    sub.handle(TOPICS.gpus("n-1"), batch("n-1"))
    sub.handle(TOPICS.gpus("n-2"), b"{")
    nodes = {n.node: n for n in sub.status().nodes}
    assert nodes["n-1"].samples == 1
    assert nodes["n-2"].dropped == 1
    assert sub.status().drop_reasons["malformed"] == 1


def test_a_subscriber_without_discovery_still_drops_unknown_nodes() -> None:
    sub = TelemetrySubscriber(
        FleetConfig(nodes=(), cluster="c1"),
        None,
        broker=target("mqtt://127.0.0.1:1"),
        clock=ManualClock(),
    )
    sub.handle(TOPICS.gpus("n-1"), batch("n-1"))
    assert sub.status().nodes == ()
    assert sub.status().drop_reasons["unknown_node"] == 1


def test_node_names_without_end_cannot_grow_a_discovering_subscriber(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subscriber, "MAX_DISCOVERED", 1)
    sub = TelemetrySubscriber(
        FleetConfig(nodes=(), cluster="c1"),
        None,
        broker=target("mqtt://127.0.0.1:1"),
        clock=ManualClock(),
        discover=True,
    )
    sub.handle(TOPICS.gpus("n-1"), batch("n-1"))
    sub.handle(TOPICS.gpus("n-2"), batch("n-2"))
    assert [n.node for n in sub.status().nodes] == ["n-1"]
    assert sub.status().drop_reasons["unknown_node"] == 1
