"""Each routing strategy's own behaviour, on small hand-built fleets."""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import groupby

import pytest

from router.errors import ControlError
from router.replica import EngineLoad, ReplicaState, Telemetry
from router.request import Request
from router.strategies import STRATEGIES, create_strategy
from router.strategies.affinity import Affinity
from router.strategies.capacity_aware import CapacityAware
from router.strategies.p2c_peak_ewma import P2CPeakEwma
from tests.strategy_helpers import (
    Spec,
    attach,
    complete,
    dispatch,
    make_pool,
    pick_and_run,
    request,
    sequence,
    set_state,
    set_weight,
    weighted_pool,
)

ALL = sorted(STRATEGIES)


# ---- registry -----------------------------------------------------------------------------


def test_registry_lists_the_twelve_strategies_of_the_design() -> None:
    assert set(STRATEGIES) == {
        "round-robin",
        "weighted-round-robin",
        "random",
        "weighted-random",
        "least-connections",
        "weighted-least-connections",
        "least-outstanding-tokens",
        "shortest-expected-delay",
        "p2c-peak-ewma",
        "capacity-aware",
        "tiered",
        "affinity",
    }


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_has_a_one_line_summary_and_described_params(name: str) -> None:
    cls = STRATEGIES[name]
    assert cls.name == name
    assert cls.summary.strip()
    assert "\n" not in cls.summary
    assert len(cls.summary) <= 90
    for param, text in cls.describe_params().items():
        assert param.isidentifier()
        assert text.strip()


def test_create_strategy_refuses_an_unknown_name_and_lists_the_known_ones() -> None:
    with pytest.raises(ControlError, match=r"unknown strategy 'fastest'.*round-robin"):
        create_strategy("fastest")


@pytest.mark.parametrize("name", ALL)
def test_create_strategy_refuses_an_unknown_parameter(name: str) -> None:
    with pytest.raises(ControlError, match="no parameter 'speed'"):
        create_strategy(name, {"speed": 2})


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("tiered", {"heavy_tokens": 0}, "heavy_tokens must be at least 1"),
        ("tiered", {"heavy_tokens": "many"}, "heavy_tokens must be a whole number"),
        ("tiered", {"strong_tier": ""}, "strong_tier must be a tier name"),
        ("affinity", {"vnodes": 0}, "vnodes must be a whole number from 1 to 4096"),
        ("affinity", {"balance": 0.9}, "balance must be at least 1.0"),
        ("affinity", {"balance": True}, "balance must be a number"),
        ("capacity-aware", {"stale_after_s": -1}, "stale_after_s must be positive"),
        ("capacity-aware", {"stale_after_s": "3"}, "stale_after_s must be a number"),
        ("p2c-peak-ewma", {"prior_latency": 1.0}, "takes no parameter 'prior_latency'"),
    ],
)
def test_create_strategy_refuses_bad_parameter_values_with_a_clear_message(
    name: str, params: dict[str, object], message: str
) -> None:
    with pytest.raises(ControlError, match=message):
        create_strategy(name, params)


def test_create_strategy_accepts_documented_parameters() -> None:
    assert isinstance(create_strategy("affinity", {"vnodes": 8, "balance": 2}), Affinity)
    assert create_strategy("capacity-aware", {"stale_after_s": 1}).describe_params()
    assert isinstance(create_strategy("p2c-peak-ewma", {}), P2CPeakEwma)


@pytest.mark.parametrize("name", ALL)
def test_explain_lists_every_replica_with_its_eligibility(name: str) -> None:
    pool = weighted_pool([2.0, 1.0, 1.0])
    s = attach(name, pool)
    req = request(key="session-1")
    set_state(pool, pool.replicas[2], ReplicaState.DRAINING)
    chosen = s.pick(req, 0.0)
    e = s.explain(req, 0.0, chosen)
    assert e.strategy == name
    assert e.request_id == req.id
    assert chosen is not None
    assert e.chosen == chosen.id
    assert [c.replica for c in e.candidates] == ["r0", "r1", "r2"]
    assert [c.eligible for c in e.candidates] == [True, True, False]


@pytest.mark.parametrize(
    "name",
    [
        "least-connections",
        "weighted-least-connections",
        "least-outstanding-tokens",
        "shortest-expected-delay",
        "p2c-peak-ewma",
        "capacity-aware",
        "tiered",
    ],
)
def test_explain_scores_show_the_chosen_replica_as_lowest(name: str) -> None:
    pool = weighted_pool([2.0, 1.0, 1.0])
    s = attach(name, pool)
    dispatch(pool, pool.replicas[0], request())
    req = request()
    chosen = s.pick(req, 0.0)
    e = s.explain(req, 0.0, chosen)
    scores = {c.replica: c.score for c in e.candidates}
    assert all(v is not None for v in scores.values())
    assert chosen is not None
    assert scores[chosen.id] == min(v for v in scores.values() if v is not None)


