"""Tiered: heavy requests to the strong tier, light ones anywhere.

A request is heavy when its context (prompt plus the most it may generate) reaches
``heavy_tokens``. Heavy requests go to the replicas of ``strong_tier`` (the cards with the
memory and bandwidth for long contexts), by weighted least-connections among them; when no
strong replica can take one it spills over to the other tiers rather than wait. Light requests
go to any replica by weighted least-connections; on a tie they take the other tiers, keeping
strong headroom for heavy requests. Load is requests in flight over learned capacity
(``Replica.speed``), as in weighted least-connections.

Each tier group has its own heap, so a pick is O(log n) whichever group it reads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from router.replica import Replica
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies.base import Strategy


def _weighted_load(r: Replica) -> float:
    # As weighted least-connections: requests in flight over learned capacity; counting the
    # incoming request lets capacity break ties between idle replicas.
    return (r.in_flight + 1) / r.speed


class Tiered(Strategy):
    name = "tiered"
    summary = "Heavy requests to the strong tier (spilling over when it is full); light anywhere."

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        heavy_tokens: int = 2048,
        strong_tier: str = "strong",
        **params: Any,
    ) -> None:
        super().__init__(rng, **params)
        if isinstance(heavy_tokens, bool) or not isinstance(heavy_tokens, int):
            raise ValueError(f"heavy_tokens must be a whole number of tokens, not {heavy_tokens!r}")
        if heavy_tokens < 1:
            raise ValueError(f"heavy_tokens must be at least 1, not {heavy_tokens}")
        if not isinstance(strong_tier, str) or not strong_tier.strip():
            raise ValueError(f"strong_tier must be a tier name, not {strong_tier!r}")
        self.heavy_tokens = heavy_tokens
        self.strong_tier = strong_tier
        self._strong = ScoreIndex(_weighted_load)
        self._others = ScoreIndex(_weighted_load)

    @classmethod
    def describe_params(cls) -> Mapping[str, str]:
        return {
            "heavy_tokens": "prompt + max tokens from which a request is heavy (default 2048)",
            "strong_tier": "tier name whose replicas take heavy requests (default 'strong')",
        }

    def is_heavy(self, request: Request) -> bool:
        return request.total_tokens >= self.heavy_tokens

    def is_strong(self, replica: Replica) -> bool:
        return replica.config.tier == self.strong_tier

    def rebuild(self) -> None:
        self._strong.rebuild(r for r in self.pool if self.is_strong(r))
        self._others.rebuild(r for r in self.pool if not self.is_strong(r))

    def update(self, replica: Replica) -> None:
        (self._strong if self.is_strong(replica) else self._others).update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        strong = self._strong.best(request)
        if self.is_heavy(request) and strong is not None:
            return strong
        other = self._others.best(request)
        if strong is None or other is None:
            return other if strong is None else strong
        return strong if _weighted_load(strong) < _weighted_load(other) else other

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return _weighted_load(replica)

    def note(self, request: Request, chosen: Replica | None) -> str:
        size = f"{request.total_tokens} tokens"
        if not self.is_heavy(request):
            return f"light ({size} < {self.heavy_tokens}): any tier"
        if chosen is None:
            return f"heavy ({size}): no replica can take it now"
        if self.is_strong(chosen):
            return f"heavy ({size}): {self.strong_tier} tier"
        return f"heavy ({size}): spilled over, no {self.strong_tier} replica could take it"
