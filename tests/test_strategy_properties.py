"""Invariants every strategy keeps over random fleets and random histories.

Fleets: 1-24 replicas, weights 0.1-8, batch sizes 1-16, KV capacities and context limits
known or not, two tiers. Histories: picks (each dispatched when it finds a replica), completions,
state, weight, learned-capacity and batch-size changes, telemetry, engine queue readings and
latency samples. Every load-aware strategy must pick a replica whose load relative to its
learned capacity is lowest by the strategy's own rule: never one strictly more loaded. After
every pick the choice is checked against a brute-force reading of the pool; after every
history the strategy's own indexes are checked against the pool they index.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.pool import ReplicaPool
from router.replica import EngineLoad, Replica, ReplicaState, Telemetry
from router.request import Request
from router.strategies import STRATEGIES, Strategy, create_strategy
from router.strategies._index import ScoreIndex
from router.strategies.affinity import Affinity
from router.strategies.capacity_aware import CapacityAware
from router.strategies.least_connections import LeastConnections, WeightedLeastConnections
from router.strategies.least_tokens import LeastOutstandingTokens
from router.strategies.p2c_peak_ewma import P2CPeakEwma
from router.strategies.random_choice import WeightedRandom
from router.strategies.round_robin import RoundRobin
from router.strategies.shortest_expected_delay import ShortestExpectedDelay
from router.strategies.tiered import Tiered
from router.strategies.weighted_round_robin import WeightedRoundRobin
from tests.strategy_helpers import (
    Spec,
    attach,
    attach_strategy,
    complete,
    dispatch,
    make_pool,
    pick_and_run,
    request,
    weighted_pool,
)

# derandomize: the same examples on every run and machine, as the other tests.
PROPERTY = settings(max_examples=70, deadline=None, derandomize=True)

weights = st.floats(0.1, 8.0, allow_nan=False)
specs = st.builds(
    Spec,
    weight=weights,
    batch_size=st.integers(1, 16),
    tier=st.sampled_from(["strong", "standard"]),
    kv_capacity_tokens=st.none() | st.integers(500, 12_000),
    max_context_tokens=st.none() | st.integers(1_000, 8_000),
)
fleets = st.lists(specs, min_size=1, max_size=24)
slot = st.integers(0, 23)  # a replica, modulo the fleet's size
pick_op = st.tuples(
    st.just("pick"),
    st.integers(0, 4_000),
    st.integers(1, 3_000),
    st.sampled_from([None, "alpha", "beta", "gamma", "delta"]),
    st.frozensets(slot, max_size=3),
    st.sampled_from([0, 0, 1, 3, 40]),  # requests ahead of it in the router's queue
)
operations = st.lists(
    pick_op
    | pick_op
    | st.tuples(st.just("complete"), slot)
    | st.tuples(
        st.just("state"),
        slot,
        st.sampled_from([ReplicaState.ACTIVE, ReplicaState.DRAINING, ReplicaState.EJECTED]),
    )
    | st.tuples(st.just("weight"), slot, weights)
    | st.tuples(st.just("speed"), slot, st.floats(1.0, 20_000.0))
    | st.tuples(st.just("engine"), slot, st.integers(0, 5), st.floats(0.0, 6.0))
    | st.tuples(st.just("batch"), slot, st.integers(1, 16))
    | st.tuples(st.just("telemetry"), slot, st.floats(0.0, 1.0), st.floats(0.0, 6.0))
    | st.tuples(st.just("latency"), slot, st.floats(0.001, 1.0)),
    # Hypothesis favours short lists; histories need length for load to build up.
    min_size=20,
    max_size=80,
)


def _apply(pool: ReplicaPool, op: tuple[Any, ...], now: float) -> None:
    kind, r = op[0], pool.replicas[op[1] % len(pool)]
    if kind == "complete" and r.running:
        complete(pool, r, next(iter(r.running.values())))
    elif kind == "state":
        r.state = op[2]
        pool.changed(r)
    elif kind == "weight":
        r.weight = op[2]
        pool.changed(r)
    elif kind == "speed":
        # A learned capacity moved (router/capacity.py pushes it through pool.changed).
        r.speed = op[2]
        pool.changed(r)
    elif kind == "engine":
        # Engine /metrics arrive on the poller's timer: read at pick time, like telemetry.
        r.engine = EngineLoad("vllm", received_at=now - op[3], waiting=op[2], running=op[2] * 3)
    elif kind == "batch":
        r.batch_size = op[2]
        pool.changed(r)
    elif kind == "telemetry":
        # Telemetry arrives without pool.changed: strategies must read it at pick time.
        r.telemetry = Telemetry(utilization=0.5, received_at=now - op[3], kv_usage=op[2])
    elif kind == "latency":
        r.latency.observe(op[2], now)
        pool.changed(r)


def _check_pick(s: Strategy, req: Request, chosen: Replica | None, now: float) -> None:
    can = [r for r in s.pool if r.can_take(req)]
    if isinstance(s, CapacityAware):
        # Its rule exactly: least outstanding work per unit of capacity among those with
        # room now and no fresh engine queue while running ours, else wait.
        can = [
            r
            for r in can
            if _kv_room(r, now, s.stale_after_s) >= req.total_tokens
            and not _engine_queueing(r, now, s.stale_after_s)
        ]
        if chosen is not None:
            load = chosen.outstanding_cost / chosen.speed
            assert load == min(r.outstanding_cost / r.speed for r in can)
    if chosen is None:
        if isinstance(s, ShortestExpectedDelay) and can:
            # Its rule: wait only for a full replica that would still finish sooner.
            assert _sed_full_card_is_sooner(s, req, can), f"{s.name} waits for nothing sooner"
            return
        assert not can, f"{s.name} left the request waiting though {can[0].id} could take it"
        return
    if isinstance(s, ShortestExpectedDelay):
        assert not _sed_full_card_is_sooner(s, req, can), f"{s.name} took a slower free slot"
    assert chosen in can, f"{s.name} chose {chosen.id}, which cannot take the request"
    if isinstance(s, Affinity) and req.affinity_key is not None:
        assert chosen is _ring_walk(s, req, can)
    best = _brute_force_best(s, req, can)
    if best is not None:
        score = s.score(chosen, req, now)
        assert score is not None
        assert score <= best * (1 + 1e-12) + 1e-12


def _sed_full_card_is_sooner(s: Strategy, req: Request, can: list[Replica]) -> bool:
    """Shortest expected delay's reason to wait, from the replicas' raw state: an active
    replica with no free slot that fits the request would finish it, after its turn for a
    slot (one of its requests ending, or as many slots freeing on the full replicas as there
    are requests ahead of it in the queue, plus one, and no further off than its wait limit),
    sooner than the best replica with a slot."""
    best = min((r.outstanding_cost + req.cost) / r.speed for r in can)
    full = [
        r
        for r in s.pool
        if r.state is ReplicaState.ACTIVE
        and not r.has_slot
        and r.fits(req)
        and r.index not in req.avoid
    ]
    freeing = sum(r.in_flight * r.speed / r.outstanding_cost for r in full if r.outstanding_cost)
    turn = (req.waiting_ahead + 1) / freeing if freeing else math.inf
    for r in full:
        backlog = r.outstanding_cost / r.speed
        wait = max(backlog / max(r.in_flight, 1), turn)
        if wait > getattr(s, "wait_limit_s", math.inf):
            continue  # the whole wait would come before the first token
        if backlog + getattr(s, "wait_weight", 1.0) * wait + req.cost / r.speed < best:
            return True
    return False


def _kv_room(r: Replica, now: float, stale_after_s: float) -> float:
    """Free KV tokens by the capacity-aware rule, from the replica's raw state."""
    capacity = r.kv_tokens
    if capacity is None:
        return math.inf
    t = r.telemetry
    if t is not None and t.kv_usage is not None and now - t.received_at < stale_after_s:
        return (1 - t.kv_usage) * capacity
    return capacity - sum(q.prompt_tokens + q.max_tokens for q in r.running.values())