# ---- round-robin --------------------------------------------------------------------------


def test_round_robin_takes_each_replica_in_turn() -> None:
    s = attach("round-robin", weighted_pool([4.0, 1.0, 1.0]))
    assert sequence(s, 7) == ["r0", "r1", "r2", "r0", "r1", "r2", "r0"]


def test_round_robin_skips_replicas_that_cannot_take_the_request() -> None:
    pool = weighted_pool([1.0, 1.0, 1.0, 1.0])
    s = attach("round-robin", pool)
    set_state(pool, pool.replicas[1], ReplicaState.EJECTED)
    picks = [pick_and_run(s, request(avoid={2})) for _ in range(4)]
    assert [r.id for r in picks if r is not None] == ["r0", "r3", "r0", "r3"]


# ---- smooth weighted round-robin ----------------------------------------------------------


def _letters(ids: list[str]) -> str:
    return "".join("abcdefgh"[int(i[1:])] for i in ids)


def test_smooth_wrr_interleaves_weights_5_1_1_like_nginx_or_better() -> None:
    s = attach("weighted-round-robin", weighted_pool([5.0, 1.0, 1.0]))
    seq = _letters(sequence(s, 21))
    assert seq == "abaacaa" * 3
    longest_heavy_run = max(len(list(run)) for who, run in groupby(seq) if who == "a")
    assert longest_heavy_run == 3  # nginx's a a b a c a a repeats into runs of 4


def test_smooth_wrr_keeps_every_replica_within_one_pick_of_its_share() -> None:
    rng = random.Random(7)
    for _ in range(20):
        weights = [round(rng.uniform(0.1, 8.0), 2) for _ in range(rng.randint(2, 10))]
        s = attach("weighted-round-robin", weighted_pool(weights))
        counts = [0] * len(weights)
        total = sum(weights)
        for t in range(1, 500):
            r = pick_and_run(s, request())
            assert r is not None
            counts[r.index] += 1
            assert all(abs(c - t * w / total) < 1.0 for c, w in zip(counts, weights, strict=True))


def test_smooth_wrr_does_not_penalise_a_replica_skipped_for_one_request() -> None:
    s = attach("weighted-round-robin", weighted_pool([1.0, 1.0, 1.0]))
    assert sequence(s, 1) == ["r0"]
    skipped = pick_and_run(s, request(avoid={1}))
    assert skipped is not None
    assert skipped.id == "r2"
    assert sequence(s, 1) == ["r1"]  # its turn was kept, not lost


def test_smooth_wrr_serves_a_request_that_only_a_replica_not_yet_due_can_take() -> None:
    s = attach("weighted-round-robin", weighted_pool([1.0, 1.0]))
    assert sequence(s, 1) == ["r0"]  # r0 is now ahead of the virtual clock, not yet due
    r = pick_and_run(s, request(avoid={1}))
    assert r is not None
    assert r.id == "r0"


def test_smooth_wrr_explanation_shows_the_deadline_the_pick_won_with() -> None:
    s = attach("weighted-round-robin", weighted_pool([2.0, 1.0]))
    req = request()
    chosen = s.pick(req, 0.0)
    assert chosen is not None
    assert chosen.id == "r0"
    scores = {c.replica: c.score for c in s.explain(req, 0.0, chosen).candidates}
    assert scores == {"r0": 0.5, "r1": 1.0}


def test_smooth_wrr_gives_a_returning_replica_its_turn_but_no_burst() -> None:
    pool = weighted_pool([1.0, 1.0, 1.0])
    s = attach("weighted-round-robin", pool)
    set_state(pool, pool.replicas[2], ReplicaState.EJECTED)
    sequence(s, 30)
    set_state(pool, pool.replicas[2], ReplicaState.ACTIVE)
    after = Counter(sequence(s, 6))
    assert after == {"r0": 2, "r1": 2, "r2": 2}


def test_smooth_wrr_follows_a_weight_change_at_once() -> None:
    pool = weighted_pool([1.0, 1.0])
    s = attach("weighted-round-robin", pool)
    sequence(s, 4)
    set_weight(pool, pool.replicas[0], 3.0)
    assert Counter(sequence(s, 40)) == {"r0": 30, "r1": 10}


# ---- random and weighted random -------------------------------------------------------------


