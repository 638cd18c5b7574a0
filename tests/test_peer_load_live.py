"""The live side of peer load: each router's stats carry its own load, and the other
routers' control links count it on their core (router/telemetry/control_topics.py)."""

from __future__ import annotations

import json

import aiomqtt

from router.control import ControlSurface
from router.core import RouterCore
from router.request import Request
from router.telemetry.control_topics import ControlLink
from router.telemetry.topics import Topics
from tests.telemetry_helpers import fleet, quick_backoff, target


def _router(name: str) -> ControlLink:
    surface = ControlSurface(RouterCore(fleet()))
    return ControlLink(
        surface, target=target("mqtt://127.0.0.1:1"), router_id=name, backoff=quick_backoff()
    )


def _stats(link: ControlLink, payload: bytes) -> aiomqtt.Message:
    topic = Topics(link.core.fleet.cluster).router_stats(link.router_id)
    return aiomqtt.Message(topic, payload, 0, False, 1, None)


def _busy(link: ControlLink, n: int) -> None:
    for i in range(n):
        link.core.submit(Request(f"{link.router_id}-{i}", 100, 100, arrival=0.0))


def test_a_peers_published_load_counts_on_this_routers_replicas() -> None:
    a, b = _router("ra"), _router("rb")
    _busy(b, 3)
    assert not a.admit(_stats(b, b.stats_payload()))  # noted, never queued as a command
    held = {r.id: r.own_in_flight for r in b.core.pool if r.own_in_flight}
    seen = {r.id: r.in_flight for r in a.core.pool if r.in_flight}
    assert seen == held
    assert sum(seen.values()) == 3


def test_a_routers_own_stats_coming_back_are_not_counted_again() -> None:
    a = _router("ra")
    _busy(a, 2)
    before = [r.in_flight for r in a.core.pool]
    a.admit(_stats(a, a.stats_payload()))
    assert [r.in_flight for r in a.core.pool] == before
    assert a.core.peers.count == 0


def test_stats_carry_only_the_routers_own_load() -> None:
    a, b = _router("ra"), _router("rb")
    _busy(b, 4)
    a.admit(_stats(b, b.stats_payload()))
    _busy(a, 1)
    rows = json.loads(a.stats_payload())["load"]["replicas"]
    assert sum(n for _, n, _ in rows) == 1


def test_a_malformed_load_is_not_counted_and_the_peer_is_still_heard() -> None:
    a, b = _router("ra"), _router("rb")
    for load in ({"seq": "1", "replicas": []}, {"seq": 1, "replicas": [["a100-0", -2, 5.0]]}):
        body = {"v": 1, "router": "rb", "load": load}
        a.admit(_stats(b, json.dumps(body).encode()))
    assert all(r.in_flight == 0 for r in a.core.pool)
    assert "rb" in a.peers
