"""Peer load: the other routers' requests on each replica, from what they last reported.

Several routers in front of one fleet (machines behind an L4 balancer, or worker processes on
one machine) each know only the requests they sent. A replica's load as one router sees it is
its own accounting plus its peers' requests there, estimated from each peer's last report:

    peer j now  ~  reported_j  +  (ours now - ours when j's report came)

that is, since its report each peer is taken to have done on that replica what we did (the
balancer splits arrivals evenly and every router runs the same strategy). Summed over the
``P`` peers counted, per replica:

    in flight  =  ours + max(0, P * ours + sum_j (reported_j - ours_at_j))

and the same for outstanding cost. Why not the plain sum ``ours + sum_j reported_j``: the
reports are up to a stats period old, and every router reads the same old figures; each then
sends its share to the replica that looked least loaded when they were taken, all of them at
once, and that replica gets N times the gap (the herd effect of stale load information). With
our own moves counted P + 1 times, each router fills a gap at its share of the pace, and each
report corrects the offset. With fresh reports both are the same.

Every router publishes only its own figures (:func:`own_report`), never what it heard, so a
request is counted once whichever router holds it; a router's own report coming back (the
broker echoes it to every subscriber, the sender included) is ignored. Each peer's figures
replace that peer's previous ones whole and carry their age: a peer not heard from for
``stale_after_s`` (three stats periods by default, as node telemetry) stops counting, so a
router that vanished holds no phantom load for longer than that.

:class:`PeerLoad` keeps the per-replica sums in ``Replica.peers``, ``peer_offset`` and
``peer_cost_offset``; ``Replica.in_flight`` and ``Replica.outstanding_cost`` (router/replica.py)
add them up: the one place every load-aware strategy reads a replica's load. The caller (the
router core) tells the pool which replicas changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.replica import Replica

STATS_PERIOD_S = 1.0
"""How often a router publishes its ``routers/<id>/stats`` (and with it its load)."""
STALE_PERIODS = 3
"""Periods without a report after which a peer's figures stop counting."""


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One router's own work on one replica."""

    replica: str
    in_flight: int
    cost: float
    """Outstanding estimated cost (router/request.py's units)."""


@dataclass(frozen=True, slots=True)
class PeerReport:
    """One router's own load on every replica it has work on, at one instant."""

    router: str
    seq: int
    """Grows with each report of that router: an older report arriving late is ignored."""
    loads: tuple[ReplicaLoad, ...]


Delta = dict[int, tuple[int, float]]
"""Replica index -> (reported in flight - ours then, reported cost - ours then), non-zero."""


@dataclass(slots=True)
class _Heard:
    seq: int
    at: float
    delta: Delta


def own_report(router: str, seq: int, replicas: Sequence[Replica]) -> PeerReport:
    """What this router publishes: its own requests only, never its peers' figures (which
    would come back to them and be counted twice)."""
    loads = tuple(
        ReplicaLoad(r.id, r.own_in_flight, r.own_cost) for r in replicas if r.own_in_flight
    )
    return PeerReport(router, seq, loads)