def test_random_draws_uniformly_among_replicas_that_can_take_the_request() -> None:
    pool = weighted_pool([8.0, 1.0, 1.0, 1.0])
    s = attach("random", pool, seed=3)
    set_state(pool, pool.replicas[3], ReplicaState.DRAINING)
    counts = Counter(r.id for r in (pick_and_run(s, request()) for _ in range(3000)) if r)
    assert set(counts) == {"r0", "r1", "r2"}
    # Binomial(3000, 1/3): sd ~26; 5 sd keeps this check away from luck.
    assert all(abs(c - 1000) < 130 for c in counts.values())


def test_random_finds_the_one_eligible_replica_even_when_draws_keep_missing() -> None:
    pool = weighted_pool([1.0] * 64)
    s = attach("random", pool)
    req = request(avoid=set(range(64)) - {41})
    assert s.pick(req, 0.0) is pool.replicas[41]


def test_weighted_random_draws_in_proportion_to_weight() -> None:
    s = attach("weighted-random", weighted_pool([6.0, 3.0, 1.0]), seed=5)
    counts = Counter(r.id for r in (pick_and_run(s, request()) for _ in range(5000)) if r)
    # Expected 3000/1500/500; 5 binomial sd is 173, 134, 106.
    assert abs(counts["r0"] - 3000) < 173
    assert abs(counts["r1"] - 1500) < 134
    assert abs(counts["r2"] - 500) < 106


def test_weighted_random_follows_a_lighter_heaviest_replica() -> None:
    pool = weighted_pool([8.0, 1.0])
    s = attach("weighted-random", pool, seed=2)
    set_weight(pool, pool.replicas[0], 1.0)
    counts = Counter(r.id for r in (pick_and_run(s, request()) for _ in range(2000)) if r)
    assert abs(counts["r0"] - 1000) < 112  # 5 sd of Binomial(2000, 1/2)


# ---- least-connections family -------------------------------------------------------------


def test_least_connections_picks_the_replica_with_fewest_in_flight() -> None:
    pool = weighted_pool([4.0, 1.0])
    s = attach("least-connections", pool)
    dispatch(pool, pool.replicas[0], request())
    assert s.pick(request(), 0.0) is pool.replicas[1]


def test_weighted_least_connections_sends_heavy_replicas_more_in_flight() -> None:
    pool = weighted_pool([4.0, 1.0])
    s = attach("weighted-least-connections", pool)
    for _ in range(10):
        r = s.pick(request(), 0.0)
        assert r is not None
        dispatch(pool, r, request())
    assert [r.in_flight for r in pool] == [8, 2]


def test_least_outstanding_tokens_counts_work_not_requests() -> None:
    pool = weighted_pool([1.0, 1.0])
    s = attach("least-outstanding-tokens", pool)
    dispatch(pool, pool.replicas[0], request(4000, 1000))
    dispatch(pool, pool.replicas[1], request(10, 10))
    dispatch(pool, pool.replicas[1], request(10, 10))
    assert s.pick(request(), 0.0) is pool.replicas[1]
    assert s.score(pool.replicas[0], request(), 0.0) == 3000.0


# ---- shortest expected delay --------------------------------------------------------------


def test_sed_sends_a_long_request_to_the_strong_card_despite_a_little_more_work_queued() -> None:
    pool = weighted_pool([4.0, 1.0])
    s = attach("shortest-expected-delay", pool)
    dispatch(pool, pool.replicas[0], request(0, 800))  # 800 / 4 = 200 queued "seconds"
    dispatch(pool, pool.replicas[1], request(0, 150))  # 150 / 1 = 150
    short, long = request(0, 10), request(0, 2000)
    assert s.pick(short, 0.0) is pool.replicas[1]  # 150 + 10 < 200 + 2.5
    assert s.pick(long, 0.0) is pool.replicas[0]  # 200 + 500 < 150 + 2000


def test_sed_weighs_replicas_of_one_gpu_model_that_were_given_different_weights() -> None:
    pool = weighted_pool([4.0, 2.0])  # both A100s in the helper: one group, two weights
    s = attach("shortest-expected-delay", pool)
    heavy, _light = pool.replicas
    dispatch(pool, heavy, request(0, 400))  # backlog 100 against the light one's 0
    req = request(0, 1000)
    assert s.pick(req, 0.0) is heavy  # 100 + 1000 / 4 = 350 < 0 + 1000 / 2 = 500