def _engine_queueing(r: Replica, now: float, stale_after_s: float) -> bool:
    e = r.engine
    fresh = e is not None and now - e.received_at < stale_after_s
    return (
        fresh
        and e is not None
        and (e.waiting or 0) > 0
        and r.in_flight > 0
        and r.in_flight >= (e.running or 0)
    )


def _brute_force_best(s: Strategy, req: Request, can: list[Replica]) -> float | None:
    """The minimum load over learned capacity a min-score strategy must reach, by its own
    definition of load; None for the others."""
    if isinstance(s, Tiered):
        strong = [r for r in can if s.is_strong(r)]
        if s.is_heavy(req) and strong:
            can = strong
        return min((r.in_flight + 1) / r.speed for r in can)
    if isinstance(s, ShortestExpectedDelay):
        return min((r.outstanding_cost + req.cost) / r.speed for r in can)
    if isinstance(s, LeastOutstandingTokens):
        return min(r.outstanding_cost / r.speed for r in can)
    if isinstance(s, WeightedLeastConnections):
        return min((r.in_flight + 1) / r.speed for r in can)
    if isinstance(s, LeastConnections):
        return min(r.in_flight / r.speed for r in can)
    if isinstance(s, Affinity) and req.affinity_key is None:
        return min((r.in_flight + 1) / r.speed for r in can)
    return None


