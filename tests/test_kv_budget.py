"""The router's booking of each replica's KV cache (router/kv_budget.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.clock import ManualClock
from router.core import RouterCore
from router.kv_budget import FULL_AT, SCALE_BOUNDS, KvBook, booked_tokens
from router.replica import EngineLoad
from router.request import Request
from tests.fleet_factory import make_fleet
from tests.recorder import Recorder

CACHE = 10_000
"""r0's KV cache in the core tests; r1's is unknown (never booked full)."""


def make_core(strategy: str = "least-connections") -> tuple[RouterCore, ManualClock, Recorder]:
    fleet = make_fleet(
        weights=[1.0, 1.0], batch_sizes=[256, 256], strategy=strategy, kv_capacity=[CACHE, None]
    )
    clock = ManualClock()
    core = RouterCore(fleet, clock=clock, rng=random.Random(1))
    rec = Recorder()
    core.listeners.append(rec)
    return core, clock, rec


def request(i: int, prompt: int = 800, max_tokens: int = 400) -> Request:
    return Request(f"q{i}", prompt, max_tokens, arrival=0.0)


def on(rec: Recorder, replica: str) -> int:
    return sum(a.replica.id == replica for a in rec.assigned)


def test_a_request_is_booked_at_its_prompt_and_half_what_it_may_generate() -> None:
    assert booked_tokens(request(0, prompt=800, max_tokens=400)) == 1000


@given(
    sizes=st.lists(st.tuples(st.integers(0, 8000), st.integers(1, 4000)), min_size=1),
    scale=st.floats(0.05, 4.0),
)
def test_the_booking_is_the_sum_of_the_running_requests_and_nothing_once_they_end(
    sizes: list[tuple[int, int]], scale: float
) -> None:
    book = KvBook(scale=scale)
    requests = [request(i, p, m) for i, (p, m) in enumerate(sizes)]
    for q in requests:
        book.add(q)
    n = len(sizes)
    assert book.booked == pytest.approx(sum(p + m / 2 for p, m in sizes))
    assert book.total(n) == book.booked  # nobody else's requests there
    capacity = 20_000
    assert book.full(capacity, n) == (book.booked * scale >= FULL_AT * capacity)
    assert not book.full(None, n)  # an unknown cache is never full
    for q in requests:
        book.remove(q)
    assert (book.booked, book.count) == (0.0, 0)


def test_each_reading_moves_the_scale_towards_the_engines_usage_once() -> None:
    book = KvBook()
    book.add(request(0, prompt=4000, max_tokens=2000))  # booked 5,000 of 10,000

    def read(at: float) -> bool:  # the engine holds 2,500
        return book.calibrate(0.25, capacity=10_000, in_flight=1, read_at=at, queued=False)

    assert read(1.0)
    first = book.scale
    assert 0.5 < first < 1.0
    assert not read(1.0)  # the same reading
    assert book.scale == first
    for t in range(2, 40):
        read(float(t))
    assert book.scale == pytest.approx(0.5, rel=1e-3)
    assert book.tokens(1) == pytest.approx(2500, rel=1e-3)


def test_other_workers_and_routers_requests_are_booked_at_the_mean_of_this_ones() -> None:
    book = KvBook()
    book.add(request(0, prompt=800, max_tokens=400))
    book.add(request(1, prompt=1800, max_tokens=400))  # a mean of 1,500
    assert book.total(in_flight=5) == 3000 + 3 * 1500
    assert book.full(capacity=8000, in_flight=5)
    assert not book.full(capacity=8000, in_flight=2)
    for i in (0, 1):
        book.remove(request(i, prompt=800 + 1000 * i, max_tokens=400))
    assert book.total(in_flight=4) == 4 * 2000  # its last mean stands while only others run


def test_a_reading_with_requests_queued_inside_the_engine_leaves_the_scale_alone() -> None:
    """Queued requests are booked but hold no cache yet: read then, a full cache would scale
    the booking down and open the replica to more of them."""
    core, clock, _ = make_core()
    core.drain("r1")
    for i in range(12):
        core.submit(request(i))  # 9 sent (booked full), 3 wait in the router's queue
    r0 = core.replica("r0")
    for _ in range(10):
        clock.advance(1.0)
        r0.engine = EngineLoad("vllm", received_at=clock(), waiting=2, running=7, kv_usage=0.7)
        core.engines_read()
    assert r0.kv.scale == 1.0
    assert (r0.in_flight, len(core.queue)) == (9, 3)


def test_a_light_booking_or_a_wild_reading_cannot_throw_the_scale() -> None:
    book = KvBook()
    book.add(request(0, prompt=500, max_tokens=200))  # 600 of 10,000: under the share read
    assert not book.calibrate(usage=0.9, capacity=10_000, in_flight=1, read_at=1.0, queued=False)
    assert book.scale == 1.0
    book.add(request(1, prompt=4000, max_tokens=0))
    for t in range(2, 200):
        usage = 1.0 if t % 2 else 0.0
        book.calibrate(usage, capacity=10_000, in_flight=2, read_at=float(t), queued=False)
        assert SCALE_BOUNDS[0] <= book.scale <= SCALE_BOUNDS[1]


def test_a_replica_booked_full_takes_no_more_and_the_next_request_goes_elsewhere() -> None:
    core, _, rec = make_core()
    for i in range(9):  # 9 x 1,000 booked: FULL_AT of r0's 10,000
        core.submit(request(i))
    r0 = core.replica("r0")
    assert r0.in_flight == 5  # least-connections alternates until r0 is booked full
    assert r0.kv.tokens(r0.in_flight) == 5000
    for i in range(9, 17):
        core.submit(request(i))
    assert r0.in_flight == 9
    assert not r0.has_slot
    assert r0.in_flight < r0.batch_size
    core.submit(request(17))
    assert rec.assigned[-1].replica.id == "r1"
    assert core.snapshot().replicas[0].kv_booked_tokens == 9000


def test_a_request_waits_in_the_routers_queue_while_the_only_cache_with_room_is_booked() -> None:
    core, _, rec = make_core()
    core.drain("r1")
    for i in range(10):
        core.submit(request(i))
    assert core.replica("r0").in_flight == 9
    assert len(core.queue) == 1  # not sent to wait inside the engine, where no one else can take it
    core.complete(rec.assigned[0], output_tokens=400)
    assert core.replica("r0").in_flight == 9
    assert len(core.queue) == 0


def test_the_engines_own_usage_lets_a_replica_take_more_than_the_booking_says() -> None:
    """Clients allowing far more tokens than they generate book the cache full too soon; the
    engine's usage scales the booking down, and the waiting request goes."""
    core, clock, _ = make_core()
    core.drain("r1")
    for i in range(10):
        core.submit(request(i, prompt=200, max_tokens=1600))  # 1,000 booked, about 300 held
    r0 = core.replica("r0")
    assert (r0.in_flight, len(core.queue)) == (9, 1)
    for _ in range(5):
        clock.advance(1.0)
        r0.engine = EngineLoad("vllm", received_at=clock(), kv_usage=0.3)
        core.engines_read()
    assert r0.kv.scale < 0.6
    assert (r0.in_flight, len(core.queue)) == (10, 0)