def test_sed_is_exact_against_a_brute_force_scan() -> None:
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randint(1, 30)
        pool = make_pool([Spec(weight=rng.uniform(0.1, 8.0), batch_size=8) for _ in range(n)])
        weight = rng.choice([1.0, 5.0, 12.0])
        limit = rng.choice([0.5, 100.0, NO_LIMIT])
        s = attach("shortest-expected-delay", pool, {"wait_weight": weight, "wait_limit_s": limit})
        for _ in range(rng.randint(0, 60)):
            r = pool.replicas[rng.randrange(n)]
            if r.has_slot:
                dispatch(pool, r, request(rng.randint(0, 4000), rng.randint(1, 2000)))
        req = request(rng.randint(0, 8000), rng.randint(1, 4000))
        req.waiting_ahead = rng.choice([0, 0, 2, 30])
        chosen = s.pick(req, 0.0)
        eligible = [r for r in pool if r.can_take(req)]
        if not eligible:
            assert chosen is None
            continue
        best = min((r.outstanding_cost + req.cost) / r.speed for r in eligible)
        full = [r for r in pool if not r.has_slot and r.fits(req)]
        # Slots free on the full replicas at in_flight / backlog each per second; the
        # requests ahead in the queue take the first ones.
        freeing = sum(r.in_flight * r.speed / r.outstanding_cost for r in full)
        turn = (req.waiting_ahead + 1) / freeing if full else math.inf
        waits = [(r, max(r.outstanding_cost / r.speed / r.in_flight, turn)) for r in full]
        waiting = min(
            (
                (r.outstanding_cost + req.cost) / r.speed + weight * wait
                for r, wait in waits
                if wait <= limit
            ),
            default=math.inf,
        )
        if waiting < best * (1 - 1e-12):
            assert chosen is None  # a full replica still finishes it sooner: it waits
            continue
        if waiting > best * (1 + 1e-12):
            assert chosen is not None
            assert (chosen.outstanding_cost + req.cost) / chosen.speed <= best * (1 + 1e-12)


NO_LIMIT = 1e9
"""A ``wait_limit_s`` no wait in these pools reaches: their speeds are weights of 1 to 8 cost
units a second, so their waits run to hundreds of seconds."""
COMPLETION_ONLY = {"wait_weight": 1.0, "wait_limit_s": NO_LIMIT}
"""Shortest expected delay weighing a second in the router's queue as one of service."""


def test_sed_waits_for_a_fast_full_replica_rather_than_take_a_slow_free_slot() -> None:
    """A fast card with every slot taken still finishes a request sooner than a slow card's
    free slot: the request waits in the router for the fast card's next free slot."""
    pool = make_pool([Spec(weight=8.0, batch_size=2), Spec(weight=1.0, batch_size=2)])
    s = attach("shortest-expected-delay", pool, COMPLETION_ONLY)
    fast, slow = pool.replicas
    dispatch(pool, fast, request(0, 400))
    dispatch(pool, fast, request(0, 400))  # full: backlog 800 / 8 = 100, a slot in 50
    req = request(0, 400)
    assert s.pick(req, 0.0) is None  # 100 + 50 + 400 / 8 = 200 < 0 + 400 / 1 = 400
    dispatch(pool, slow, request(0, 3000))
    dispatch(pool, slow, request(0, 3000))
    assert s.pick(req, 0.0) is None  # nothing free
    # A fast card far behind loses to the slow card's free slot.
    pool2 = make_pool([Spec(weight=8.0, batch_size=2), Spec(weight=1.0, batch_size=2)])
    s2 = attach("shortest-expected-delay", pool2, COMPLETION_ONLY)
    fast2, slow2 = pool2.replicas
    dispatch(pool2, fast2, request(0, 4000))
    dispatch(pool2, fast2, request(0, 4000))  # backlog 1000, a slot in 500
    assert s2.pick(request(0, 100), 0.0) is slow2  # 0 + 100 < 1000 + 500 + 12.5


def test_sed_sends_a_request_deep_in_the_queue_to_the_free_slot_instead_of_waiting() -> None:
    """Requests ahead of it in the queue take the fast card's next free slots first: its wait
    is its turn, and past a few turns the slow card's free slot finishes it sooner."""
    pool = make_pool([Spec(weight=8.0, batch_size=2), Spec(weight=1.0, batch_size=2)])
    s = attach("shortest-expected-delay", pool, COMPLETION_ONLY)
    fast, slow = pool.replicas
    dispatch(pool, fast, request(0, 400))
    dispatch(pool, fast, request(0, 400))  # full: backlog 100, slots free 1 per 50
    req = request(0, 400)
    req.waiting_ahead = 1
    assert s.pick(req, 0.0) is None  # 100 + 2 * 50 + 50 = 250 < 400
    req.waiting_ahead = 5
    assert s.pick(req, 0.0) is slow  # 100 + 6 * 50 + 50 = 450 > 400


