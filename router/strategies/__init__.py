"""Routing strategies, found by name.

Each strategy lives in its own module; this registry is the one place that lists them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from router.errors import ControlError
from router.strategies.affinity import Affinity
from router.strategies.base import CandidateScore, Explanation, Strategy
from router.strategies.capacity_aware import CapacityAware
from router.strategies.least_connections import LeastConnections, WeightedLeastConnections
from router.strategies.least_tokens import LeastOutstandingTokens
from router.strategies.p2c_peak_ewma import P2CPeakEwma
from router.strategies.random_choice import RandomChoice, WeightedRandom
from router.strategies.round_robin import RoundRobin
from router.strategies.shortest_expected_delay import ShortestExpectedDelay
from router.strategies.tiered import Tiered
from router.strategies.weighted_round_robin import WeightedRoundRobin

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        WeightedRoundRobin,
        RandomChoice,
        WeightedRandom,
        LeastConnections,
        WeightedLeastConnections,
        LeastOutstandingTokens,
        ShortestExpectedDelay,
        P2CPeakEwma,
        CapacityAware,
        Tiered,
        Affinity,
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