def test_a_booking_scaled_up_by_the_engine_stops_the_replica_sooner() -> None:
    """Another router's requests on the same engine show only in its usage."""
    core, clock, _ = make_core()
    core.drain("r1")
    for i in range(3):
        core.submit(request(i))  # 3,000 booked
    r0 = core.replica("r0")
    for _ in range(10):
        clock.advance(1.0)
        r0.engine = EngineLoad("vllm", received_at=clock(), kv_usage=0.95)
        core.engines_read()
    assert not r0.has_slot
    core.submit(request(3))
    assert (r0.in_flight, len(core.queue)) == (3, 1)


def test_the_fixed_splits_leave_the_booking_alone_and_a_switch_away_applies_it() -> None:
    """Round-robin and the random draws stay the references they are: a booked cache does
    not close a slot under them. Switching to a load-aware strategy closes it at once."""
    core, _, _ = make_core(strategy="round-robin")
    core.drain("r1")
    for i in range(10):
        core.submit(request(i))
    r0 = core.replica("r0")
    assert (r0.in_flight, len(core.queue)) == (10, 0)
    assert r0.kv.full(r0.kv_limit, r0.in_flight)
    assert r0.has_slot
    core.set_strategy("shortest-expected-delay")
    assert not r0.has_slot
    assert core.pool.open_count == 0
    core.submit(request(10))
    assert (r0.in_flight, len(core.queue)) == (10, 1)


def test_a_sibling_workers_requests_fill_the_booking_too() -> None:
    """Under ``serve --workers N`` each worker sends its own requests; the load table's count
    of the others' (``Replica.shared_in_flight``) is booked at this worker's mean."""
    core, _, _ = make_core()
    core.drain("r1")
    for i in range(4):
        core.submit(request(i))  # 4,000 booked by this worker
    r0 = core.replica("r0")
    assert r0.has_slot
    r0.shared_in_flight = 5  # 5 more, another worker's
    assert r0.kv.tokens(r0.in_flight) == 9000
    assert not r0.has_slot