def test_sed_weighs_a_wait_in_the_queue_above_a_second_of_service() -> None:
    """The wait comes before the first token: with the default weight of 5 the fast card's
    next slot 50 s away costs 250, and the slow card's free slot (400) wins where completion
    time alone (200) would keep the request waiting."""
    pool = make_pool([Spec(weight=8.0, batch_size=2), Spec(weight=1.0, batch_size=2)])
    s = attach("shortest-expected-delay", pool, {"wait_limit_s": NO_LIMIT})
    fast, slow = pool.replicas
    dispatch(pool, fast, request(0, 400))
    dispatch(pool, fast, request(0, 400))  # full: backlog 100, a slot in 50
    req = request(0, 400)
    assert s.pick(req, 0.0) is slow  # 100 + 5 * 50 + 50 = 400, not under 0 + 400
    short_wait = request(0, 2000)
    assert s.pick(short_wait, 0.0) is None  # 100 + 250 + 250 = 600 < 2000: it waits


def test_sed_refuses_a_wait_weight_under_one() -> None:
    for bad in (0.5, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ControlError, match="wait_weight must be"):
            attach("shortest-expected-delay", make_pool([Spec()]), {"wait_weight": bad})


def test_sed_never_waits_longer_than_its_wait_limit_for_a_full_replica() -> None:
    """However much sooner the fast card would finish it, a request whose turn there is
    further off than ``wait_limit_s`` takes the free slot: the whole wait would come before
    its first token."""
    for limit, waits in ((60.0, True), (40.0, False)):
        pool = make_pool([Spec(weight=8.0, batch_size=2), Spec(weight=1.0, batch_size=2)])
        s = attach("shortest-expected-delay", pool, {"wait_limit_s": limit})
        fast, slow = pool.replicas
        dispatch(pool, fast, request(0, 400))
        dispatch(pool, fast, request(0, 400))  # full: backlog 100, a slot in 50
        req = request(0, 4000)  # 100 + 5 * 50 + 500 = 850, far under the slow card's 4000
        assert s.pick(req, 0.0) is (None if waits else slow)


def test_sed_refuses_a_wait_limit_that_is_not_a_positive_number() -> None:
    for bad in (0, -1, float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ControlError, match="wait_limit_s must be"):
            attach("shortest-expected-delay", make_pool([Spec()]), {"wait_limit_s": bad})


# ---- power of two choices ------------------------------------------------------------------


def test_p2c_sends_a_replica_work_in_proportion_to_its_learned_capacity() -> None:
    """Two replicas, one learned 4x as fast: under saturation P2C keeps their expected
    finishing times level, so the fast one holds about 4x the work."""
    pool = weighted_pool([1.0, 1.0], batch_size=1000)
    pool.replicas[0].speed, pool.replicas[1].speed = 4000.0, 1000.0
    for r in pool:
        pool.changed(r)
    s = attach("p2c-peak-ewma", pool)
    for _ in range(200):
        req = request()
        chosen = s.pick(req, 0.0)
        assert chosen is not None
        dispatch(pool, chosen, req)
    fast, slow = (r.in_flight for r in pool)
    assert fast + slow == 200
    assert 3.5 <= fast / slow <= 4.5


def test_p2c_avoids_a_replica_slower_now_than_learned() -> None:
    """A replica whose recent requests took 5x what its capacity predicted (peak EWMA) is
    picked far less, though its learned capacity is the same as its peer's."""
    pool = weighted_pool([1.0, 1.0], batch_size=1000)
    lagging = pool.replicas[1]
    for t in range(60):
        lagging.slowdown.observe(1.0, float(t))
        lagging.slowdown_norm.observe(1.0, float(t))
    lagging.slowdown.observe(5.0, 60.0)  # the peak takes it at once, the usual level barely
    lagging.slowdown_norm.observe(5.0, 60.0)
    assert lagging.slowdown_factor() > 4
    s = attach("p2c-peak-ewma", pool)
    for _ in range(120):
        req = request()
        chosen = s.pick(req, 0.0)
        assert chosen is not None
        dispatch(pool, chosen, req)
    healthy, slowed = (r.in_flight for r in pool)
    assert healthy >= 4 * slowed


