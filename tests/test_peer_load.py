"""Peer load (router/peer_load.py): several routers count each other's requests, once each."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.clock import ManualClock
from router.core import RouterCore
from router.peer_load import PeerLoad, PeerReport, ReplicaLoad, own_report
from router.request import Request
from tests.fleet_factory import make_fleet
from tests.strategy_helpers import attach, dispatch, request, weighted_pool

PROPERTY = settings(max_examples=80, deadline=None, derandomize=True)


def _core(
    router_id: str, batch_sizes: list[int] | None = None, clock: ManualClock | None = None
) -> RouterCore:
    fleet = make_fleet((1.0, 1.0), batch_sizes or [8, 8], strategy="least-connections")
    return RouterCore(fleet, clock=clock or ManualClock(), router_id=router_id)


def _submit(core: RouterCore, n: int, prefix: str) -> None:
    for i in range(n):
        core.submit(Request(f"{prefix}{i}", 100, 100, arrival=core.clock()))


def _report(router: str, seq: int, **in_flight: int) -> PeerReport:
    loads = tuple(ReplicaLoad(r, n, 150.0 * n) for r, n in in_flight.items())
    return PeerReport(router, seq, loads)


def test_a_peers_reported_requests_count_on_the_replica_with_their_cost() -> None:
    core = _core("a")
    core.hear_peer(_report("b", 1, r0=3))
    r0, r1 = core.pool.replicas
    assert (r0.in_flight, r0.outstanding_cost) == (3, 450.0)
    assert (r1.in_flight, r1.outstanding_cost) == (0, 0.0)


def test_a_routers_own_report_coming_back_is_not_counted_again() -> None:
    core = _core("a")
    _submit(core, 2, "q")
    echoed = core.load_report()
    before = [r.in_flight for r in core.pool]
    core.hear_peer(echoed)
    assert [r.in_flight for r in core.pool] == before
    assert core.peers.count == 0


def test_a_report_carries_only_the_routers_own_requests_never_what_it_heard() -> None:
    core = _core("a")
    core.hear_peer(_report("b", 1, r0=5, r1=5))
    _submit(core, 1, "q")
    report = core.load_report()
    assert sum(load.in_flight for load in report.loads) == 1
    assert report.router == "a"


def test_two_routers_exchanging_reports_count_every_request_exactly_once() -> None:
    clock = ManualClock()
    a, b = _core("a", clock=clock), _core("b", clock=clock)
    _submit(a, 3, "a")
    _submit(b, 5, "b")
    for _ in range(4):  # reports going back and forth must not amplify anything
        a.hear_peer(b.load_report())
        b.hear_peer(a.load_report())
    held = {
        r.id: ra.own_in_flight + rb.own_in_flight
        for r, ra, rb in zip(a.pool, a.pool, b.pool, strict=True)
    }
    assert {r.id: r.in_flight for r in a.pool} == held
    assert {r.id: r.in_flight for r in b.pool} == held
    assert sum(held.values()) == 8


def test_a_peers_figures_stop_counting_once_older_than_the_bound() -> None:
    clock = ManualClock()
    core = RouterCore(make_fleet((1.0,), [8]), clock=clock, peer_stale_after_s=3.0)
    core.hear_peer(_report("b", 1, r0=4))
    clock.advance(2.9)
    core.expire()
    assert core.pool.replicas[0].in_flight == 4
    clock.advance(0.1)
    core.expire()
    assert core.pool.replicas[0].in_flight == 0
    assert core.peers.count == 0


def test_a_router_that_vanishes_stops_holding_slots_and_the_queue_moves() -> None:
    """Its requests filled the batch; once its figures expire, ours go."""
    clock = ManualClock()
    core = RouterCore(make_fleet((1.0,), [4]), clock=clock, peer_stale_after_s=3.0)
    core.hear_peer(_report("gone", 1, r0=5))  # the batch and the one-per-peer slack
    _submit(core, 2, "q")
    assert len(core.queue) == 2
    assert not core.running
    clock.advance(3.0)
    core.expire()
    assert len(core.queue) == 0
    assert len(core.running) == 2


def test_a_late_report_does_not_replace_a_newer_one() -> None:
    core = _core("a")
    core.hear_peer(_report("b", 2, r0=1))
    core.hear_peer(_report("b", 1, r0=6))
    assert core.pool.replicas[0].in_flight == 1


def test_a_newer_report_replaces_the_peers_figures_whole() -> None:
    core = _core("a")
    core.hear_peer(_report("b", 1, r0=3, r1=2))
    core.hear_peer(_report("b", 2, r1=1))
    assert [r.in_flight for r in core.pool] == [0, 1]


def test_the_batch_size_counts_the_peers_requests_with_one_slot_of_slack_per_peer() -> None:
    core = _core("a", batch_sizes=[4, 4])
    core.hear_peer(_report("b", 1, r0=4, r1=5))
    _submit(core, 3, "q")
    r0, r1 = core.pool.replicas
    assert (r0.own_in_flight, r1.own_in_flight) == (1, 0)
    assert len(core.queue) == 2


def test_since_a_report_our_own_moves_stand_for_every_peers() -> None:
    """Between reports each peer is taken to do what we do: one request of ours moves the
    estimate by one per router, so routers reading the same old figures fill a gap at their
    share of the pace instead of each filling all of it."""
    core = RouterCore(make_fleet((1.0,), [64]), clock=ManualClock(), router_id="a")
    core.hear_peer(_report("b", 1, r0=2))
    core.hear_peer(_report("c", 1, r0=2))
    _submit(core, 1, "q")
    r0 = core.pool.replicas[0]
    assert r0.own_in_flight == 1
    assert r0.in_flight == 1 + 2 * (2 + 1)


def test_the_estimate_never_counts_fewer_peer_requests_than_none() -> None:
    core = _core("a")
    _submit(core, 4, "q")  # least-connections: two on each replica
    core.hear_peer(_report("b", 1))  # b runs nothing
    done = next(iter(core.running.values()))
    core.complete(done)
    r = done.replica
    assert r.peer_in_flight == 0
    assert r.peer_cost == 0.0
    assert r.in_flight == r.own_in_flight == 1


def test_a_report_names_only_replicas_with_work_and_unknown_ones_are_ignored() -> None:
    pool = weighted_pool([1.0, 1.0])
    peers = PeerLoad("a", pool.replicas)
    dispatch(pool, pool.replicas[1], request())
    report = own_report("a", 1, pool.replicas)
    assert [load.replica for load in report.loads] == ["r1"]
    changed = peers.heard(_report("b", 1, nowhere=3, r0=1), now=0.0)
    assert {r.id for r in changed} == {"r0", "r1"}  # a new peer: every estimate scales
    assert pool.replicas[0].in_flight == 1


loads = st.lists(st.integers(0, 12), min_size=2, max_size=8)


@PROPERTY
@given(
    speeds=st.lists(st.floats(0.2, 6.0), min_size=2, max_size=8),
    own=loads,
    peers=st.lists(loads, min_size=1, max_size=4),
    picks=st.integers(1, 20),
)
def test_least_connections_never_picks_a_replica_with_strictly_more_total_load(
    speeds: list[float], own: list[int], peers: list[list[int]], picks: int
) -> None:
    """Where it claims to: the pick's total (own + peers') in flight over learned capacity
    is the least among the replicas that could take the request."""
    pool = weighted_pool(speeds, batch_size=10_000)
    n = len(speeds)
    for r in pool:
        r.speed = speeds[r.index]
        for _ in range(own[r.index % len(own)]):
            dispatch(pool, r, request())
    strategy = attach("least-connections", pool)
    peer_load = PeerLoad("a", pool.replicas)
    for k, figures in enumerate(peers):
        report = PeerReport(
            f"p{k}",
            1,
            tuple(ReplicaLoad(f"r{i}", figures[i % len(figures)], 10.0) for i in range(n)),
        )
        for r in peer_load.heard(report, now=0.0):
            pool.changed(r)
    for _ in range(picks):
        req = request()
        chosen = strategy.pick(req, 0.0)
        assert chosen is not None
        best = min(r.in_flight / r.speed for r in pool if r.can_take(req))
        assert chosen.in_flight / chosen.speed <= best
        dispatch(pool, chosen, req)
