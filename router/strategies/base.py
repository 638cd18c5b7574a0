"""What every strategy is: a pick over the replicas that can take a request, and its reasons.

A strategy sees the fleet through a :class:`~router.pool.ReplicaPool`. It is told of every
change to a replica (``update``) so it can keep an index, and it is asked to ``pick`` for one
request at a time. It only ever returns a replica that ``can_take`` the request, or None when
none can (the request then waits in the queue). Time and randomness come in from outside.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from router.pool import ReplicaPool
from router.replica import Replica
from router.request import Request


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """One replica as a strategy saw it for one decision."""

    replica: str
    eligible: bool
    score: float | None
    """The strategy's score (lower wins), where the strategy has one."""
    in_flight: int
    weight: float
    latency_age_s: float | None
    """Age of the replica's latency signal (None: no sample yet)."""
    telemetry_age_s: float | None
    """Age of its GPU telemetry (None: none received)."""
    telemetry_fresh: bool | None = None
    """GPU telemetry was fresh (True), stale so router accounting stood in (False), or never
    received (None)."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a request went where it went."""

    strategy: str
    request_id: str
    chosen: str | None
    time: float
    candidates: tuple[CandidateScore, ...]
    note: str = ""
    telemetry_note: str = ""
    """Which replicas' GPU telemetry was stale, so that the router's own accounting (in
    flight over batch size) stood in for their utilization; empty when none was."""


class Strategy(ABC):
    """Base of all strategies. Subclasses set ``name``, ``summary`` and implement ``pick``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line, shown in the console's strategy picker."""
    books_kv: ClassVar[bool] = True
    """Whether a replica whose KV cache the router has booked full (router/kv_budget.py)
    has no free slot. The fixed splits turn it off: they stay the references they are."""
    telemetry_stale_after_s: float = 3.0
    """Age past which GPU telemetry is stale (the core sets 3 sample periods); explanations
    say so for each replica whose telemetry is older."""

    def __init__(self, rng: random.Random | None = None, **params: Any) -> None:
        if params:
            raise ValueError(f"{self.name} takes no parameter {sorted(params)[0]!r}")
        self.rng = rng if rng is not None else random.Random(0)
        self.pool = ReplicaPool(())

    def attach(self, pool: ReplicaPool) -> None:
        """Start working on a pool; builds whatever index the strategy keeps."""
        self.pool = pool
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute indexes from the whole pool."""

    def update(self, replica: Replica) -> None:
        """A replica's load, weight, batch size or state changed."""

    @abstractmethod
    def pick(self, request: Request, now: float) -> Replica | None:
        """A replica that can take the request, or None if none can now."""

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        """The score ``pick`` minimises, for explanations; None where there is none."""
        return None

    def note(self, request: Request, chosen: Replica | None) -> str:
        """A short remark on the decision (which tier, which ring position...)."""
        return ""

    def explain(self, request: Request, now: float, chosen: Replica | None) -> Explanation:
        """The candidates as this strategy scores them now. O(n): not on the hot path."""
        rows = tuple(
            CandidateScore(
                replica=r.id,
                eligible=r.can_take(request) or r is chosen,
                score=self.score(r, request, now),
                in_flight=r.in_flight,
                weight=r.weight,
                latency_age_s=r.latency.age(now),
                telemetry_age_s=None if r.telemetry is None else now - r.telemetry.received_at,
                telemetry_fresh=None
                if r.telemetry is None
                else r.utilization(now, self.telemetry_stale_after_s)[1],
            )
            for r in self.pool
        )
        return Explanation(
            strategy=self.name,
            request_id=request.id,
            chosen=None if chosen is None else chosen.id,
            time=now,
            candidates=rows,
            note=self.note(request, chosen),
            telemetry_note=_stale_note(rows),
        )

    @classmethod
    def describe_params(cls) -> Mapping[str, str]:
        """Parameter name -> one-line description (empty when it takes none)."""
        return {}


def _stale_note(rows: tuple[CandidateScore, ...]) -> str:
    stale = [row.replica for row in rows if row.telemetry_fresh is False]
    if not stale:
        return ""
    return f"stale GPU telemetry on {', '.join(stale)}: router accounting used instead"