def test_p2c_draws_by_capacity_so_a_fast_card_is_not_capped_at_two_in_n() -> None:
    """Uniform draws make a replica a candidate in about 2/n of the picks whatever its speed.
    Drawn by learned capacity, a card with 12 of 15 units of capacity wins far more: it is
    idle and fastest, so it wins whenever it is drawn: first 12/15, else second 12/14, 0.971
    in all (uniform draws would give 0.5). Binomial(3000, 0.971): 5 sd is 46."""
    pool = weighted_pool([1.0, 1.0, 1.0, 1.0])
    for r, speed in zip(pool, [12_000.0, 1_000.0, 1_000.0, 1_000.0], strict=True):
        r.speed = speed
        pool.changed(r)
    s = attach("p2c-peak-ewma", pool, seed=9)
    counts = Counter(r.id for r in (pick_and_run(s, request()) for _ in range(3000)) if r)
    assert abs(counts["r0"] - 3000 * (12 / 15 + 3 / 15 * 12 / 14)) < 46


def test_p2c_breaks_a_tie_in_favour_of_the_faster_replica() -> None:
    pool = weighted_pool([4.0, 1.0])
    s = attach("p2c-peak-ewma", pool)
    fast, slow = (s.score(r, request(), 0.0) for r in pool)
    assert fast is not None
    assert slow is not None
    assert fast < slow
    assert all(pick_and_run(s, request()) is pool.replicas[0] for _ in range(50))


# ---- capacity-aware ------------------------------------------------------------------------


def _kv_pool() -> tuple[CapacityAware, list[Spec]]:
    specs = [Spec(kv_capacity_tokens=10_000), Spec(kv_capacity_tokens=4_000)]
    s = attach("capacity-aware", make_pool(specs))
    assert isinstance(s, CapacityAware)
    return s, specs


def test_capacity_aware_skips_a_replica_whose_kv_cache_is_too_full_now() -> None:
    s, _ = _kv_pool()
    big, small = s.pool.replicas
    dispatch(s.pool, big, request(7000, 1000))  # 2,000 tokens left
    req = request(2000, 1000)
    assert s.pick(req, 0.0) is small  # more outstanding work, but room
    assert "router accounting" in s.explain(req, 0.0, small).note


def test_capacity_aware_waits_when_no_replica_has_room_now() -> None:
    s, _ = _kv_pool()
    big, small = s.pool.replicas
    dispatch(s.pool, big, request(7000, 1000))
    dispatch(s.pool, small, request(2000, 1000))
    req = request(1500, 1000)
    assert all(r.can_take(req) for r in s.pool)
    assert s.pick(req, 0.0) is None
    assert "waits" in s.explain(req, 0.0, None).note


def test_capacity_aware_trusts_fresh_kv_telemetry_and_ignores_stale() -> None:
    s, _ = _kv_pool()
    big, small = s.pool.replicas
    dispatch(s.pool, small, request(10, 10))  # so that big wins on outstanding work
    big.telemetry = Telemetry(utilization=0.9, received_at=10.0, kv_usage=0.95)
    req = request(1000, 500)
    assert s.pick(req, 11.0) is small  # fresh: 500 tokens free
    assert "engine telemetry" in s.explain(req, 11.0, big).note
    assert s.pick(req, 14.0) is big  # 4 s old: stale, router accounting says empty


def test_capacity_aware_keeps_requests_in_the_router_while_an_engines_batch_is_full() -> None:
    """The engine said 2 wait in its own queue while it ran 3: with 3 of ours there, a fourth
    would only wait inside it, so the request waits in the router's queue instead; once one
    of ours finishes (2 there, fewer than it ran) it may go again; a reading older than
    ``stale_after_s`` is not trusted."""
    s = attach("capacity-aware", make_pool([Spec(kv_capacity_tokens=100_000)]))
    (r,) = s.pool.replicas
    for _ in range(3):
        dispatch(s.pool, r, request(10, 10))
    r.engine = EngineLoad("vllm", received_at=10.0, waiting=2, running=3, kv_usage=0.2)
    assert s.pick(request(10, 10), 11.0) is None
    assert s.pick(request(10, 10), 14.0) is r  # stale
    complete(s.pool, r, next(iter(r.running.values())))
    assert s.pick(request(10, 10), 11.0) is r


def test_capacity_aware_finds_the_least_loaded_replica_with_room_in_a_kv_full_fleet() -> None:
    pool = make_pool([Spec(kv_capacity_tokens=8_000) for _ in range(64)])
    s = attach("capacity-aware", pool)
    for i, r in enumerate(pool):
        # Every 10th replica keeps 3,000 tokens of room but has the most work (cost 5,000+);
        # the others are full of long prompts (7,500 tokens) that cost less (4,000).
        dispatch(pool, r, request(0, 5_000 + i) if i % 10 == 0 else request(7_000, 500))
    assert s.pick(request(1_000, 1_000), 0.0) is pool.replicas[0]
    dispatch(pool, pool.replicas[0], request(0, 100))
    assert s.pick(request(1_000, 1_000), 0.0) is pool.replicas[10]


