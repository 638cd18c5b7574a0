"""A traffic split: a share of one model's requests sent to its new version, the rest to the old.

The canary and the blue-green switch are both a split (router/rollout/canary.py,
router/rollout/blue_green.py). It is pure: the core asks it, before each pick of a request
for the split's model, which version the request goes to (router/core.py, ``_find``), and
``Replica.fits`` then admits only replicas of that version, so every strategy routes within
the side as it always does.

Each request carries one draw in [0, 1), made when it is first picked for: it goes to the new
version when the draw is under the share. If the side it drew has no replica in service, the
other takes it (no request waits for a version nobody serves); a retry after a failed attempt
goes to the side it did not fail on, when that side has one.

A share is a share of the requests, and a canary's replicas are a few of the fleet's: past
their share of its capacity they would queue the new version's requests without end
(examples/scenarios/canary-weak-card.yaml, simulated, before this: 86 requests refused, the
router's queue full, and p99 TTFT 58.8 s; now none and 1.33 s). So a
request drawn for the new version goes to the old one while no replica of the new version
has a free slot and one of the old version has: the new version gets its share or all it
can take, whichever is less, and never more than its share (no request drawn for the old
version goes to the new one for room).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.replica import Replica, ReplicaState
from router.request import Request

__all__ = ["TrafficSplit"]


@dataclass(frozen=True, slots=True)
class TrafficSplit:
    """``share`` of the requests for ``model`` go to replicas of version ``new``, the rest to
    those of version ``old``; a replica of a third version gets none of them meanwhile."""

    model: str
    """The stable name clients ask for, served by both versions."""
    old: str
    new: str
    share: float
    """0..1: the new version's share."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"a split's share must be within 0..1, got {self.share}")
        if self.old == self.new:
            raise ValueError(f"a split needs two versions, got {self.old!r} twice")

    def version_for(self, request: Request, replicas: Iterable[Replica]) -> str | None:
        """The version ``request`` must go to; None when the split does not concern it (it
        names another model, or its exact version). O(replicas): only while a split is set."""
        if request.model != self.model or request.split_coin is None:
            return None
        want = self.new if request.split_coin < self.share else self.old
        other = self.old if want == self.new else self.new
        if request.split_failed == want:
            want, other = other, want
        live, room = self._sides(replicas)
        if want not in live and other in live:
            return other
        full = want == self.new and want not in room and self.old in room
        if full and request.split_failed != self.old:
            return self.old  # the new version full: its overflow, never the reverse
        return want

    def in_service(self, replicas: Iterable[Replica]) -> set[str]:
        """The split's versions that have a replica in service for its model."""
        return self._sides(replicas)[0]

    def _sides(self, replicas: Iterable[Replica]) -> tuple[set[str], set[str]]:
        """The split's versions with a replica in service for its model, and those with one
        that has a free slot."""
        live: set[str] = set()
        room: set[str] = set()
        for r in replicas:
            if (
                r.state is ReplicaState.ACTIVE
                and r.version in (self.old, self.new)
                and r.serves(self.model)
            ):
                live.add(r.version)
                if r.has_slot:
                    room.add(r.version)
        return live, room

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "old": self.old, "new": self.new, "share": self.share}