def _ring_walk(s: Affinity, req: Request, can: list[Replica]) -> Replica:
    """The bounded-load rule by brute force: clockwise order, first under the bound."""
    assert req.affinity_key is not None
    key = req.affinity_key
    ordered = sorted(can, key=lambda r: (s.ring_distance(r, key), r.index))
    active = [r for r in s.pool if r.state is ReplicaState.ACTIVE]
    total, speed = sum(r.in_flight for r in active), sum(r.speed for r in active)

    def bound(r: Replica) -> int:
        # Its share of the fleet's load by learned capacity, with the balance allowance.
        return math.ceil(s.balance * (total + 1) * r.speed / speed) if speed > 0 else 0

    return next((r for r in ordered if r.in_flight < bound(r)), ordered[0])


def _check_indexes(s: Strategy) -> None:
    """Whatever the strategy keeps is what a rebuild from the pool would give."""
    pool = s.pool
    for index in [v for v in vars(s).values() if isinstance(v, ScoreIndex)]:
        live = {e[2] for e in index._heap if index._live.get(e[2]) == e[1]}
        assert live == {r.index for r in index._replicas.values() if r.has_slot}
        for key, seq, i in index._heap:
            if index._live.get(i) == seq:
                assert key == index.key(pool.replicas[i])
    if isinstance(s, RoundRobin):
        assert s._open == [r.index for r in pool if r.has_slot]
    if isinstance(s, WeightedRoundRobin):
        assert s._open == [r.has_slot for r in pool]
        assert s._weight == [r.weight for r in pool]
        assert math.isclose(s._open_weight, sum(r.weight for r in pool if r.has_slot), abs_tol=1e-9)
        entries = [e for e in s._pending + s._eligible if s._version[e[1]] == e[2]]
        assert sorted(e[1] for e in entries) == [r.index for r in pool if r.has_slot]
    if isinstance(s, WeightedRandom):
        assert s._max.value == max(r.weight for r in pool)
    if isinstance(s, P2CPeakEwma):
        assert s._max.value == max(r.speed for r in pool)
    if isinstance(s, Affinity):
        active = [r for r in pool if r.state is ReplicaState.ACTIVE]
        assert s._n_active == len(active)
        assert s._total == sum(r.in_flight for r in active)
        # A running sum of floats: equal up to rounding relative to the largest speed.
        tolerance = 1e-9 * max(r.speed for r in pool)
        assert math.isclose(s._speed_total, sum(r.speed for r in active), abs_tol=tolerance)
    if isinstance(s, CapacityAware):
        assert s._held == [sum(q.total_tokens for q in r.running.values()) for r in pool]


class ShortWalkAffinity(Affinity):
    """Ranks the open replicas after one ring point, so that path runs often."""

    walk_budget = 1


class ShortWalkCapacityAware(CapacityAware):
    """Switches to its plain pass at the first replica without room: that path runs often."""

    walk_budget = 0


Factory = Callable[[random.Random], Strategy]
CASES: list[tuple[str, Factory]] = [
    *((name, partial(create_strategy, name, None)) for name in sorted(STRATEGIES)),
    ("affinity/short-walk", partial(ShortWalkAffinity, vnodes=4, balance=1.0)),
    ("affinity/one-point", partial(create_strategy, "affinity", {"vnodes": 1})),
    ("tiered/heavy-500", partial(create_strategy, "tiered", {"heavy_tokens": 500})),
    ("capacity-aware/stale-1s", partial(create_strategy, "capacity-aware", {"stale_after_s": 1})),
    ("capacity-aware/short-walk", ShortWalkCapacityAware),
]


@pytest.mark.parametrize(("label", "factory"), CASES, ids=[label for label, _ in CASES])
@PROPERTY
@given(fleet=fleets, ops=operations)
def test_a_pick_is_always_a_replica_that_can_take_the_request_or_none_when_none_can(
    label: str,  # noqa: ARG001 -- names the case in the report; the factory does the work
    factory: Factory,
    fleet: list[Spec],
    ops: list[tuple[Any, ...]],
) -> None:
    pool = make_pool(fleet)
    s = attach_strategy(factory(random.Random(len(ops))), pool)
    for step, op in enumerate(ops):
        now = 100.0 + step * 0.5
        if op[0] != "pick":
            _apply(pool, op, now)
            continue
        req = request(op[1], op[2], key=op[3], avoid={i % len(pool) for i in op[4]})
        req.waiting_ahead = op[5]
        chosen = s.pick(req, now)
        _check_pick(s, req, chosen, now)
        if chosen is not None:
            dispatch(pool, chosen, req)
    _check_indexes(s)
    assert len(s.explain(request(), 200.0, None).candidates) == len(pool)


