"""The events pane: the audit trail and the alerts the console raises from what it sees."""

from __future__ import annotations

import time
from dataclasses import dataclass

from console.view.format import Cell, Tone
from router.control import Event
from router.snapshot import FleetSnapshot
from router.telemetry.status import BrokerState, TelemetryStatus


def clock_text(unix: float) -> str:
    """UTC wall time, ``14:03:07Z``: the same on every operator's screen."""
    return time.strftime("%H:%M:%SZ", time.gmtime(unix))


def event_line(e: Event) -> tuple[Cell, ...]:
    """``14:03:07Z ✔ console: r1: weight set to 2.5``; a change the router made itself is marked
    ``↺`` (a replica's state) or ``⇅`` (a tuner's change:
    ``⇅ tuner: v100-0: batch_size 256 -> 192 (engine queue 40 for 2 rounds)``)."""
    mark, tone = ("✔", Tone.OK) if e.ok else ("✖", Tone.BAD)
    if e.kind == "state":
        mark, tone = "↺", Tone.ACCENT
    elif e.kind == "tune":
        mark, tone = "⇅", Tone.ACCENT
    return (
        (clock_text(e.at), Tone.DIM),
        (f" {mark} ", tone),
        (f"{e.actor}: ", Tone.DIM),
        (e.message, Tone.NORMAL if e.ok else Tone.BAD),
    )


@dataclass(frozen=True, slots=True)
class Watch:
    """What alerts compare between two refreshes."""

    broker: str
    stale: frozenset[str]
    offline: frozenset[str]
    band: str
    queue_full: bool


def watch(snap: FleetSnapshot, status: TelemetryStatus) -> Watch:
    return Watch(
        broker=str(status.broker),
        stale=frozenset(n.node for n in status.nodes if n.online and n.stale),
        offline=frozenset(n.node for n in status.nodes if not n.online),
        band=str(snap.band),
        queue_full=snap.queue.depth >= snap.queue.capacity,
    )


def alerts(before: Watch | None, now: Watch) -> list[tuple[str, Tone]]:
    """What changed for the worse (or recovered) since the last refresh."""
    if before is None:
        return []
    out: list[tuple[str, Tone]] = []
    if now.broker != before.broker:
        bad = now.broker in (BrokerState.RECONNECTING, BrokerState.CONNECTING)
        out.append((f"broker {before.broker} → {now.broker}", Tone.BAD if bad else Tone.OK))
    for node in sorted(now.stale - before.stale):
        out.append((f"⚠ {node}: telemetry stale", Tone.WARN))
    for node in sorted(now.offline - before.offline):
        out.append((f"✖ {node}: agent offline", Tone.BAD))
    for node in sorted((before.stale | before.offline) - (now.stale | now.offline)):
        out.append((f"● {node}: telemetry fresh again", Tone.OK))
    if now.band != before.band:
        tone = Tone.BAD if now.band == "action" else Tone.WARN if now.band == "watch" else Tone.OK
        out.append((f"imbalance {before.band} → {now.band}", tone))
    if now.queue_full and not before.queue_full:
        out.append(("✖ admission queue full: new requests get 429", Tone.BAD))
    return out
