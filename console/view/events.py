"""The events pane: the audit trail and the alerts the console raises from what it sees."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from console.view.fleet import agent_offline
from console.view.format import Cell, Tone
from console.view.service import Service
from router.control import Event
from router.snapshot import FleetSnapshot
from router.telemetry.status import (
    NO_ENGINE_METRICS,
    BrokerState,
    EngineMetricsStatus,
    TelemetryStatus,
)


def clock_text(unix: float) -> str:
    """UTC wall time, ``14:03:07Z``: the same on every operator's screen."""
    return time.strftime("%H:%M:%SZ", time.gmtime(unix))


def event_line(e: Event) -> tuple[Cell, ...]:
    """``14:03:07Z ✔ console: r1: weight set to 2.5``; a change the router made itself is marked
    ``↺`` (a replica's state, with its reason), ``⇅`` (a tuner's change:
    ``⇅ tuner: v100-0: batch_size 256 -> 192 (engine queue 40 for 2 rounds)``) or ``⚠`` (panic
    mode beginning, in the bad tone, or ending); a model rollout's step is marked ``⟳``
    (``⟳ rollout: v0: HTTP 202 in 0.0 s``), or ``✖`` where it failed."""
    mark, tone = ("✔", Tone.OK) if e.ok else ("✖", Tone.BAD)
    text_tone = Tone.NORMAL if e.ok else Tone.BAD
    if e.kind == "state":
        mark, tone = "↺", Tone.ACCENT
    elif e.kind == "tune":
        mark, tone = "⇅", Tone.ACCENT
    elif e.kind == "rollout" and e.ok:
        mark, tone = "⟳", Tone.ACCENT
    elif e.kind == "panic":
        engaged = bool(e.args.get("engaged"))
        mark, tone = "⚠", Tone.BAD if engaged else Tone.OK
        text_tone = Tone.BAD if engaged else Tone.OK
    return (
        (clock_text(e.at), Tone.DIM),
        (f" {mark} ", tone),
        (f"{e.actor}: ", Tone.DIM),
        (e.message, text_tone),
    )


BAND_HOLD_S = 10.0
"""How long the imbalance band must hold before its change is an alert. A fleet near a band's
edge crosses it back and forth every few seconds; an alert each time filled the events pane
(and the imbalance itself is over the last 10 s)."""

_VERDICT = {"excellent": "ok", "good": "ok"}
"""Excellent and good are both fine (the header's ✔): a move between them is no alert."""


@dataclass(frozen=True, slots=True)
class Watch:
    """What alerts compare between two refreshes."""

    broker: str
    stale: frozenset[str]
    offline: frozenset[str]
    band: str
    """The imbalance band as alerts know it: a new band counts once it has held
    (:func:`settle`)."""
    queue_full: bool
    none_up: bool = False
    """No replica can take a request (console/view/service.py)."""
    at: float = 0.0
    """The snapshot's time (the router's clock)."""
    seen: str = ""
    """The band in this snapshot, held or not."""
    since: float = 0.0
    """When ``seen`` was first seen in a row."""
    engines: EngineMetricsStatus = NO_ENGINE_METRICS
    """What the router could not take from the engines' /metrics."""


def watch(
    snap: FleetSnapshot,
    status: TelemetryStatus,
    service: Service | None = None,
    before: Watch | None = None,
    engines: EngineMetricsStatus = NO_ENGINE_METRICS,
) -> Watch:
    now = Watch(
        broker=str(status.broker),
        stale=frozenset(n.node for n in status.nodes if n.online and n.stale),
        offline=frozenset(n.node for n in status.nodes if agent_offline(n)),
        band=str(snap.band),
        queue_full=snap.queue.depth >= snap.queue.capacity,
        none_up=service is not None and service.none_up,
        at=snap.time,
        engines=engines,
    )
    return settle(before, now)


def settle(before: Watch | None, now: Watch) -> Watch:
    """``now`` with its band debounced: the band ``now`` reads becomes the band alerts know
    once it has been read for BAND_HOLD_S in a row."""
    raw = now.band
    if before is None:
        return replace(now, seen=raw, since=now.at)
    since = before.since if before.seen == raw else now.at
    held = now.at - since >= BAND_HOLD_S
    return replace(now, band=raw if held else before.band, seen=raw, since=since)


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
    if _VERDICT.get(now.band, now.band) != _VERDICT.get(before.band, before.band):
        tone = Tone.BAD if now.band == "action" else Tone.WARN if now.band == "watch" else Tone.OK
        out.append((f"imbalance {before.band} → {now.band}", tone))
    if now.queue_full and not before.queue_full:
        out.append(("✖ admission queue full: new requests get 429", Tone.BAD))
    if now.none_up != before.none_up:
        out.append(
            ("✖ no replica up: requests fail", Tone.BAD)
            if now.none_up
            else ("● a replica is up again", Tone.OK)
        )
    return out + _engine_alerts(before.engines, now.engines)


def _engine_alerts(before: EngineMetricsStatus, now: EngineMetricsStatus) -> list[tuple[str, Tone]]:
    """A replica's engine /metrics becoming unreadable (with why) and read again; starting
    to carry values refused as nonsense (with the reason) and sane again. Once each way, not
    at every poll of an exporter that stays broken."""
    out: list[tuple[str, Tone]] = []
    for replica in sorted(now.errors.keys() - before.errors.keys()):
        out.append((f"✖ {replica}: engine /metrics unreadable: {now.errors[replica]}", Tone.BAD))
    for replica in sorted(before.errors.keys() - now.errors.keys()):
        out.append((f"● {replica}: engine /metrics read again", Tone.OK))
    refusing, refused = set(now.refusing), set(before.refusing)
    for replica in sorted(refusing - refused):
        why = now.last_rejection.get(replica, "")
        out.append(
            (f"⚠ {replica}: engine /metrics value refused, last good kept: {why}", Tone.WARN)
        )
    for replica in sorted(refused - refusing):
        out.append((f"● {replica}: engine /metrics values sane again", Tone.OK))
    return out