@pytest.mark.parametrize("walk_budget", [1, 16])
@PROPERTY
@given(
    batch_sizes=st.lists(st.integers(1, 3), min_size=2, max_size=24),
    keys=st.lists(
        st.tuples(st.integers(0, 1_000), st.frozensets(slot, max_size=6)), min_size=30, max_size=80
    ),
)
def test_affinity_picks_what_the_bounded_load_ring_walk_picks(
    walk_budget: int, batch_sizes: list[int], keys: list[tuple[int, frozenset[int]]]
) -> None:
    """Saturating a fleet of small batches, every keyed pick matches the brute-force walk,
    whether it came from walking the ring or from ranking the open replicas."""
    pool = make_pool([Spec(batch_size=b) for b in batch_sizes])
    s = Affinity(vnodes=8)
    s.walk_budget = walk_budget
    attach_strategy(s, pool)
    for k, avoid in keys:
        req = request(key=f"user-{k}", avoid={i % len(pool) for i in avoid})
        can = [r for r in pool if r.can_take(req)]
        chosen = s.pick(req, 0.0)
        if not can:
            assert chosen is None
            for r in pool:  # free everything: the next round starts from an empty fleet
                for q in list(r.running.values()):
                    complete(pool, r, q)
            continue
        assert chosen is _ring_walk(s, req, can)
        dispatch(pool, chosen, req)


# ---- weighted strategies converge to their weights ----------------------------------------

CONVERGENCE = settings(max_examples=25, deadline=None, derandomize=True)
weight_lists = st.lists(weights, min_size=2, max_size=12)


@CONVERGENCE
@given(ws=weight_lists)
def test_smooth_wrr_stays_within_one_pick_of_every_weight_share(ws: list[float]) -> None:
    """EEVDF's lag bound: at every prefix t, |picks_i - t * w_i / W| < 1.

    A deterministic scheduler has no noise to allow for; one pick is the granularity of the
    schedule, and the eligibility rule (S <= V) keeps a replica from running ahead by more.
    """
    s = attach("weighted-round-robin", weighted_pool(ws))
    total, counts = sum(ws), [0] * len(ws)
    for t in range(1, 20 * len(ws) + 1):
        r = pick_and_run(s, request())
        assert r is not None
        counts[r.index] += 1
        for c, w in zip(counts, ws, strict=True):
            assert abs(c - t * w / total) < 1 + 1e-9


@CONVERGENCE
@given(ws=weight_lists)
def test_weighted_random_shares_converge_to_weight_shares(ws: list[float]) -> None:
    """Over N seeded draws each count is Binomial(N, w_i / W).

    Five standard deviations (plus one draw for rounding) bound a correct sampler's deviation
    with odds of failure about 6e-7 per replica, so a failure means a biased draw, not bad
    luck; a sampler off by even 10% of a share of 1/12 fails it at N = 3000.
    """
    n = 3000
    s = attach("weighted-random", weighted_pool(ws), seed=1)
    counts = Counter(r.index for r in (pick_and_run(s, request()) for _ in range(n)) if r)
    total = sum(ws)
    for i, w in enumerate(ws):
        p = w / total
        assert abs(counts[i] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


@CONVERGENCE
@given(ws=weight_lists)
def test_weighted_least_connections_under_saturation_holds_weight_shares(ws: list[float]) -> None:
    """Under saturation (nothing completes) WLC is the D'Hondt apportionment, which bounds
    each replica's in-flight count: N * w_i / W - 1 <= s_i <= (N + m) * w_i / W.

    Greedy min of (s_i + 1) / w_i keeps s_i / w_i <= (s_j + 1) / w_j for all i, j; summing
    over j gives both bounds. Batch sizes are set high so the weights, not the slots, bind.
    """
    m, n = len(ws), 40 * len(ws)
    pool = weighted_pool(ws, batch_size=10 * n)
    s = attach("weighted-least-connections", pool)
    for _ in range(n):
        req = request()
        r = s.pick(req, 0.0)
        assert r is not None
        dispatch(pool, r, req)
    total = sum(ws)
    for r, w in zip(pool, ws, strict=True):
        assert n * w / total - 1 - 1e-9 <= r.in_flight <= (n + m) * w / total + 1e-9