def test_capacity_aware_treats_unknown_kv_capacity_as_unlimited() -> None:
    s = attach("capacity-aware", make_pool([Spec(kv_capacity_tokens=None)]))
    req = request(50_000, 50_000)
    r = s.pick(req, 0.0)
    assert r is not None
    assert "unlimited" in s.explain(req, 0.0, r).note


def test_capacity_aware_never_picks_a_replica_the_request_cannot_fit() -> None:
    s, _ = _kv_pool()
    assert s.pick(request(3000, 2000), 0.0) is s.pool.replicas[0]
    assert s.pick(request(9000, 2000), 0.0) is None


# ---- tiered --------------------------------------------------------------------------------


def _tiered_pool(strong_batch: int = 4) -> list[Spec]:
    return [
        Spec(weight=4.0, tier="strong", batch_size=strong_batch),
        Spec(weight=1.0, tier="standard"),
        Spec(weight=1.0, tier="standard"),
    ]


def test_tiered_sends_heavy_requests_to_the_strong_tier() -> None:
    s = attach("tiered", make_pool(_tiered_pool()))
    pool = s.pool
    for _ in range(3):  # the strong replica is already busier per unit of weight...
        dispatch(pool, pool.replicas[0], request())
    heavy = request(3000, 500)
    assert s.pick(heavy, 0.0) is pool.replicas[0]  # ...but heavy requests go there anyway
    assert s.note(heavy, pool.replicas[0]) == "heavy (3500 tokens): strong tier"


def test_tiered_spills_heavy_requests_over_when_the_strong_tier_is_full() -> None:
    s = attach("tiered", make_pool(_tiered_pool(strong_batch=1)))
    pool = s.pool
    dispatch(pool, pool.replicas[0], request())
    heavy = request(3000, 500)
    chosen = s.pick(heavy, 0.0)
    assert chosen is not None
    assert chosen.config.tier == "standard"
    assert "spilled over" in s.note(heavy, chosen)


def test_tiered_sends_light_requests_anywhere_by_weighted_least_connections() -> None:
    s = attach("tiered", make_pool(_tiered_pool(strong_batch=32)))
    pool = s.pool
    for _ in range(6):
        r = s.pick(request(), 0.0)
        assert r is not None
        dispatch(pool, r, request())
    assert [r.in_flight for r in pool] == [4, 1, 1]
    assert s.note(request(), None).startswith("light (200 tokens < 2048)")


def test_tiered_uses_its_parameters() -> None:
    specs = [Spec(tier="gold"), Spec(tier="strong")]
    s = attach("tiered", make_pool(specs), {"heavy_tokens": 100, "strong_tier": "gold"})
    assert s.pick(request(60, 40), 0.0) is s.pool.replicas[0]


# ---- affinity ------------------------------------------------------------------------------


def test_affinity_keeps_a_key_on_one_replica() -> None:
    pool = weighted_pool([1.0] * 8)
    s = attach("affinity", pool)
    homes = {}
    for key in (f"session-{k}" for k in range(40)):
        picks = {s.pick(request(key=key), 0.0) for _ in range(5)}
        assert len(picks) == 1
        homes[key] = picks.pop()
    assert len(set(homes.values())) >= 6  # and the keys spread over the fleet


def test_affinity_ring_is_stable_across_instances_and_processes() -> None:
    """blake2b, not hash(): the same key lands on the same replica after a restart."""
    a = attach("affinity", weighted_pool([1.0] * 8))
    b = attach("affinity", weighted_pool([1.0] * 8))
    for k in range(20):
        ra, rb = a.pick(request(key=f"k{k}"), 0.0), b.pick(request(key=f"k{k}"), 0.0)
        assert ra is not None
        assert rb is not None
        assert ra.id == rb.id
    # Pinned: a change of hash or point naming would move every session on upgrade.
    r = a.pick(request(key="pinned"), 0.0)
    assert r is not None
    assert r.id == "r3"


def test_affinity_moves_a_hot_key_on_at_the_load_bound_and_the_spill_is_sticky() -> None:
    pool = weighted_pool([1.0] * 4)
    s = attach("affinity", pool)
    assert isinstance(s, Affinity)
    rounds = []
    for _ in range(2):
        placed = []
        for _ in range(8):
            req = request(key="hot")
            r = s.pick(req, 0.0)
            assert r is not None
            assert r.in_flight < s.load_bound()
            dispatch(pool, r, req)
            placed.append(r)
        # 8 requests of one key on 4 replicas: none past 1.25x the mean, the rest spilled.
        assert max(r.in_flight for r in pool) == math.ceil(1.25 * 8 / 4)
        rounds.append([r.id for r in placed])
        for r in pool:
            for q in list(r.running.values()):
                complete(pool, r, q)
    assert rounds[0] == rounds[1]  # the same key spills to the same replicas, in order
    assert "home" in s.note(request(key="hot"), placed[1])


