"""The dashboard header: the fleet in three lines, every state in words as well as colour."""

from __future__ import annotations

from dataclasses import dataclass

from console.view.format import Cell, Tone, duration, rate
from console.view.service import Service, down_text
from router.imbalance import Band
from router.snapshot import FleetSnapshot
from router.telemetry.status import (
    NO_ENGINE_METRICS,
    BrokerState,
    EngineMetricsStatus,
    TelemetryStatus,
)

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
    link: str | None = None
    """Why the attached router does not answer (``✖ disconnected ...``); None: it does."""


@dataclass(frozen=True, slots=True)
class Freshness:
    """The telemetry feed, counted over nodes."""

    nodes: int
    fresh: int
    stale: int
    offline: int
    silent: int
    """Nodes whose agent was never heard from."""
    oldest_age_s: float | None
    dropped: int
    lost: int


def freshness(status: TelemetryStatus) -> Freshness:
    silent = sum(1 for n in status.nodes if n.session is None)
    offline = sum(1 for n in status.nodes if not n.online and n.session is not None)
    stale = sum(1 for n in status.nodes if n.online and n.stale)
    ages = [n.age_s for n in status.nodes if n.age_s is not None]
    return Freshness(
        nodes=len(status.nodes),
        fresh=len(status.nodes) - offline - stale - silent,
        stale=stale,
        offline=offline,
        silent=silent,
        oldest_age_s=max(ages) if ages else None,
        dropped=status.dropped,
        lost=sum(n.lost_samples for n in status.nodes),
    )


SEP: Cell = (" │ ", Tone.DIM)


def header_lines(
    snap: FleetSnapshot,
    status: TelemetryStatus,
    modes: Modes,
    service: Service | None = None,
    engines: EngineMetricsStatus = NO_ENGINE_METRICS,
) -> tuple[tuple[Cell, ...], ...]:
    """Three lines of (text, tone) segments; ``service`` as the fleet table's rows read,
    ``engines`` what the router could not take from the engines' own /metrics."""
    q = snap.queue
    prio = ", ".join(f"{name} {n}" for name, n in q.by_priority.items() if n)
    line1: tuple[Cell, ...] = (
        # First: what follows is the router's last word, and at 80 columns the end is cut.
        *(((modes.link, Tone.BAD), SEP) if modes.link else ()),
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
        *_panic(snap),
        ("queue ", Tone.DIM),
        (f"{q.depth}/{q.capacity}", queue_tone),
        (f" ({prio})" if prio else "", Tone.NORMAL),
        SEP,
        ("running ", Tone.DIM),
        (str(snap.in_flight), Tone.NORMAL),
        SEP,
        ("imbalance ", Tone.DIM),
        _imbalance(snap, service),
    )
    return (line1, line2, _line3(status, modes, engines))


def _panic(snap: FleetSnapshot) -> tuple[Cell, ...]:
    # First on its line: at 80 columns the end of a header line is cut.
    if snap.panic is None:
        return ()
    return (("✖ PANIC: routing to every replica", Tone.BAD), SEP)


def _imbalance(snap: FleetSnapshot, service: Service | None) -> Cell:
    if service is not None and service.none_up:
        # With nothing up the factor is 1.0 by definition: "excellent" would be a lie.
        return (f"— ✖ no replica up: {down_text(service)}", Tone.BAD)
    symbol, tone = BAND_LOOK[snap.band]
    return (f"{snap.imbalance_factor:.2f} {symbol} {snap.band}", tone)


def _line3(status: TelemetryStatus, modes: Modes, engines: EngineMetricsStatus) -> tuple[Cell, ...]:
    # The console's own modes come first: at 80 columns the end of this line is cut, and
    # Space, + and - must show their effect. A fleet of real engines often runs without an
    # MQTT feed, their /metrics its only telemetry: its troubles come before the broker's.
    cells: list[Cell] = [*_modes(modes), SEP, *_engines(engines)]
    broker_text, broker_tone = BROKER_LOOK.get(status.broker, (str(status.broker), Tone.WARN))
    cells += [("broker ", Tone.DIM), (broker_text, broker_tone), SEP]
    if status.broker == BrokerState.DISABLED:
        cells.append(("telemetry off: utilization is the router's estimate (~)", Tone.DIM))
        return tuple(cells)
    f = freshness(status)
    cells += [
        ("telemetry ", Tone.DIM),
        (f"{f.fresh}/{f.nodes} fresh", Tone.OK if f.fresh == f.nodes else Tone.NORMAL),
    ]
    if f.stale:
        cells.append((f" ⚠ {f.stale} stale", Tone.WARN))
    if f.offline:
        cells.append((f" ✖ {f.offline} offline", Tone.BAD))
    if f.silent:
        cells.append((f" ◌ {f.silent} no agent", Tone.WARN))
    cells.append((f" oldest {duration(f.oldest_age_s)}", Tone.NORMAL))
    if f.dropped or f.lost:
        cells.append((f" dropped {f.dropped} lost {f.lost}", Tone.WARN))
    return tuple(cells)


def _engines(engines: EngineMetricsStatus) -> list[Cell]:
    """``✖ engine /metrics unreadable: vllm-1`` (or how many), ``⚠ engine /metrics refused
    values: vllm-0`` for a readable page whose latest reading carried nonsense; nothing when
    all is well (a refusal long past is in ``gpurouter ctl status``'s count)."""
    cells: list[Cell] = []
    unreadable = sorted(engines.errors)
    refused = [r for r in engines.refusing if r not in engines.errors]
    if unreadable:
        cells += [(f"✖ engine /metrics unreadable: {_which(unreadable)}", Tone.BAD), SEP]
    if refused:
        cells += [(f"⚠ engine /metrics refused values: {_which(refused)}", Tone.WARN), SEP]
    return cells


def _which(replicas: list[str]) -> str:
    return replicas[0] if len(replicas) == 1 else f"{len(replicas)} replicas"


def _modes(modes: Modes) -> list[Cell]:
    cells: list[Cell] = [("READ-ONLY ", Tone.WARN)] if modes.read_only else []
    if modes.paused:
        cells.append(("‖ paused", Tone.WARN))
    else:
        cells.append((f"↻ {modes.refresh_s:g}s", Tone.DIM))
    return cells
