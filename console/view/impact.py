"""What a command will do, shown before it is applied.

For drain, preempt and eject: how many requests run on the replica and at which priorities,
what happens to each (finishes there, re-queued, fails because it is already streaming), and
where the replica's share of new work goes: the remaining active replicas in proportion to
their effective weights, as the weighted strategies divide it.

Preempt's counts follow ``RouterCore.preempt``: every request but the high-priority ones
stops; one that has not answered yet (no first byte) is re-queued and re-run elsewhere, one
already streaming ends with an error; the replica is left draining, then drained, until an
operator undrains it. The confirmation redraws them at each refresh, so what it says when
the operator answers is what the router then does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from console.view.format import Cell, Tone, duration, pct
from router.in_flight import InFlight
from router.snapshot import ReplicaSnapshot

SHOWN_RECIPIENTS = 4


@dataclass(frozen=True, slots=True)
class Impact:
    action: str
    replica: str
    in_flight: int
    by_priority: dict[str, int]
    outcome: tuple[str, ...]
    """What happens to the in-flight work, one line per fate."""
    share: float
    """The replica's share of new work now (its weight over the active replicas')."""
    recipients: tuple[tuple[str, float, float], ...]
    """(replica, share before, share after) for those that take over, largest first."""
    others: int
    """Further recipients not listed."""
    stale_age_s: float | None
    stale: bool
    """The replica's data is stale or its node offline: what is shown may be old."""


def impact(
    action: str,
    target: ReplicaSnapshot,
    replicas: Sequence[ReplicaSnapshot],
    running: Sequence[InFlight],
    *,
    stale: bool,
    include_high: bool = False,
) -> Impact:
    by_priority = dict(Counter(r.priority for r in running))
    return Impact(
        action=action,
        replica=target.id,
        in_flight=len(running),
        by_priority=by_priority,
        outcome=_outcome(action, running, include_high),
        share=_shares(replicas).get(target.id, 0.0),
        recipients=_recipients(action, target, replicas),
        others=max(0, _active_others(target, replicas) - SHOWN_RECIPIENTS),
        stale_age_s=target.telemetry_age_s,
        stale=stale,
    )


def _outcome(action: str, running: Sequence[InFlight], include_high: bool) -> tuple[str, ...]:
    n = len(running)
    if action in ("drain", "eject"):
        if not n:
            return ("nothing runs there: it stops taking work at once",)
        return (f"{n} in flight finish there; it takes no new work",)
    if action == "preempt":
        return _preempted(running, include_high)
    return ()


def _preempted(running: Sequence[InFlight], include_high: bool) -> tuple[str, ...]:
    victims = [r for r in running if include_high or r.priority != "high"]
    streaming = sum(1 for r in victims if r.streaming)
    kept = len(running) - len(victims)
    lines = []
    if victims:
        lines.append(f"{len(victims) - streaming} not answered yet: re-queued, re-run elsewhere")
    if streaming:
        lines.append(f"{streaming} already streaming: they end with an error")
    if kept:
        lines.append(f"{kept} high-priority keep running until done")
    if not running:
        lines.append("nothing runs there: it stops taking work at once")
    lines.append("then it stays drained: no new work until undrained")
    return tuple(lines)


def _shares(replicas: Sequence[ReplicaSnapshot]) -> dict[str, float]:
    active = [r for r in replicas if r.state == "active"]
    total = sum(r.weight for r in active)
    return {r.id: r.weight / total for r in active} if total > 0 else {}


def _active_others(target: ReplicaSnapshot, replicas: Sequence[ReplicaSnapshot]) -> int:
    return sum(1 for r in replicas if r.state == "active" and r.id != target.id)


def _recipients(
    action: str, target: ReplicaSnapshot, replicas: Sequence[ReplicaSnapshot]
) -> tuple[tuple[str, float, float], ...]:
    if action not in ("drain", "preempt", "eject") or target.state != "active":
        return ()
    before = _shares(replicas)
    after = _shares([r for r in replicas if r.id != target.id])
    gained = sorted(after, key=lambda rid: (-(after[rid] - before[rid]), rid))
    return tuple((rid, before[rid], after[rid]) for rid in gained[:SHOWN_RECIPIENTS])


def impact_lines(i: Impact) -> list[tuple[Cell, ...]]:
    """The confirmation's body, as lines of (text, tone) segments."""
    lines: list[tuple[Cell, ...]] = []
    if i.stale:
        age = duration(i.stale_age_s) if i.stale_age_s is not None else "unknown"
        lines.append(
            (
                (f"⚠ {i.replica}'s data is stale (age {age}): ", Tone.WARN),
                ("what you see may not be true now.", Tone.WARN),
            )
        )
    prio = ", ".join(f"{n} {p}" for p, n in sorted(i.by_priority.items()))
    lines.append(
        (
            ("In flight: ", Tone.DIM),
            (f"{i.in_flight}", Tone.ACCENT),
            (f" ({prio})" if prio else "", Tone.NORMAL),
        )
    )
    if i.action == "preempt" and i.in_flight:
        lines.append((("Its normal and low-priority work stops now:", Tone.DIM),))
    lines += [(("• ", Tone.DIM), (text, Tone.NORMAL)) for text in i.outcome]
    if i.recipients:
        lines.append(
            (
                ("Its share of new work, ", Tone.DIM),
                (pct(i.share), Tone.ACCENT),
                (", goes to:", Tone.DIM),
            )
        )
        for rid, before, after in i.recipients:
            lines.append(((f"  {rid}", Tone.NORMAL), (f"  {pct(before)} → {pct(after)}", Tone.OK)))
        if i.others:
            lines.append(((f"  and {i.others} more", Tone.DIM),))
    elif i.action in ("drain", "preempt", "eject") and i.share == 0.0:
        lines.append((("It takes no new work now; shares do not change.", Tone.DIM),))
    return lines
