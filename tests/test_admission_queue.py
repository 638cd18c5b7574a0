"""The admission queue: order, bound, deadlines, and requests leaving exactly once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.admission_queue import AdmissionQueue
from router.request import Priority, Request


def r(i: int, priority: Priority = Priority.NORMAL, deadline: float | None = None) -> Request:
    return Request(f"q{i}", 10, 10, arrival=0.0, priority=priority, deadline=deadline)


def test_order_is_priority_then_arrival() -> None:
    q = AdmissionQueue(10)
    for i, p in enumerate([Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.NORMAL]):
        q.push(r(i, p))
    assert [x.id for x in q.waiting()] == ["q2", "q1", "q3", "q0"]


def test_a_full_queue_refuses_but_a_put_back_request_is_never_refused() -> None:
    q = AdmissionQueue(1)
    assert q.push(r(0))
    assert not q.push(r(1))
    back = r(2)
    q.push_front(back)
    assert [x.id for x in q.waiting()] == ["q2", "q0"]


def test_a_request_put_back_goes_to_the_front_of_its_class_only() -> None:
    q = AdmissionQueue(10)
    q.push(r(0, Priority.HIGH))
    q.push(r(1))
    q.push_front(r(2))
    assert [x.id for x in q.waiting()] == ["q0", "q2", "q1"]


def test_a_removed_then_readmitted_request_appears_once() -> None:
    q = AdmissionQueue(10)
    a, b = r(0), r(1)
    q.push(b)
    q.push(a)
    q.remove(a)
    q.push_front(a)
    assert [x.id for x in q.waiting()] == ["q0", "q1"]


def test_expiry_takes_only_requests_past_their_deadline() -> None:
    q = AdmissionQueue(10)
    q.push(r(0, deadline=5.0))
    q.push(r(1, deadline=10.0))
    q.push(r(2))
    assert q.next_deadline() == 5.0
    assert [x.id for x in q.expire(7.0)] == ["q0"]
    assert q.next_deadline() == 10.0
    assert [x.id for x in q.waiting()] == ["q1", "q2"]


def test_a_duplicate_admission_is_a_bug_and_raises() -> None:
    q = AdmissionQueue(10)
    q.push(r(0))
    with pytest.raises(ValueError, match="already queued"):
        q.push(r(0))


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        AdmissionQueue(0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(list(Priority)), st.none() | st.floats(0, 50)),
        st.tuples(st.just("take"), st.integers(0, 20), st.none()),
        st.tuples(st.just("back"), st.integers(0, 20), st.none()),
        st.tuples(st.just("expire"), st.floats(0, 60), st.none()),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, capacity=st.integers(1, 10))
def test_every_request_leaves_exactly_once_and_order_holds(ops: list, capacity: int) -> None:  # type: ignore[type-arg]
    """Random pushes, takes, put-backs and expiries: nothing is lost, duplicated or misordered."""
    q = AdmissionQueue(capacity)
    inside: dict[str, Request] = {}
    left: list[str] = []
    taken: list[Request] = []
    n = 0
    for op, a, b in ops:
        if op == "push":
            n += 1
            req = r(n, a, b)
            if q.push(req):
                inside[req.id] = req
            else:
                assert len(inside) >= capacity
        elif op == "take" and inside:
            req = list(q.waiting())[a % len(inside)]
            q.remove(req)
            del inside[req.id]
            taken.append(req)
        elif op == "back" and taken:
            req = taken.pop(a % len(taken))
            q.push_front(req)
            inside[req.id] = req
        elif op == "expire":
            for req in q.expire(a):
                assert req.deadline is not None
                assert req.deadline <= a
                del inside[req.id]
                left.append(req.id)
        waiting = list(q.waiting())
        assert sorted(x.id for x in waiting) == sorted(inside)
        assert len(q) == len(inside)
        assert [x.priority for x in waiting] == sorted(x.priority for x in waiting)
        assert sum(q.depth_by_priority().values()) == len(inside)
    assert len(left) == len(set(left))
