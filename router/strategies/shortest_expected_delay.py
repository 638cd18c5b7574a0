"""Shortest expected delay: the replica that would finish the request soonest.

The expected delay on replica ``r`` is ``(outstanding_cost(r) + request.cost) / speed(r)``:
the work queued there, this request included, over the replica's learned capacity (cost
units per second, router/capacity.py): the seconds it would take to finish. Counting the
incoming request is what sends a long request to a strong card even when a weak one has a
little less work queued.

A replica with no free slot can still be the better place: after one of its requests ends
(in about ``backlog / in_flight``, later for a request with others ahead of it in the queue)
it finishes this one sooner than a slow card's free slot would, whose engine may only queue
it behind a full KV cache. Then the pick is None and the request waits in the router's queue
for that slot (late binding); this check reads the replicas without a free slot, O(full).
Each second of that wait counts ``wait_weight`` seconds (5 by default): the wait comes before
the request's first token, where a user sees it and where the TTFT objective bounds it, while
a slower card's extra seconds are spread over its decoding. Counted once, as completion time
alone would, the fast card's queue grew through every burst: on the wide untuned fleet
(examples/fleets/untuned-wide.yaml, simulator, seed 1) 621 of the 624 requests over 2 s of
TTFT at 0.966 of capacity waited for the H100, p99 3.55 s in the router's queue
(bench/bench_ttft_split.py).

Because the score depends on the request, no single heap key orders it. The pick is an exact
branch and bound instead. Replicas are grouped by GPU model, and each group keeps a heap keyed
by ``backlog = outstanding_cost / speed``. A replica's exact score is
``backlog + cost / speed``; no replica further down a group's heap can score below
``backlog_next + cost / max_speed_of_group``, so a group is read in ascending order only until
that bound reaches the best exact score found so far. Floating-point addition and division are
monotone, so the bound holds for the computed scores too: the result is the exact minimum.

Why groups: SED balances the fleet so that backlogs converge, and one global heap would then
hold many replicas of different speeds inside the bound (at 512 replicas it read dozens per
pick). Within a GPU model speeds are equal or close. When they are all equal the heap's
first entry is the group's exact best; when not (measured apart, or an operator's pin) the
group is read in order until the bound stops it. Either way a pick costs about
O(G log n) for G GPU models, a handful in any fleet.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import closing
from typing import Any

from router.replica import Replica, ReplicaState
from router.request import Request
from router.strategies._index import ScoreIndex
from router.strategies.base import Strategy


def _number(name: str, value: object, what: str, ok: Callable[[float], bool]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if not (math.isfinite(value) and ok(value)):
        raise ValueError(f"{name} must be {what}, not {value!r}")
    return float(value)


def _backlog(r: Replica) -> float:
    return r.outstanding_cost / r.speed


def _seen(r: Replica) -> int:
    """Requests on ``r`` whose end this router sees when it happens: its own and its sibling
    workers'. A slot another router's request frees shows only at that router's next report
    (router/peer_load.py), so it is not a slot this router's queue can count on."""
    return r.in_flight - r.peer_in_flight


def _better(
    best: Replica | None, best_score: float, r: Replica, cost: float
) -> tuple[Replica | None, float]:
    score = _backlog(r) + cost / r.speed
    return (r, score) if score < best_score else (best, best_score)


class _Group:
    """The replicas of one GPU model: a heap by backlog, their largest speed, whether they
    all run at the same speed (then the heap's first entry is the group's exact best), and
    those in service without a free slot."""

    __slots__ = ("_count", "_speed", "full", "heaviest", "index", "uniform")

    def __init__(self, members: list[Replica]) -> None:
        self.index = ScoreIndex(_backlog)
        self.index.rebuild(members)
        self._speed = {r.index: r.speed for r in members}
        self._count = Counter(self._speed.values())
        self.full: dict[int, Replica] = {}
        for r in members:
            self._note_full(r)
        self._refresh()

    def update(self, replica: Replica) -> None:
        old = self._speed[replica.index]
        if old != replica.speed:
            self._speed[replica.index] = replica.speed
            self._count[old] -= 1
            if not self._count[old]:
                del self._count[old]
            self._count[replica.speed] += 1
            self._refresh()
        self.index.update(replica)
        self._note_full(replica)

    def _note_full(self, replica: Replica) -> None:
        if replica.state is ReplicaState.ACTIVE and not replica.has_slot:
            self.full[replica.index] = replica
        else:
            self.full.pop(replica.index, None)

    def _refresh(self) -> None:
        self.heaviest = max(self._count)
        self.uniform = len(self._count) == 1