class PeerLoad:
    """The other routers' latest figures, summed per replica (see the module docstring)."""

    def __init__(
        self,
        router: str,
        replicas: Sequence[Replica],
        *,
        stale_after_s: float = STALE_PERIODS * STATS_PERIOD_S,
    ) -> None:
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s}")
        self.router = router
        self.stale_after_s = stale_after_s
        self._replicas = list(replicas)
        self._by_id = {r.id: r for r in self._replicas}
        self._peers: dict[str, _Heard] = {}
        self.siblings: frozenset[str] = frozenset()
        """Routers whose reports are not counted: the other workers of this router's own
        service, whose requests the load table counts exactly (router/workers)."""

    @property
    def peers(self) -> dict[str, float]:
        """Peers counted now, by router id: when each was last heard from."""
        return {name: h.at for name, h in self._peers.items()}

    @property
    def count(self) -> int:
        """Peers counted now."""
        return len(self._peers)

    def age(self, router: str, now: float) -> float | None:
        """Seconds since that peer's figures arrived (None: not counted)."""
        heard = self._peers.get(router)
        return None if heard is None else now - heard.at

    def heard(self, report: PeerReport, now: float) -> list[Replica]:
        """Take a peer's report; the replicas whose load changed."""
        if report.router == self.router or report.router in self.siblings:
            return []  # ours echoed back, or a sibling worker's: already counted
        old = self._peers.get(report.router)
        if old is not None and report.seq <= old.seq:
            return []  # late or repeated: a newer one already counts
        reported: dict[int, tuple[int, float]] = {}
        for load in report.loads:
            r = self._by_id.get(load.replica)
            if r is not None and load.in_flight > 0:
                reported[r.index] = (load.in_flight, max(load.cost, 0.0))
        delta: Delta = {}
        for r in self._replicas:
            n, cost = reported.get(r.index, (0, 0.0))
            if n or r.own_in_flight:
                delta[r.index] = (n - r.own_in_flight, cost - r.own_cost)
        self._peers[report.router] = _Heard(report.seq, now, delta)
        if old is None:
            return self._apply({}, delta, joined=1)
        return self._apply(old.delta, delta, joined=0)

    def any_stale(self, now: float) -> bool:
        """Whether some peer has gone ``stale_after_s`` without a report (``expire`` drops it)."""
        return any(now - h.at >= self.stale_after_s for h in self._peers.values())

    def expire(self, now: float) -> list[Replica]:
        """Drop the peers not heard from for ``stale_after_s``; the replicas that changed."""
        changed: dict[int, Replica] = {}
        for name in [n for n, h in self._peers.items() if now - h.at >= self.stale_after_s]:
            for r in self._apply(self._peers.pop(name).delta, {}, joined=-1):
                changed[r.index] = r
        return list(changed.values())

    def _apply(self, old: Delta, new: Delta, joined: int) -> list[Replica]:
        """Swap one peer's old figures for its new ones; ``joined``: +1 when the peer starts
        counting, -1 when it stops (every replica then changes: each estimate scales with
        the number of peers)."""
        changed: list[Replica] = []
        touched = range(len(self._replicas)) if joined else old.keys() | new.keys()
        for i in touched:
            was, now_ = old.get(i, (0, 0.0)), new.get(i, (0, 0.0))
            if was == now_ and not joined:
                continue
            r = self._replicas[i]
            r.peers += joined
            r.peer_offset += now_[0] - was[0]
            r.peer_cost_offset += now_[1] - was[1]
            if not r.peers:  # back to exactly zero: float drift cannot pile up
                r.peer_offset, r.peer_cost_offset = 0, 0.0
            changed.append(r)
        return changed


MAX_LOADS = 4096
"""Replicas a published load may name: junk cannot make one report cost without bound."""


def load_body(report: PeerReport) -> dict[str, object]:
    """A report as the ``load`` member of a ``routers/<id>/stats`` message."""
    rows = [[x.replica, x.in_flight, round(x.cost, 3)] for x in report.loads]
    return {"seq": report.seq, "replicas": rows}


def read_load(router: str, body: object) -> PeerReport | None:
    """The report in a stats message's ``load`` member; None when it has none or it is not
    sound (a malformed figure is never counted)."""
    if not isinstance(body, dict):
        return None
    seq, rows = body.get("seq"), body.get("replicas")
    if type(seq) is not int or not isinstance(rows, list) or len(rows) > MAX_LOADS:
        return None
    loads: list[ReplicaLoad] = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            return None
        replica, n, cost = row
        if not isinstance(replica, str) or type(n) is not int or n < 0:
            return None
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not cost >= 0:
            return None
        loads.append(ReplicaLoad(replica, n, float(cost)))
    return PeerReport(router, seq, tuple(loads))
