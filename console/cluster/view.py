"""The cluster screen's content as plain text: a line of totals, a row per router, a row per
GPU (or per node that has sent no GPU yet), a row per event of the routers' audit trails,
newest first, written as the events pane writes them. Pure: status in, strings out."""

from __future__ import annotations

from collections.abc import Mapping

from console.view.events import event_line
from console.view.format import NONE, duration, number, pct, rate
from router.telemetry.control_messages import Ack
from router.telemetry.router_watch import RouterFeed, RoutersStatus
from router.telemetry.status import NodeFeed, TelemetryStatus

__all__ = [
    "EVENT_COLUMNS",
    "NODE_COLUMNS",
    "ROUTER_COLUMNS",
    "event_rows",
    "node_rows",
    "router_rows",
    "summary",
]

ROUTER_COLUMNS = (
    "router",
    "strategy",
    "in flight",
    "queue",
    "req/s",
    "imbalance",
    "replicas",
    "seen",
    "commands",
    "last command",
)
NODE_COLUMNS = ("node", "state", "seen", "gpu", "name", "util", "mem", "temp", "power")
EVENT_COLUMNS = ("router", "event")
EVENTS_SHOWN = 20

Row = tuple[str, ...]


def summary(nodes: TelemetryStatus, routers: RoutersStatus) -> str:
    """``broker mqtt://... connected · 2 routers · 3 nodes · dropped: ...`` on one line."""
    parts = [
        f"broker {routers.broker_url} {_worst(nodes, routers)}",
        f"{len(routers.routers)} router(s)",
        f"{len(nodes.nodes)} node(s)",
        f"dropped: telemetry {_drops(nodes.dropped, nodes.drop_reasons)}, "
        f"routers {_drops(routers.dropped, routers.drop_reasons)}",
    ]
    return " · ".join(parts)


def router_rows(status: RoutersStatus) -> list[Row]:
    return [_router(feed) for feed in status.routers]


def node_rows(status: TelemetryStatus) -> list[Row]:
    rows: list[Row] = []
    for feed in status.nodes:
        state, seen = _node_state(feed), duration(feed.age_s)
        names = {g.index: g.name for g in feed.inventory}
        if not feed.gpus:
            rows.append((feed.node, state, seen, *[NONE] * 6))
        for g in feed.gpus:
            mem = None
            if g.fb_used_mib is not None and g.fb_total_mib:
                mem = g.fb_used_mib / g.fb_total_mib
            rows.append(
                (
                    feed.node,
                    state,
                    seen,
                    str(g.index),
                    g.name or names.get(g.index) or NONE,
                    NONE if g.gpu_util_pct is None else pct(g.gpu_util_pct / 100),
                    NONE if mem is None else pct(mem),
                    NONE if g.temp_c is None else f"{g.temp_c}°C",
                    NONE if g.power_w is None else f"{g.power_w:.0f}W",
                )
            )
    return rows


def event_rows(status: RoutersStatus) -> list[Row]:
    """The newest :data:`EVENTS_SHOWN` events first."""
    newest = status.events[::-1][:EVENTS_SHOWN]
    return [(router, "".join(text for text, _ in event_line(e))) for router, e in newest]


def _router(feed: RouterFeed) -> Row:
    seen = duration(feed.age_s) + (" stale" if feed.stale else "")
    commands = f"{feed.applied} applied, {feed.refused} refused"
    last = _ack(feed.acks[-1]) if feed.acks else NONE
    s = feed.stats
    if s is None:
        return (feed.router, *[NONE] * 6, seen, commands, last)
    active = sum(1 for r in s.replicas if r.state == "active")
    return (
        feed.router,
        s.strategy,
        str(s.in_flight),
        f"{s.queue_depth}/{s.queue_capacity}",
        rate(s.throughput_rps),
        number(s.imbalance_factor),
        f"{active}/{len(s.replicas)} active",
        seen,
        commands,
        last,
    )


def _ack(ack: Ack) -> str:
    verdict = "applied" if ack.ok else "refused"
    why = f": {ack.message}" if ack.message and not ack.ok else ""
    return f"{ack.slot} {verdict}{why}"


def _node_state(feed: NodeFeed) -> str:
    if not feed.online:
        return "offline"
    return "stale" if feed.stale or feed.age_s is None else "online"


def _worst(nodes: TelemetryStatus, routers: RoutersStatus) -> str:
    """Both clients' connection in one word: the worse of the two."""
    states = {nodes.broker.value, routers.broker.value}
    for state in ("reconnecting", "connecting"):
        if state in states:
            return state
    return "connected"


def _drops(total: int, reasons: Mapping[str, int]) -> str:
    if not total:
        return str(total)
    named = ", ".join(f"{reason} {n}" for reason, n in reasons.items() if n)
    return f"{total} ({named})"