class ShortestExpectedDelay(Strategy):
    name = "shortest-expected-delay"
    summary = "Least (queued work + this request) / learned capacity: finishes soonest."

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        wait_weight: float = 5.0,
        wait_limit_s: float = 0.5,
        **params: Any,
    ) -> None:
        super().__init__(rng, **params)
        self.wait_weight = _number("wait_weight", wait_weight, "at least 1", lambda x: x >= 1)
        self.wait_limit_s = _number("wait_limit_s", wait_limit_s, "positive", lambda x: x > 0)
        self._groups: list[_Group] = []
        self._group_of: list[_Group] = []

    @classmethod
    def describe_params(cls) -> Mapping[str, str]:
        return {
            "wait_weight": "seconds of completion time one second of waiting in the router's "
            "queue for a full replica counts for, against a free slot elsewhere (default 5; "
            "1 weighs completion time alone)",
            "wait_limit_s": "longest expected wait for a full replica's slot worth taking; a "
            "longer one is spent before the first token (default 0.5)",
        }

    def rebuild(self) -> None:
        members: dict[str, list[Replica]] = {}
        for r in self.pool:
            members.setdefault(r.config.gpu_model, []).append(r)
        groups = {model: _Group(rs) for model, rs in members.items()}
        # Heaviest models first: they usually hold the best score, which prunes the rest.
        self._groups = sorted(groups.values(), key=lambda g: -g.heaviest)
        self._group_of = [groups[r.config.gpu_model] for r in self.pool]

    def update(self, replica: Replica) -> None:
        self._group_of[replica.index].update(replica)

    def pick(self, request: Request, now: float) -> Replica | None:
        cost = request.cost
        best: Replica | None = None
        best_score = math.inf
        for group in self._groups:
            first = group.index.best(request)
            if first is None:
                continue
            floor = cost / group.heaviest
            if _backlog(first) + floor >= best_score:
                continue  # nothing in this group can beat the best so far
            if group.uniform:
                best, best_score = _better(best, best_score, first, cost)
                continue
            with closing(group.index.ascending(request)) as ordered:
                for r in ordered:
                    if _backlog(r) + floor >= best_score:
                        break
                    best, best_score = _better(best, best_score, r, cost)
        if best is not None and self._worth_waiting(request, best_score):
            return None
        return best

    def _worth_waiting(self, request: Request, best_score: float) -> bool:
        """Whether a replica with no free slot would still finish the request sooner than the
        best one with a slot, after waiting for a slot. Then the request waits in the router's
        queue, and takes that replica's next free slot: a fast card whose batch is full beats a
        slow card's free slot, whose engine would only queue it behind a full KV cache.

        The wait is the request's turn: the full replicas free slots at about
        ``in_flight / backlog`` each per second, counting only the requests whose end this
        router sees at once (``_seen``: behind several routers, a peer's freed slot shows at
        its next report, and each router counting every slot queued N times the requests
        the slots could take), and the requests ahead of it in the queue take the first
        ones. Counting only the first slot to free would keep a whole queue
        waiting for one card through a burst while others had room. It weighs
        ``wait_weight`` times a second of service (the module docstring says why)."""
        cost = request.cost
        full = [
            r
            for group in self._groups
            for r in group.full.values()
            if r.fits(request) and r.index not in request.avoid
        ]
        freeing = sum(_seen(r) / _backlog(r) for r in full if r.outstanding_cost > 0)
        turn = (request.waiting_ahead + 1) / freeing if freeing > 0 else math.inf
        for r in full:
            wait = max(_backlog(r) / max(_seen(r), 1), turn)
            if wait > self.wait_limit_s:
                continue
            if _backlog(r) + self.wait_weight * wait + cost / r.speed < best_score:
                return True
        return False

    def score(self, replica: Replica, request: Request, now: float) -> float | None:
        return _backlog(replica) + request.cost / replica.speed

    def note(self, request: Request, chosen: Replica | None) -> str:
        return f"score = (outstanding cost + {request.cost:g}) / learned capacity (s)"