def test_affinity_goes_past_the_bound_only_when_no_replica_under_it_can_take_it() -> None:
    pool = weighted_pool([1.0, 1.0])
    s = attach("affinity", pool)
    assert isinstance(s, Affinity)
    home = s.pick(request(key="x"), 0.0)
    assert home is not None
    for _ in range(3):
        dispatch(pool, home, request())
    assert home.in_flight >= s.load_bound()  # ceil(1.25 * 4 / 2) = 3
    other = pool.replicas[1 - home.index]
    assert s.pick(request(key="x"), 0.0) is other
    assert s.pick(request(key="x", avoid={other.index}), 0.0) is home


def test_affinity_in_a_nearly_full_fleet_gives_the_ring_walks_answer() -> None:
    """Past a short walk the pick ranks the open replicas by ring distance: same answer."""
    pool = make_pool([Spec(batch_size=1) for _ in range(64)])
    s = attach("affinity", pool, {"vnodes": 16})
    assert isinstance(s, Affinity)
    for r in pool.replicas[:-3]:
        dispatch(pool, r, request())
    for k in range(30):
        key = f"user-{k}"
        chosen = s.pick(request(key=key), 0.0)
        nearest = min(pool.replicas[-3:], key=lambda r: s.ring_distance(r, key))
        assert chosen is nearest


def test_affinity_without_a_key_uses_weighted_least_connections() -> None:
    pool = weighted_pool([4.0, 1.0])
    s = attach("affinity", pool)
    for _ in range(5):
        r = s.pick(request(), 0.0)
        assert r is not None
        dispatch(pool, r, request())
    assert [r.in_flight for r in pool] == [4, 1]
    assert "no affinity key" in s.note(request(), None)


def test_affinity_skips_replicas_that_cannot_take_the_request() -> None:
    pool = weighted_pool([1.0] * 4)
    s = attach("affinity", pool)
    first = s.pick(request(key="k"), 0.0)
    assert first is not None
    again = s.pick(request(key="k", avoid={first.index}), 0.0)
    assert again is not None
    assert again is not first
    set_state(pool, first, ReplicaState.EJECTED)
    assert s.pick(request(key="k"), 0.0) is again


def test_requests_are_unchanged_by_picking() -> None:
    """A pick is a decision, not a dispatch: it leaves the request and the load alone."""
    for name in ALL:
        pool = weighted_pool([2.0, 1.0])
        s = attach(name, pool)
        req: Request = request(key="k")
        s.pick(req, 0.0)
        assert req.avoid == set()
        assert all(r.in_flight == 0 for r in pool)


def test_sed_counts_only_the_slots_its_own_requests_free_when_peers_share_a_replica() -> None:
    """Behind several routers, a slot another router's request frees shows only at that
    router's next report: this router's turn at a full fast card comes from its own requests
    there, not from every request the peers run on it."""
    pool = make_pool([Spec(weight=8.0, batch_size=2), Spec(weight=1.0, batch_size=2)])
    s = attach("shortest-expected-delay", pool, COMPLETION_ONLY)
    fast, slow = pool.replicas
    dispatch(pool, fast, request(0, 400))
    # One peer reported two requests there (cost 800 in all): three in flight against a
    # batch of 2 and one request of slack per peer, so it is full; backlog 1200 / 8 = 150.
    fast.peers, fast.peer_offset, fast.peer_cost_offset = 1, 1, 400.0
    pool.changed(fast)
    assert fast.in_flight == 3
    assert not fast.has_slot
    req = request(0, 300)
    # Its own one request frees a slot in 150 s, not every 50 s as three would: 150 + 150
    # + 300 / 8 = 337.5 against the slow card's free slot, 0 + 300 / 1 = 300.
    assert s.pick(req, 0.0) is slow
    fast.peers = fast.peer_offset = 0
    fast.peer_cost_offset = 0.0
    pool.changed(fast)
    dispatch(pool, fast, request(0, 400))  # the same load, all of it this router's own
    dispatch(pool, fast, request(0, 400))
    assert s.pick(req, 0.0) is None  # 150 + 50 + 37.5 = 237.5 < 300: it waits
