"""Rolling waves: which replicas leave service together, keeping capacity above a floor.

A pure function of the replicas' learned capacities (router/capacity.py's estimates, not the
static weights: a weight says what an operator once guessed, the estimate what the card does
now), the operator's floor and an order. The order is kept exactly: waves are consecutive runs
of it, each as long as the floor allows, so a wave of four L4s can go at once where two H100s
that carry half the fleet go one by one. A replica that alone carries more than
``1 - floor`` of the fleet can never leave without breaking the floor: the plan is refused,
naming it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from router.errors import RolloutError

__all__ = ["ORDERS", "Member", "Order", "Plan", "PlanError", "Wave", "plan_waves"]

ORDERS = ("weakest-first", "strongest-first")
Order = Literal["weakest-first", "strongest-first"] | tuple[str, ...]
"""By capacity, ascending (a bad version meets little traffic first) or descending; or the
replicas' ids in the operator's own order."""
_SLACK = 1e-9
"""Relative tolerance of the floor test, so that a wave exactly at the floor is allowed."""


class PlanError(RolloutError):
    """A rollout plan that cannot be made: the floor cannot be kept, or the order is wrong."""

    title = "rollout refused"


@dataclass(frozen=True, slots=True)
class Member:
    """A replica as the planner sees it: its id and learned capacity (any unit, > 0)."""

    id: str
    capacity: float


@dataclass(frozen=True, slots=True)
class Wave:
    """Replicas taken out of service together."""

    replicas: tuple[str, ...]
    remaining: float
    """Share of the fleet's capacity left in service while this wave is out."""


@dataclass(frozen=True, slots=True)
class Plan:
    waves: tuple[Wave, ...]
    floor: float
    order: tuple[str, ...]
    """Every replica once, in the order they are updated."""

    @property
    def lowest(self) -> float:
        """The lowest share of capacity in service the plan foresees (1.0 with no wave)."""
        return min((w.remaining for w in self.waves), default=1.0)

    def to_dict(self) -> dict[str, object]:
        return {
            "floor": self.floor,
            "order": list(self.order),
            "lowest": self.lowest,
            "waves": [{"replicas": list(w.replicas), "remaining": w.remaining} for w in self.waves],
        }


def plan_waves(
    members: Sequence[Member], floor: float, order: Order = "weakest-first", staying: float = 0.0
) -> Plan:
    """The waves that update every member once, in ``order``, each keeping at least ``floor``
    of the total capacity in service; PlanError when that cannot be done. ``staying``: the
    capacity of replicas in service that the plan does not touch (a rollback of some
    replicas plans against the whole fleet)."""
    if not 0 < floor < 1:
        raise PlanError(f"the floor must be > 0 and < 1, got {floor!r}")
    bad = [m.id for m in members if not (math.isfinite(m.capacity) and m.capacity > 0)]
    if bad:
        raise PlanError(f"{bad[0]} has no learned capacity to plan with")
    ordered = _ordered(members, order)
    total = sum(m.capacity for m in ordered) + staying
    budget = (1 - floor) * total * (1 + _SLACK)
    too_big = [m for m in ordered if m.capacity > budget]
    if too_big:
        m = too_big[0]
        raise PlanError(
            f"{m.id} alone is {m.capacity / total:.0%} of the fleet's capacity: taking it out "
            f"leaves {1 - m.capacity / total:.0%}, under the floor of {floor:.0%}"
        )
    waves: list[Wave] = []
    current: list[Member] = []
    for m in ordered:
        if current and sum(c.capacity for c in current) + m.capacity > budget:
            waves.append(_wave(current, total))
            current = []
        current.append(m)
    if current:
        waves.append(_wave(current, total))
    return Plan(tuple(waves), floor, tuple(m.id for m in ordered))


def _wave(out: list[Member], total: float) -> Wave:
    return Wave(tuple(m.id for m in out), 1 - sum(m.capacity for m in out) / total)


def _ordered(members: Sequence[Member], order: Order) -> list[Member]:
    by_id = {m.id: m for m in members}
    if len(by_id) != len(members):
        raise PlanError("a replica is named twice")
    if isinstance(order, tuple):
        unknown = [name for name in order if name not in by_id]
        if unknown:
            raise PlanError(f"the order names {unknown[0]!r}, which is not a replica of the fleet")
        if len(set(order)) != len(order):
            raise PlanError("the order names a replica twice")
        missing = [m.id for m in members if m.id not in order]
        if missing:
            raise PlanError(f"the order leaves out {missing[0]}; a rollout updates every replica")
        return [by_id[name] for name in order]
    if order not in ORDERS:
        raise PlanError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")
    descending = order == "strongest-first"
    # Ties by id, so the same fleet gives the same plan.
    return sorted(members, key=lambda m: (-m.capacity if descending else m.capacity, m.id))
