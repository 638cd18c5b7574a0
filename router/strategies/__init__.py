"""Routing strategies, found by name.

Each strategy lives in its own module; this registry is the one place that lists them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from router.errors import ControlError
from router.strategies.base import CandidateScore, Explanation, Strategy
from router.strategies.least_connections import LeastConnections, WeightedLeastConnections
from router.strategies.round_robin import RoundRobin

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        LeastConnections,
        WeightedLeastConnections,
    )
}


def create_strategy(
    name: str, params: Mapping[str, Any] | None = None, rng: random.Random | None = None
) -> Strategy:
    """Build a strategy by registry name; a ControlError names what was wrong."""
    cls = STRATEGIES.get(name)
    if cls is None:
        known = ", ".join(sorted(STRATEGIES))
        raise ControlError(f"unknown strategy {name!r}; known: {known}")
    try:
        return cls(rng, **dict(params or {}))
    except (TypeError, ValueError) as exc:
        raise ControlError(f"strategy {name}: {exc}") from None


__all__ = ["STRATEGIES", "CandidateScore", "Explanation", "Strategy", "create_strategy"]
