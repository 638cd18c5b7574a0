"""The dashboard header: the fleet in three lines, every state in words as well as colour."""

from __future__ import annotations

from dataclasses import dataclass

from console.view.format import Cell, Tone, duration, rate
from router.imbalance import Band
from router.snapshot import FleetSnapshot
from router.telemetry.status import BrokerState, TelemetryStatus

BAND_LOOK: dict[str, tuple[str, Tone]] = {
    Band.EXCELLENT: ("✔", Tone.OK),
    Band.GOOD: ("✔", Tone.OK),
    Band.WATCH: ("▲", Tone.WARN),
    Band.ACTION: ("✖", Tone.BAD),
}
BROKER_LOOK: dict[str, tuple[str, Tone]] = {
    BrokerState.DISABLED: ("○ off", Tone.DIM),
    BrokerState.CONNECTING: ("◌ connecting", Tone.WARN),
    BrokerState.CONNECTED: ("● connected", Tone.OK),
    BrokerState.RECONNECTING: ("✖ reconnecting", Tone.BAD),
}


@dataclass(frozen=True, slots=True)
class Modes:
    """How the console itself is running."""

    read_only: bool = False
    paused: bool = False
    refresh_s: float = 1.0


@dataclass(frozen=True, slots=True)
class Freshness:
    """The telemetry feed, counted over nodes."""

    nodes: int
    fresh: int
    stale: int
    offline: int
    oldest_age_s: float | None
    dropped: int
    lost: int


def freshness(status: TelemetryStatus) -> Freshness:
    offline = sum(1 for n in status.nodes if not n.online)
    stale = sum(1 for n in status.nodes if n.online and n.stale)
    ages = [n.age_s for n in status.nodes if n.age_s is not None]
    return Freshness(
        nodes=len(status.nodes),
        fresh=len(status.nodes) - offline - stale,
        stale=stale,
        offline=offline,
        oldest_age_s=max(ages) if ages else None,
        dropped=status.dropped,
        lost=sum(n.lost_samples for n in status.nodes),
    )


SEP: Cell = ("  │ ", Tone.DIM)


def header_lines(
    snap: FleetSnapshot, status: TelemetryStatus, modes: Modes
) -> tuple[tuple[Cell, ...], ...]:
    """Three lines of (text, tone) segments."""
    q = snap.queue
    prio = ", ".join(f"{name} {n}" for name, n in q.by_priority.items() if n)
    symbol, band_tone = BAND_LOOK[snap.band]
    line1: tuple[Cell, ...] = (
        (snap.cluster, Tone.ACCENT),
        SEP,
        ("strategy ", Tone.DIM),
        (snap.strategy, Tone.ACCENT),
        SEP,
        ("in ", Tone.DIM),
        (f"{rate(snap.arrivals_rps)}/s", Tone.NORMAL),
        (" out ", Tone.DIM),
        (f"{rate(snap.throughput_rps)}/s", Tone.NORMAL),
    )
    queue_tone = Tone.WARN if q.depth >= q.capacity * 0.8 else Tone.NORMAL
    line2: tuple[Cell, ...] = (
        ("queue ", Tone.DIM),
        (f"{q.depth}/{q.capacity}", queue_tone),
        (f" ({prio})" if prio else "", Tone.NORMAL),
        SEP,
        ("running ", Tone.DIM),
        (str(snap.in_flight), Tone.NORMAL),
        SEP,
        ("imbalance ", Tone.DIM),
        (f"{snap.imbalance_factor:.2f} {symbol} {snap.band}", band_tone),
    )
    return (line1, line2, _line3(status, modes))


def _line3(status: TelemetryStatus, modes: Modes) -> tuple[Cell, ...]:
    broker_text, broker_tone = BROKER_LOOK.get(status.broker, (str(status.broker), Tone.WARN))
    cells: list[Cell] = [("broker ", Tone.DIM), (broker_text, broker_tone), SEP]
    if status.broker == BrokerState.DISABLED:
        cells.append(("telemetry off: utilization is the router's estimate (~)", Tone.DIM))
    else:
        f = freshness(status)
        cells += [
            ("telemetry ", Tone.DIM),
            (f"{f.fresh}/{f.nodes} fresh", Tone.OK if f.fresh == f.nodes else Tone.NORMAL),
        ]
        if f.stale:
            cells.append((f" ⚠ {f.stale} stale", Tone.WARN))
        if f.offline:
            cells.append((f" ✖ {f.offline} offline", Tone.BAD))
        cells.append((f" oldest {duration(f.oldest_age_s)}", Tone.NORMAL))
        drops = f.dropped + f.lost
        cells.append((f" dropped {f.dropped} lost {f.lost}", Tone.WARN if drops else Tone.DIM))
    cells.append(SEP)
    if modes.read_only:
        cells.append(("READ-ONLY ", Tone.WARN))
    if modes.paused:
        cells.append(("‖ paused", Tone.WARN))
    else:
        cells.append((f"↻ {modes.refresh_s:g}s", Tone.DIM))
    return tuple(cells)
