"""The load table workers share (router/workers/load_table.py) and how a worker's core counts
its siblings' requests from it (router/workers/shared_load.py): exact sums, a dead worker's
row zeroed, batch sizes held for the whole service."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.clock import ManualClock
from router.core import RouterCore
from router.request import Request
from router.workers.load_table import LoadTable
from router.workers.shared_load import SharedLoad
from tests.fleet_factory import make_fleet

PROPERTY = settings(max_examples=80, deadline=None, derandomize=True)

Write = tuple[int, int, int, float]  # worker, replica, in flight, cost


@pytest.fixture
def table() -> Iterator[LoadTable]:
    t = LoadTable.create(3, 4)
    yield t
    t.close()
    os.close(t.fd)


def _mapped_again(t: LoadTable) -> LoadTable:
    """The same memory mapped a second time, as another process maps it."""
    return LoadTable(t.fd, t.workers, t.replicas)


writes = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(0, 3),
        st.integers(0, 10_000),
        st.floats(0, 1e9, allow_nan=False),
    ),
    max_size=60,
)


@PROPERTY
@given(writes)
def test_what_a_worker_reads_of_the_others_is_the_sum_of_their_last_writes(
    batch: list[Write],
) -> None:
    t = LoadTable.create(3, 4)
    other = _mapped_again(t)
    try:
        last: dict[tuple[int, int], tuple[int, float]] = {}
        for worker, replica, n, cost in batch:
            t.write(worker, replica, n, cost)
            last[worker, replica] = (n, cost)
        for me in range(3):
            for replica in range(4):
                theirs = [v for (w, r), v in last.items() if r == replica and w != me]
                n, cost = other.others(me, replica)
                assert n == sum(v[0] for v in theirs)
                assert cost == pytest.approx(sum(v[1] for v in theirs))
    finally:
        other.close()
        t.close()
        os.close(t.fd)


def test_clearing_a_row_zeroes_that_workers_load_and_pid_and_keeps_its_restarts(
    table: LoadTable,
) -> None:
    table.write(1, 2, 5, 750.0)
    table.write(0, 2, 1, 150.0)
    table.set_pid(1, 4242)
    table.restarted(1)
    table.clear(1)
    assert table.row(1) == [(0, 0.0)] * 4
    assert (table.pid(1), table.restarts(1)) == (0, 1)
    assert table.others(2, 2) == (1, 150.0)


def test_a_table_of_another_shape_is_refused(table: LoadTable) -> None:
    with pytest.raises(ValueError, match="does not match"):
        LoadTable(table.fd, table.workers, table.replicas + 1)


def test_a_cell_outside_the_table_is_refused(table: LoadTable) -> None:
    with pytest.raises(IndexError):
        table.write(3, 0, 1, 1.0)
    with pytest.raises(IndexError):
        table.read(0, 4)


# ---- two cores over one table, as two workers -------------------------------------------


def _workers(batch_sizes: list[int]) -> tuple[list[RouterCore], LoadTable]:
    table = LoadTable.create(2, len(batch_sizes))
    cores = []
    for w in range(2):
        fleet = make_fleet([1.0] * len(batch_sizes), batch_sizes, strategy="least-connections")
        core = RouterCore(fleet, clock=ManualClock())
        core.shared = SharedLoad(_mapped_again(table), w)
        cores.append(core)
    return cores, table


def _submit(core: RouterCore, n: int, prefix: str) -> None:
    for i in range(n):
        core.submit(Request(f"{prefix}{i}", 100, 100, arrival=core.clock()))


def test_least_connections_in_each_worker_counts_both_workers_requests() -> None:
    (a, b), _ = _workers([8, 8])
    _submit(a, 3, "a")  # r0, r1, r0 (or r1, r0, r1): 2 and 1
    _submit(b, 1, "b")  # the replica with 1
    own = [(len(ra.running), len(rb.running)) for ra, rb in zip(a.pool, b.pool, strict=True)]
    assert sorted(x + y for x, y in own) == [2, 2]
    for core in (a, b):
        snap = core.snapshot()
        assert [s.in_flight for s in snap.replicas] == [x + y for x, y in own]


def test_a_batch_size_holds_for_both_workers_together() -> None:
    (a, b), _ = _workers([2, 2])
    _submit(a, 3, "a")
    _submit(b, 3, "b")
    placed = [len(ra.running) + len(rb.running) for ra, rb in zip(a.pool, b.pool, strict=True)]
    assert placed == [2, 2]
    assert len(a.queue) + len(b.queue) == 2


def test_a_slot_a_sibling_frees_is_taken_at_the_next_timer_tick() -> None:
    (a, b), _ = _workers([1])
    _submit(a, 1, "a")
    _submit(b, 1, "b")
    assert len(b.queue) == 1
    a.complete(next(iter(a.running.values())))
    b.expire()  # the driver's 50 ms timer: nothing else tells b
    assert len(b.queue) == 0
    assert len(b.running) == 1


def test_a_dead_workers_cleared_row_stops_counting() -> None:
    (a, b), table = _workers([1])
    _submit(a, 1, "a")
    _submit(b, 1, "b")
    table.clear(0)  # the supervisor reaped worker 0
    b.expire()
    assert len(b.running) == 1
