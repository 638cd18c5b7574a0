"""Rolling waves (router/rollout/plan.py): every replica once, in order, the floor kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.rollout.plan import Member, Plan, PlanError, plan_waves

H100, L4 = 10.0, 1.0


def _fleet(**capacities: float) -> list[Member]:
    return [Member(name, c) for name, c in capacities.items()]


def _remaining(plan: Plan, members: list[Member], wave: int) -> float:
    total = sum(m.capacity for m in members)
    out = {m.id: m.capacity for m in members}
    return 1 - sum(out[r] for r in plan.waves[wave].replicas) / total


def test_four_l4s_go_at_once_while_two_h100s_go_one_by_one() -> None:
    members = _fleet(h0=H100, h1=H100, l0=L4, l1=L4, l2=L4, l3=L4)  # 24 in all
    plan = plan_waves(members, floor=0.55)
    assert [w.replicas for w in plan.waves] == [("l0", "l1", "l2", "l3"), ("h0",), ("h1",)]
    assert plan.lowest == pytest.approx(14 / 24)


def test_weakest_first_is_the_default_and_strongest_first_reverses_it() -> None:
    members = _fleet(a=3.0, b=1.0, c=2.0)
    assert plan_waves(members, 0.4).order == ("b", "c", "a")
    assert plan_waves(members, 0.4, "strongest-first").order == ("a", "c", "b")


def test_an_explicit_order_is_kept() -> None:
    members = _fleet(a=1.0, b=1.0, c=1.0, d=1.0)
    plan = plan_waves(members, 0.5, ("d", "a", "c", "b"))
    assert [w.replicas for w in plan.waves] == [("d", "a"), ("c", "b")]


def test_a_replica_that_alone_breaks_the_floor_is_named() -> None:
    members = _fleet(h0=H100, l0=L4, l1=L4)
    with pytest.raises(PlanError, match=r"h0 alone is 83% of the fleet's capacity.*75%"):
        plan_waves(members, 0.75)


@pytest.mark.parametrize(
    ("order", "message"),
    [
        (("a", "zz"), "names 'zz', which is not a replica"),
        (("a",), "leaves out b"),
        (("a", "a", "b"), "names a replica twice"),
        ("sideways", "unknown order 'sideways'"),
    ],
)
def test_a_wrong_order_is_refused(order: tuple[str, ...] | str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_waves(_fleet(a=1.0, b=1.0), 0.5, order)  # type: ignore[arg-type]  # a wrong order


@pytest.mark.parametrize("floor", [0.0, 1.0, -0.5, float("nan")])
def test_a_floor_outside_zero_to_one_is_refused(floor: float) -> None:
    with pytest.raises(PlanError, match="floor"):
        plan_waves(_fleet(a=1.0, b=1.0), floor)


def test_a_replica_without_capacity_is_refused() -> None:
    with pytest.raises(PlanError, match="b has no learned capacity"):
        plan_waves(_fleet(a=1.0, b=0.0), 0.5)


capacities = st.lists(
    st.floats(min_value=0.05, max_value=100.0, allow_nan=False), min_size=1, max_size=12
)
floors = st.floats(min_value=0.01, max_value=0.99)
orders = st.sampled_from(["weakest-first", "strongest-first", "shuffled"])


@given(capacities, floors, orders, st.randoms(use_true_random=False))
def test_every_replica_once_in_order_and_every_wave_keeps_the_floor(
    rates: list[float], floor: float, how: str, rng: object
) -> None:
    members = [Member(f"r{i}", c) for i, c in enumerate(rates)]
    names = [m.id for m in members]
    if how == "shuffled":
        rng.shuffle(names)  # type: ignore[attr-defined]  # hypothesis's Random
    order = tuple(names) if how == "shuffled" else how
    if max(rates) > (1 - floor) * sum(rates) * (1 + 1e-9):
        # Refused exactly when some replica alone is more than 1 - floor of the fleet.
        with pytest.raises(PlanError, match="alone is"):
            plan_waves(members, floor, order)  # type: ignore[arg-type]  # one of the orders
        return
    plan = plan_waves(members, floor, order)  # type: ignore[arg-type]  # one of the orders
    flat = [r for w in plan.waves for r in w.replicas]
    assert flat == list(plan.order)
    assert sorted(flat) == sorted(m.id for m in members)
    if how == "shuffled":
        assert plan.order == order
    else:
        key = sorted(rates, reverse=how == "strongest-first")
        by_id = {m.id: m.capacity for m in members}
        assert [by_id[r] for r in plan.order] == key
    for i, wave in enumerate(plan.waves):
        assert _remaining(plan, members, i) == pytest.approx(wave.remaining)
        assert wave.remaining >= floor - 1e-9
